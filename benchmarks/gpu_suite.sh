#!/usr/bin/env bash
# One prepared pass of the benchmarks on a GPU machine (used with the project's lent H200),
# sized for a 15-minute device budget: the CNN rows of the learning table and the PPO speed rows.
# Everything it prints is also saved, with the raw JSON results, in $OUT (or ./gpu_out).
#   SOURCE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_suite.sh   # commit of the copied tree
# The lent machine (Python 3.12, its own jax 0.11.2, flax, optax, chex) has no network and lacks
# the other dependencies: `bash benchmarks/gpu_deps.sh` builds them here as one archive; carry
# `.gpu_site` and begin the device command with
#   mkdir -p /tmp/s && tar -xJf .gpu_site/site312.tar.xz -C /tmp/s && export PYTHONPATH=/tmp/s/site312
source "$(dirname "$0")/gpu_steps.sh"
L="python3 benchmarks/learning.py --seeds 8 --total-timesteps 5000000 --out-dir $OUT/results"
step 30 nvidia-smi -L
step 60 python3 -c "import jax, flax, optax, distrax, gymnax; print('jax', jax.__version__, jax.devices())"
# MinAtar learning with the CNN: 8 seeds x 5e6 steps (settings in benchmarks/configs.py).
step 90 $L --algo ppo --env-id Breakout-MinAtar
step 90 $L --algo ppo --env-id SpaceInvaders-MinAtar
step 60 $L --algo a2c --env-id Breakout-MinAtar --set num_envs=64
step 60 $L --algo impala --env-id Breakout-MinAtar
step 70 $L --algo impala --env-id Breakout-MinAtar --tag adam3e-4mb4 --set optimizer=adam learning_rate=3e-4 opt_eps=1e-5 num_minibatches=4 update_epochs=2
# Speed: SPS, compile time and memory as vmapped seeds grow.
step 120 python3 benchmarks/speed.py --algo ppo --env-id CartPole-v1 --seeds 1 8 32 128 --repeats 2 --out-dir "$OUT/results"
log done
