# Sourced by scripts/gpu_check.sh and scripts/gpu_text_check.sh: stages that share one time budget, each under its
# own cap, all writing into one log. Set `out` (the output folder) and `budget` (seconds) before sourcing.
mkdir -p "$out" || { echo "error: cannot create $out" >&2; exit 2; }
log="$out/$(basename "$0" .sh).log"
end=$(( $(date +%s) + budget ))  # every stage ends by then
left() { local s=$(( end - $(date +%s) )); echo $(( s < $1 ? (s > 0 ? s : 1) : $1 )); }  # min(cap, time left)
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
stage() { echo "=== $1 ($(date -u +%T), up to ${2}s)" | tee -a "$log"; }
rc() { echo "rc=$1" | tee -a "$log"; }
{ nvidia-smi -L 2>/dev/null || echo "no nvidia-smi"
  $py -c "import jax; print('jax', jax.__version__, jax.devices())"; } 2>&1 | tee -a "$log"
