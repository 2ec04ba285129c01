#!/usr/bin/env bash
# Second GPU pass: IMPALA learning-rate/optimiser variants and A2C on Breakout-MinAtar, plus
# the 128-seed PPO and the IMPALA speed rows. Results in benchmarks/results/gpu/.
set -u
OUT=${OUT:-gpu_out}; mkdir -p $OUT/results; export PYTHONUNBUFFERED=1
L=benchmarks/learning.py
run() { local lim=$1; shift; echo "=== $*" | tee -a $OUT/log.txt; timeout -k 5 $lim "$@" 2>&1 | grep -v -E "WARNING|warn\(|cuda_timer" | tee -a $OUT/log.txt; }
run 60 python3 $L --algo impala --env-id Breakout-MinAtar --seeds 8 --total-timesteps 5000000 --out-dir $OUT/results --tag adam1e-3 --set optimizer=adam learning_rate=1e-3
run 60 python3 $L --algo impala --env-id Breakout-MinAtar --seeds 8 --total-timesteps 5000000 --out-dir $OUT/results --tag rms1e-3eps1e-5 --set learning_rate=1e-3 rms_eps=1e-5
run 60 python3 $L --algo impala --env-id Breakout-MinAtar --seeds 8 --total-timesteps 5000000 --out-dir $OUT/results --tag adam3e-4mb4 --set optimizer=adam learning_rate=3e-4 num_minibatches=4 update_epochs=2
run 60 python3 $L --algo a2c --env-id Breakout-MinAtar --seeds 8 --total-timesteps 5000000 --out-dir $OUT/results --set num_envs=64
run 100 python3 benchmarks/speed.py --algo ppo --env-id CartPole-v1 --seeds 128 --repeats 2
run 60 python3 benchmarks/speed.py --algo impala --env-id CartPole-v1 --seeds 1 32 --repeats 2
cp benchmarks/results/speed__*.json $OUT/results/ 2>/dev/null
echo done
