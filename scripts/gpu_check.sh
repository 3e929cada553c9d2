#!/usr/bin/env bash
# Everything a GPU lease is for, in one prepared run that ends within ~9.5 minutes (leases are short):
#   1. the Sudoku headline attempt: a 12-layer Sudoku model (INIT) continued for TRAIN_MINUTES at batch 256
#      (scripts/train_for_time.py), its final weights and moving average packed as .tgz in OUT_DIR;
#   2. that model on the 1,000 held-out puzzles at max 48 steps (scripts/eval_sudoku.py, on the GPU);
#   3. the Pallas kernels compiled with Triton: max |Δ| against the XLA paths and timings at DiffusionGemma
#      shapes (scripts/bench_kernels.py);
#   4. tests/kernels on the GPU, in whatever time is left.
# Each stage has its own time limit and a failing stage does not stop the next; gpu_check.log has everything.
#
#   bash scripts/gpu_check.sh OUT_DIR [TRAIN_MINUTES=5] [INIT=assets/sudoku-small-12layers-h200]
# Needs data/sudoku_eval_1000.npz (docs/sudoku.md, Commands) and the packages of pyproject.toml.
set -u
out=${1:?usage: bash scripts/gpu_check.sh OUT_DIR [TRAIN_MINUTES] [INIT]}
train_minutes=${2:-5}
init=${3:-assets/sudoku-small-12layers-h200}
mkdir -p "$out"
log="$out/gpu_check.log"
end=$(( $(date +%s) + 570 ))  # every stage ends by then
left() { local s=$(( end - $(date +%s) )); echo $(( s < $1 ? (s > 0 ? s : 1) : $1 )); }  # min(cap, time left)
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
quiet() { grep -v -E '^[IW][0-9]{4} ' || true; }  # drop absl INFO/WARNING lines (orbax), keep ours
run=/tmp/gpu_check_sudoku

stage() { echo "=== $1 ($(date -u +%T), ${2}s allowed)" | tee -a "$log"; }
{ nvidia-smi -L; $py -c "import jax; print('jax', jax.__version__, jax.devices())"; } 2>&1 | tee -a "$log"

stage "1. Sudoku: $init continued for $train_minutes min at batch 256" "$(left 600)"
rm -rf "$run"
timeout "$(left $(( train_minutes * 60 + 60 )))" $py scripts/train_for_time.py --minutes="$train_minutes" \
  --probe_steps=200 --config=configs/sft_sudoku.py --workdir="$run" \
  --config.init_from="$init" --config.model.num_layers=12 \
  --config.seed=15 --config.batch_size=256 --config.optimizer.learning_rate=3e-4 \
  --config.optimizer.end_learning_rate=1e-5 --config.optimizer.warmup_steps=200 \
  --config.optimizer.ema_decays='(0.999,)' --config.diffusion.t_tilt_steps=0 --config.eval.every=0 \
  --config.log_every=100 --config.checkpoint_every=5000 2>&1 | quiet | tee -a "$log"
echo "rc=${PIPESTATUS[0]}" | tee -a "$log"
[ -d "$run/model" ] && tar czf "$out/sudoku_model.tgz" -C "$run" model run.json tb
[ -d "$run/model_ema0.999" ] && tar czf "$out/sudoku_model_ema.tgz" -C "$run" model_ema0.999

stage "2. The continued model on 1,000 held-out puzzles, max 48 steps" "$(left 100)"
[ -d "$run/model" ] && timeout "$(left 100)" $py scripts/eval_sudoku.py --ckpt="$run/model" \
  --data=data/sudoku_eval_1000.npz --batch_size=1000 --json_out="$out/eval_max48.json" 2>&1 | quiet | tee -a "$log"

stage "3. Pallas kernels vs XLA at DiffusionGemma shapes" "$(left 150)"
timeout "$(left 150)" $py scripts/bench_kernels.py --out="$out/bench_kernels.md" 2>&1 | quiet | tee -a "$log"
echo "rc=${PIPESTATUS[0]}" | tee -a "$log"

stage "4. tests/kernels on the GPU (Pallas interpret mode, and the model with the compiled kernels)" "$(left 600)"
timeout "$(left 600)" $py -m pytest -q -x tests/kernels 2>&1 | tail -15 | tee -a "$log"
echo "done $(date -u +%T)" | tee -a "$log"
