# Sourced by the GPU passes (gpu_suite.sh, gpu_sweep.sh, gpu_speed.sh): `step SECONDS command...`
# runs one step under its own time limit (so one slow step cannot eat the others' time) and
# keeps what it prints, without the GPU's warnings, in $OUT/$LOG (default gpu_out/log.txt).
set -u
OUT=${OUT:-gpu_out}
LOG=${LOG:-log.txt}
mkdir -p "$OUT/results"
export PYTHONUNBUFFERED=1
log() { echo "=== $*" | tee -a "$OUT/$LOG"; }
step() {  # step SECONDS command...
  local limit=$1; shift
  log "$*"
  timeout -k 5 "$limit" "$@" 2>&1 | grep -v -E "WARNING|warn\(|cuda_timer" | tee -a "$OUT/$LOG"
}
