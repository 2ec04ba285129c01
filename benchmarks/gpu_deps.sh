#!/usr/bin/env bash
# The dependencies a lent GPU machine lacks, built here as one archive to carry there:
# .gpu_site/site312.tar.xz (ignored by git), about 10 MB.
#
# That machine runs Python 3.12 with its own jax, jaxlib, flax, optax, chex, numpy, scipy,
# msgpack, absl-py, etils, jinja2, werkzeug and protobuf, and has no network. This downloads
# the rest for its Python (wheels only, no dependency resolution: the list below is complete,
# at the versions tested here; MuJoCo's OpenGL viewer packages, glfw and PyOpenGL, are left
# out), installs them into one folder, drops what a run never loads (MJX's test models,
# MuJoCo's docs, TensorFlow Probability's NumPy backend) and packs it, so that it fits beside
# the working tree in the device tool's 64 MiB.
#
#   bash benchmarks/gpu_deps.sh
#   # then, in the device command, with .gpu_site carried:
#   mkdir -p /tmp/s && tar -xJf .gpu_site/site312.tar.xz -C /tmp/s && export PYTHONPATH=/tmp/s/site312
#
# Checked: Python 3.12 with jax 0.11.2 and flax 0.12.10 (the lent machine's) and only this
# folder added runs `python benchmarks/gpu_brax.py --dry-run` to a return near 1,000.
set -euo pipefail
cd "$(dirname "$0")/.."
TARGET=(--no-deps --only-binary=:all: --python-version 3.12 --implementation cp
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64
        --platform manylinux_2_24_x86_64 --platform manylinux_2_17_x86_64
        --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64
        --platform manylinux1_x86_64)
PACKAGES=(
  # this project's own dependencies (pyproject.toml) and theirs
  distrax==0.1.9 gymnax==1.0.1 tyro==1.0.17 tensorboardX==2.6.5 crc32c==2.9.post0
  tfp-nightly==0.26.0.dev20261027 dm-tree==0.1.10 gast==0.7.0 decorator==5.2.1
  gymnasium==1.3.0 farama-notifications==0.0.6 docstring-parser==0.18.0 typeguard==4.6.1
  # the `brax` extra and its dependencies
  brax==0.14.2 mujoco==4.0.0 mujoco-core==4.0.0 mujoco-mjx==3.17.0 jaxopt==0.8.5
  ml-collections==1.1.0 trimesh==5.2.0 flask==3.1.3 flask-cors==6.0.2 itsdangerous==2.2.0
  blinker==1.9.0
)
rm -rf .whl .gpu_site/site312
python3 -m pip download -q "${TARGET[@]}" -d .whl "${PACKAGES[@]}"
python3 -m pip install -q --no-compile "${TARGET[@]}" --target .gpu_site/site312 .whl/*.whl
rm -rf .gpu_site/site312/mujoco/mjx/test_data .gpu_site/site312/mujoco/doc \
       .gpu_site/site312/tensorflow_probability/substrates/numpy \
       .gpu_site/site312/*.dist-info/licenses
tar -cJf .gpu_site/site312.tar.xz -C .gpu_site site312
rm -rf .gpu_site/site312
ls -l .gpu_site/site312.tar.xz
