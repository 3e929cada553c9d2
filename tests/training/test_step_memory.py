"""scripts/step_memory.py on a tiny model with a large vocabulary: the whole-logits step plans at least one
[B, C, V] float32 array of temporaries; --run runs a step; bad flags are one line. (At this size the chunked step
does not plan less: the scan's own buffers outweigh 0.5 MB of logits; the saving is measured at 270M, docs/text.md.)"""

import json

from tests.script_loader import load_script

TINY = ["--model=tiny_moe", "--vocab_size=8192", "--batch=2", "--prompt_len=8", "--canvas_len=8"]


def test_chunked_step_plans_less_memory_than_the_whole_logits(tmp_path):
  out = tmp_path / "mem.json"
  script = load_script("scripts/step_memory.py")
  assert script.main(["step_memory.py", *TINY, "--chunks=0,4", "--accum=1", f"--json_out={out}"]) == 0
  record = json.loads(out.read_text())
  whole, chunked = record["results"]
  assert (whole["loss_chunk_tokens"], chunked["loss_chunk_tokens"]) == (0, 4)
  logits = 2 * 8 * 8192 * 4
  assert whole["denoiser_logits_f32_bytes"] == logits
  assert whole["temp_bytes"] >= logits  # the denoiser's logits are live at once
  for r in (whole, chunked):
    assert r["planned_peak_bytes"] == r["argument_bytes"] + r["output_bytes"] + r["temp_bytes"] - r["alias_bytes"]


def test_run_and_bad_flags(tmp_path, capsys):
  script = load_script("scripts/step_memory.py")
  out = tmp_path / "run.json"
  assert script.main(["step_memory.py", *TINY, "--chunks=4", "--accum=2", "--run", f"--json_out={out}"]) == 0
  (result,) = json.loads(out.read_text())["results"]
  assert result["max_rss_bytes"] > 0 and result["loss"] > 0
  capsys.readouterr()
  assert script.main(["step_memory.py", *TINY, "--chunks=0,4", "--run"]) == 1
  assert script.main(["step_memory.py", *TINY, "--accum=3"]) == 1
  err = capsys.readouterr().err.splitlines()
  assert err == ["step_memory.py: error: --run measures one step's maximum RSS: name one --chunks value and one "
                 "--accum value", "step_memory.py: error: --chunks must be >= 0 and --accum divisors of --batch=2"]
