#!/usr/bin/env bash
# The text issue's GPU rows (issue 52) in one prepared run that ends within BUDGET seconds (default 420: with the
# machine's start-up and the transfer, about 9 minutes of a 15-minute window). Each stage has its own `timeout`,
# writes its results into OUT_DIR as soon as it has them, and a failing stage does not stop the next:
#   1. completions at batch 1 (scripts/bench_text_decoding.py): the text model with exact ancestral sampling at 8
#      steps per canvas against its AR twin, greedy to its stop and at the diffusion completion's length, the first
#      20 test prompts: text_ancestral8.json;
#   2. the same at 4 steps, then with the sampler the checkpoint records (the released one: at most 48 steps, adaptive
#      stop), all test prompts, without the exact-length AR timing (a compile per length): text_ancestral4.json,
#      text_recorded.json;
#   3. the latency benchmark at Gemma 3 270M's shapes (random weights, bf16; scripts/bench_latency.py), batch 1, a
#      256-token prompt and one 128-token canvas at 4, 8, 16 and 48 steps: latency_gemma3_270m_b1.json;
#   4. tests/sampling/test_ancestral.py on the GPU: junit XML.
# gpu_text_check.log has every stage's output.
#
#   bash scripts/gpu_text_check.sh OUT_DIR IN_DIR     # IN_DIR: diffusion/ and ar/ (exported models), test.jsonl
#   bash scripts/gpu_text_check.sh OUT_DIR --dry-run  # tiny models trained on the spot, 2 prompts: a smoke test
# The environment variables BUDGET and PYTHON override the time budget and the interpreter.
#
# Preparing a lease (docs/text_results.md, "On a GPU"): the models of its rows and the test split go into a folder
# git ignores, with the wheels the device's image lacks (python 3.12 there):
#   mkdir -p gpu_in && cp -r WORKDIR/model gpu_in/diffusion && cp -r TWIN_WORKDIR/model gpu_in/ar \
#     && cp data/stdlib_code/test.jsonl gpu_in/
#   python3 -m pip download --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
#     --platform manylinux_2_28_x86_64 --platform manylinux_2_17_x86_64 -d .whl grain==0.2.18 array_record==0.8.6 \
#     ml_collections==1.1.0 tensorboardX==2.6.5 portpicker==1.6.0
# then the device run carries gpu_in and .whl, and its command is
#   python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site \
#     && bash scripts/gpu_text_check.sh $OUT gpu_in
# Not here: Gemma 3 270M diffusionized and trained on the GPU. Its GGUF (253 MB) is more than a device call carries
# (64 MiB, the working tree included): docs/text_results.md, "On a GPU", says what is left to try.
set -u
usage="usage: bash scripts/gpu_text_check.sh OUT_DIR (IN_DIR | --dry-run)"
if [ $# -ne 2 ]; then echo "error: $usage" >&2; exit 2; fi
out=$1
in=$2
dry=0
if [ "$in" = "--dry-run" ]; then
  dry=1
  in="$out/dry_in"
else
  for need in diffusion/dgemma.json ar/dgemma.json test.jsonl; do
    [ -e "$in/$need" ] || { echo "error: $in/$need does not exist (IN_DIR holds diffusion/, ar/, test.jsonl)" >&2
                            exit 2; }
  done
fi
budget=${BUDGET:-420}
source "$(dirname "$0")/gpu_stages.sh"

bench=(scripts/bench_text_decoding.py --diffusion="$in/diffusion" --ar="$in/ar" --data="$in/test.jsonl" --show=3
       --python_syntax)
ancestral=(--update=ancestral --adaptive_stopping=false --schedule=constant --t_max=1)
few=20
all=1000  # every prompt of the test split (86)
latency_args=(--preset=gemma3_270m --batch=1 --prompt_lens=256 --new_tokens=128 --canvas=128 --steps=4,8,16,48
              --repeats=5 --ar_check_tokens=32)
if [ "$dry" = 1 ]; then
  few=2
  all=2
  latency_args=(--tiny)
  stage "0. tiny models for the dry run" "$(left 120)"
  mkdir -p "$in"
  $py - "$in/test.jsonl" <<'PY' 2>&1 | tee -a "$log"
import json, sys
rows = [{"prompt": f"def f{i}(x):\n    \"\"\"Add {i}.\"\"\"\n", "response": f"return x + {i}\n"} for i in range(6)]
open(sys.argv[1], "w").write("".join(json.dumps(r) + "\n" for r in rows))
PY
  for objective in diffusion ar; do
    timeout "$(left 120)" $py train.py --config="configs/text.py:data=$in/test.jsonl,size=debug,objective=$objective" \
      --config.num_train_steps=3 --workdir="$in/wd_$objective" > "$in/train_$objective.log" 2>&1
    status=$?
    rc $status
    [ $status = 0 ] && rm -rf "$in/$objective" && cp -r "$in/wd_$objective/model" "$in/$objective"
  done
fi

stage "1. completions at batch 1: ancestral, 8 steps, against the AR twin at the same length" "$(left 150)"
timeout "$(left 150)" $py "${bench[@]}" "${ancestral[@]}" --steps=8 --num=$few \
  --json_out="$out/text_ancestral8.json" 2>&1 | tee -a "$log"
rc "${PIPESTATUS[0]}"

stage "2a. completions at batch 1: ancestral, 4 steps" "$(left 90)"
timeout "$(left 90)" $py "${bench[@]}" "${ancestral[@]}" --steps=4 --num=$all --nosame_length \
  --json_out="$out/text_ancestral4.json" 2>&1 | tee -a "$log"
rc "${PIPESTATUS[0]}"

stage "2b. completions at batch 1: the recorded sampler" "$(left 90)"
timeout "$(left 90)" $py "${bench[@]}" --num=$all --nosame_length --json_out="$out/text_recorded.json" 2>&1 \
  | tee -a "$log"
rc "${PIPESTATUS[0]}"

stage "3. latency at Gemma 3 270M's shapes, batch 1" "$(left 90)"
timeout "$(left 90)" $py scripts/bench_latency.py "${latency_args[@]}" --json_out="$out/latency_gemma3_270m_b1.json" \
  2>&1 | tee -a "$log"
rc "${PIPESTATUS[0]}"

stage "4. tests/sampling/test_ancestral.py on this device" "$(left 60)"
timeout "$(left 60)" $py -m pytest -q tests/sampling/test_ancestral.py --junitxml="$out/tests_ancestral.xml" 2>&1 \
  | tail -5 | tee -a "$log"
rc "${PIPESTATUS[0]}"
echo "done $(date -u +%T)" | tee -a "$log"
