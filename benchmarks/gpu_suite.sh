#!/usr/bin/env bash
# One prepared pass of the benchmarks on a GPU machine (used with the project's lent H200).
# Everything it prints is also saved, with the raw JSON results, in $OUT (or ./gpu_out).
#   bash benchmarks/gpu_suite.sh
# Each step has its own time limit so one slow step cannot eat the others' time.
set -u
OUT=${OUT:-gpu_out}
mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1
log() { echo "=== $*" | tee -a "$OUT/log.txt"; }
step() {  # step SECONDS command...
  local limit=$1; shift
  log "$*"
  timeout -k 5 "$limit" "$@" 2>&1 | grep -v -E "WARNING|warn\(" | tee -a "$OUT/log.txt"
}
step 30 nvidia-smi -L
step 60 python3 -c "import jax, flax, optax, distrax, gymnax; print('jax', jax.__version__, jax.devices())"
# MinAtar learning with the CNN: 8 seeds x 5e6 steps (settings in benchmarks/configs.py).
step 150 python3 benchmarks/learning.py --algo ppo --env-id Breakout-MinAtar --seeds 8 --total-timesteps 5000000 --out-dir "$OUT/results"
step 120 python3 benchmarks/learning.py --algo impala --env-id Breakout-MinAtar --seeds 8 --total-timesteps 5000000 --out-dir "$OUT/results"
step 150 python3 benchmarks/learning.py --algo ppo --env-id SpaceInvaders-MinAtar --seeds 8 --total-timesteps 5000000 --out-dir "$OUT/results"
# Speed: SPS and compile time as vmapped seeds grow.
step 90 python3 benchmarks/speed.py --algo ppo --env-id CartPole-v1 --seeds 1 8 32 128 --repeats 2
cp benchmarks/results/speed__*.json "$OUT/results/" 2>/dev/null
tar -czf "$OUT/results.tgz" -C "$OUT" results && rm -rf "$OUT/results"
log done
