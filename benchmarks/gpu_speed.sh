#!/usr/bin/env bash
# The speed comparisons on a GPU machine (used with the project's lent H200), in two parts to
# run as two calls: `vs`, our PPO against PureJaxRL on the same configs (its steps' limits add
# up to nearly 10 minutes), and `cli`, the command line against the program it compiles (5 minutes).
# Everything it prints is also saved, with the raw JSON results, in $OUT (or ./gpu_out).
#
#   PUREJAXRL=/path/to/purejaxrl/purejaxrl SOURCE_COMMIT=$(git rev-parse --short HEAD) \
#       bash benchmarks/gpu_speed.sh
#   ... bash benchmarks/gpu_speed.sh vs    # one part only: vs (PureJaxRL) or cli (the command line)
#   DRY=1 ...   # the same steps with tiny budgets, to check the script on any machine
#
# PureJaxRL is not part of this repository: clone it anywhere (for the lent machine, which has
# no network, pack its `purejaxrl/` folder into an ignored path that travels with the working
# tree). The lent machine's missing packages: `bash benchmarks/gpu_deps.sh`, then begin the
# device command with
#   mkdir -p /tmp/s && tar -xJf .gpu_site/site312.tar.xz -C /tmp/s && export PYTHONPATH=$PWD:/tmp/s/site312
# ($PWD, the checkout, so that the command lines the benchmarks start import `common`).
source "$(dirname "$0")/gpu_steps.sh"
if [ "${DRY:-0}" = 1 ]; then  # tiny budgets: every step runs, nothing it prints is a figure
  T1=20000 T128=4096 TB=20480 TR=20000 SEEDS=4 R=1 TC=20000
else
  T1=500000 T128=500000 TB=2000000 TR=100000 SEEDS=128 R=3 TC=500000
fi
V="python3 benchmarks/vs_purejaxrl.py --reference ${PUREJAXRL:-}"
PARTS=${*:-vs cli}
step 30 nvidia-smi -L
step 60 python3 -c "import jax, flax, optax, distrax, gymnax; print('jax', jax.__version__, jax.devices())"
if [[ " $PARTS " == *" vs "* ]]; then
  : "${PUREJAXRL:?set PUREJAXRL to the folder holding PureJaxRL ppo.py}"
  # PPO against PureJaxRL: CartPole with one seed and with many, Brax Hopper, recurrent PPO.
  step 90 $V --total-timesteps $T1 --repeats $R --out "$OUT/results/vs_purejaxrl.json"
  step 100 $V --seeds $SEEDS --total-timesteps $T128 --repeats $R --out "$OUT/results/vs_purejaxrl__seeds$SEEDS.json"
  step 240 $V --brax hopper --seeds 4 --total-timesteps $TB --repeats $R --out "$OUT/results/vs_purejaxrl_brax-hopper.json"
  step 150 $V --recurrent --total-timesteps $TR --repeats $R --out "$OUT/results/vs_purejaxrl_rnn.json"
fi
if [[ " $PARTS " == *" cli "* ]]; then
  # The command line against jit(vmap(train)) on the same device (a checkpoint after every
  # chunk, TensorBoard on), then the default command's start to exit, cold and warm.
  step 240 python3 benchmarks/cli_overhead.py --seeds 1 32 --repeats 1 --no-start --total-timesteps $TC --out "$OUT/results/cli_overhead.json"
  step 90 python3 benchmarks/cli_overhead.py --start-only --repeats 1 --out "$OUT/results/cli_overhead_start.json"
fi
log done
