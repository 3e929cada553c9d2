#!/usr/bin/env bash
# Everything a GPU lease is for (issue 53), in one prepared run that ends within BUDGET seconds (default 360: with
# the machine's start-up it fits 8 minutes of a 15-minute window). Each stage has its own `timeout`, writes its
# results into OUT_DIR as soon as it has them, and a failing stage does not stop the next:
#   1. tests/kernels on the GPU (the TF32 fix verified): junit XML + log;
#   2. the latency benchmark at DiffusionGemma 26B-A4B shapes, batch 1, P = 256 and 2048 (scripts/bench_latency.py):
#      latency_b1.json, rewritten after every prompt length, so a timeout keeps what was measured;
#   3. the kernel table, Pallas against XLA at DiffusionGemma shapes (scripts/bench_kernels.py): bench_kernels.md;
#   4. training-step MFU of a dense model, width 2048, 16 layers, sequence 512, bf16 (scripts/bench_mfu.py): mfu.json;
#   5. the latency benchmark at batch 8, in whatever time is left: latency_b8.json.
# gpu_check.log has every stage's output.
#
#   bash scripts/gpu_check.sh OUT_DIR [--dry-run]
# --dry-run: the same stages at tiny shapes on any machine (CPU: Pallas in interpret mode), a smoke test of this
# script; the environment variables BUDGET and PYTHON override the time budget and the interpreter.
set -u
out=${1:?usage: bash scripts/gpu_check.sh OUT_DIR [--dry-run]}
dry=0
if [ $# -ge 2 ]; then
  if [ "$2" = "--dry-run" ]; then dry=1; else echo "error: unknown argument $2 (expected --dry-run)" >&2; exit 2; fi
fi
budget=${BUDGET:-360}
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.95}  # 26B-A4B: 52 GB of bf16 weights
source "$(dirname "$0")/gpu_stages.sh"

# The 26B-A4B latency run: Pallas grouped matmuls for the MoE (lax.ragged_dot lowers to a product over every
# expert); XLA attention (the Pallas attention's per-kind choice is for the kernel table to settle).
latency_args=(--preset=diffusiongemma_26b_a4b --moe_impl=pallas --attention_impl=xla --prompt_lens=256,2048
              --new_tokens=256,1024 --steps=8,12,16,24,48 --repeats=5 --loop=4 --ar_loop=16 --ar_check_tokens=64)
tests=(tests/kernels)
kernels_args=(--warmup=2 --iters=10)
mfu_args=()
if [ "$dry" = 1 ]; then
  latency_args=(--tiny)
  tests=(tests/kernels/test_attention_per_kind.py)
  kernels_args=(--tiny)
  mfu_args=(--tiny)
fi

stage "1. ${tests[*]} on this device" "$(left 90)"
timeout "$(left 90)" $py -m pytest -q -x "${tests[@]}" --junitxml="$out/tests_kernels.xml" 2>&1 | tail -15 \
  | tee -a "$log"
rc "${PIPESTATUS[0]}"

stage "2. latency, batch 1" "$(left 170)"
timeout "$(left 170)" $py scripts/bench_latency.py "${latency_args[@]}" --batch=1 --json_out="$out/latency_b1.json" \
  2>&1 | tee -a "$log"
rc "${PIPESTATUS[0]}"

stage "3. kernel table" "$(left 50)"
timeout "$(left 50)" $py scripts/bench_kernels.py "${kernels_args[@]}" --out="$out/bench_kernels.md" 2>&1 \
  | tee -a "$log"
rc "${PIPESTATUS[0]}"

stage "4. training-step MFU, dense width 2048 x 16 layers, sequence 512, bf16" "$(left 50)"
timeout "$(left 50)" $py scripts/bench_mfu.py "${mfu_args[@]}" --json_out="$out/mfu.json" 2>&1 | tee -a "$log"
rc "${PIPESTATUS[0]}"

stage "5. latency, batch 8 (the time left)" "$(left 600)"
timeout "$(left 600)" $py scripts/bench_latency.py "${latency_args[@]}" --batch=8 --ar_check_tokens=0 \
  --json_out="$out/latency_b8.json" 2>&1 | tee -a "$log"
rc "${PIPESTATUS[0]}"
echo "done $(date -u +%T)" | tee -a "$log"
