"""scripts/eval_text.py end to end: a 3-step text model (diffusion and objective=ar) scored on held-out JSONL."""

import json
import math
import re

import pytest

import train
from configs import text as text_config
from tests.script_loader import load_script

ROWS = [{"prompt": f"Say {w}.", "response": f"{w} {w}, and again {w}. " * 2} for w in ("hi", "yes", "no", "red")]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
  root = tmp_path_factory.mktemp("eval_text")
  data = root / "held_out.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  for objective in ("diffusion", "ar"):
    c = text_config.get_config(f"data={data},size=debug,objective={objective}")
    c.num_train_steps = 3
    train.train(c, str(root / objective))
  return root, data


def test_a_diffusion_checkpoint_gets_the_elbo(runs, capsys):
  root, data = runs
  out_path = root / "elbo.json"
  args = ["eval_text.py", f"--ckpt={root / 'diffusion' / 'model'}", f"--data={data}", "--num_t=4",
          "--batch_size=3", f"--json_out={out_path}"]
  assert load_script("scripts/eval_text.py").main(args) == 0
  out = json.loads(out_path.read_text())
  assert out["mode"] == "diffusion" and out["num_t"] == 4 and out["num_examples"] == len(ROWS)
  assert out["t"] == pytest.approx([0.125, 0.375, 0.625, 0.875])
  assert math.isfinite(out["bits_per_token"]) and out["bits_per_token"] > 0
  assert math.isfinite(out["stderr_bits_per_token"]) and out["stderr_bits_per_token"] > 0
  assert len(out["elbo_integrand_bits_by_t"]) == len(out["cross_entropy_bits_by_t"]) == 4
  assert all(v > 0 and math.isfinite(v) for v in out["elbo_integrand_bits_by_t"] + out["cross_entropy_bits_by_t"])
  # the midpoint rule: the bound is the mean of the per-level integrands
  assert out["bits_per_token"] == pytest.approx(sum(out["elbo_integrand_bits_by_t"]) / 4)
  assert "ELBO:" in capsys.readouterr().out
  # The same key: the same number, whatever the batch size.
  again = root / "again.json"
  assert load_script("scripts/eval_text.py").main(args[:-2] + ["--batch_size=2", f"--json_out={again}"]) == 0
  assert json.loads(again.read_text())["bits_per_token"] == pytest.approx(out["bits_per_token"], rel=1e-6)


def test_an_ar_checkpoint_gets_its_exact_nll(runs):
  root, data = runs
  out_path = root / "ar.json"
  assert load_script("scripts/eval_text.py").main(["eval_text.py", f"--ckpt={root / 'ar' / 'model'}", f"--data={data}",
                                           f"--json_out={out_path}", "--limit=3"]) == 0
  out = json.loads(out_path.read_text())
  assert out["mode"] == "ar" and out["num_examples"] == 3
  # an untrained-ish byte model: positive, finite, and under 8 bits (a uniform guess over 256 bytes) is not asked
  assert math.isfinite(out["nll_bits_per_token"]) and out["nll_bits_per_token"] > 0


def test_bad_input_is_one_line(runs, tmp_path, capsys):
  root, data = runs
  script = load_script("scripts/eval_text.py")
  assert script.main(["eval_text.py", f"--ckpt={root / 'ar' / 'model'}", f"--data={tmp_path / 'nope.jsonl'}"]) == 1
  assert capsys.readouterr().err.strip() == f"error: --data={tmp_path / 'nope.jsonl'} does not exist"
  assert script.main(["eval_text.py", f"--ckpt={root / 'ar' / 'model'}", f"--data={data}", "--num_t=0"]) == 1
  assert capsys.readouterr().err.strip() == "error: --num_t must be >= 1, got 0"
  bad = tmp_path / "bad.jsonl"
  bad.write_text('{"prompt": "p", "answer": "a"}\n')
  assert script.main(["eval_text.py", f"--ckpt={root / 'ar' / 'model'}", f"--data={bad}"]) == 1
  err = capsys.readouterr().err.strip().splitlines()
  assert err[-1].startswith(f"error: {bad}:1: no string field 'response'")


@pytest.mark.parametrize("objective,what", [("diffusion", "ELBO"), ("ar", "AR NLL")])
def test_training_evaluates_the_held_out_likelihood(runs, tmp_path, capsys, objective, what):
  root, data = runs
  c = text_config.get_config(f"data={data},size=debug,objective={objective}")
  c.num_train_steps = 2
  c.eval.update(dict(every=1, data=str(data), num_t=2, limit=3))
  train.train(c, str(tmp_path / objective))
  lines = [ln for ln in capsys.readouterr().out.splitlines() if ln.startswith("eval at step")]
  assert len(lines) == 2
  number = float(re.search(f"held-out {what} ([0-9.]+) ", lines[-1]).group(1))
  assert math.isfinite(number) and number > 0


def test_eval_every_without_data_is_refused(runs, tmp_path):
  root, data = runs
  c = text_config.get_config(f"data={data},size=debug")
  c.eval.every = 1
  with pytest.raises(ValueError, match="eval.every > 0 needs eval.data"):
    train.train(c, str(tmp_path / "run"))


def test_decoding_benchmark_runs_both_decoders_at_batch_1(runs, capsys):
  root, data = runs
  out_path = root / "decoding.json"
  args = ["bench_text_decoding.py", f"--diffusion={root / 'diffusion' / 'model'}", f"--ar={root / 'ar' / 'model'}",
          f"--data={data}", "--num=2", "--show=1", f"--json_out={out_path}"]
  assert load_script("scripts/bench_text_decoding.py").main(args) == 0
  out = json.loads(out_path.read_text())
  summary, rows = out["summary"], out["per_prompt"]
  assert summary["prompts"] == len(rows) == 2
  for r in rows:
    assert r["steps_per_canvas"] and all(1 <= s <= summary["max_denoising_steps"] for s in r["steps_per_canvas"])
    assert 0 < r["diffusion_tokens"] <= summary["max_new_tokens"] and 0 < r["ar_tokens"] <= summary["max_new_tokens"]
  assert "=== completion 1, diffusion" in capsys.readouterr().out
  assert load_script("scripts/bench_text_decoding.py").main(args[:2] + args[3:]) == 1  # no --ar: one error line
  assert capsys.readouterr().err.strip() == "error: --ar is required"
