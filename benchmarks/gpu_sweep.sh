#!/usr/bin/env bash
# Second GPU pass, after gpu_suite.sh: the other two IMPALA optimiser variants on
# Breakout-MinAtar and the IMPALA speed rows. Results in benchmarks/results/gpu/.
#   SOURCE_COMMIT=$(git rev-parse --short HEAD) bash benchmarks/gpu_sweep.sh
LOG=log2.txt
source "$(dirname "$0")/gpu_steps.sh"
L="python3 benchmarks/learning.py --seeds 8 --total-timesteps 5000000 --out-dir $OUT/results --algo impala --env-id Breakout-MinAtar"
step 60 $L --tag adam1e-3 --set optimizer=adam learning_rate=1e-3 opt_eps=1e-5
step 60 $L --tag rms1e-3eps1e-5 --set learning_rate=1e-3 opt_eps=1e-5
step 80 python3 benchmarks/speed.py --algo impala --env-id CartPole-v1 --seeds 1 32 --repeats 2 --out-dir "$OUT/results"
echo done
