"""scripts/eval_text.py end to end: a 3-step text model (diffusion and objective=ar) scored on held-out JSONL."""

import json
import math
import re

import jax

import pytest

import numpy as np

import train
from configs import text as text_config
from dgemma import tasks
from dgemma.loading import load_model
from dgemma.sampling import ARConfig, generate_autoregressive
from dgemma.tasks.text import likelihood, samples
from dgemma.training import metrics
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
  # per byte: the same bits over the bytes the scored tokens spell (byte vocabulary: one per ASCII character,
  # each response cut at the canvases' capacity)
  capacity = 2 * 16  # configs/text.py size=debug: 2 canvases of 16
  assert out["num_text_bytes"] == sum(min(len(r["response"].strip()), capacity) for r in ROWS)
  assert out["bits_per_byte"] * out["num_text_bytes"] == pytest.approx(out["bits_per_token"] * out["num_tokens"])
  # The same key: the same number, whatever the batch size.
  again = root / "again.json"
  assert load_script("scripts/eval_text.py").main(args[:-2] + ["--batch_size=2", f"--json_out={again}"]) == 0
  assert json.loads(again.read_text())["bits_per_token"] == pytest.approx(out["bits_per_token"], rel=1e-6)


def test_reading_the_denoiser_as_the_full_posterior_changes_the_bound_only(runs):
  """--denoiser_output=full converts each token's logits by Bayes before the bound (tests/diffusion/test_elbo.py
  checks the conversion against enumeration); the noise, and so training's cross-entropy per level, are the same."""
  root, data = runs
  outs = {}
  for reading in ("context", "full", "auto"):
    path = root / f"reading_{reading}.json"
    assert load_script("scripts/eval_text.py").main(
        ["eval_text.py", f"--ckpt={root / 'diffusion' / 'model'}", f"--data={data}", "--num_t=4",
         f"--denoiser_output={reading}", f"--json_out={path}"]) == 0
    outs[reading] = json.loads(path.read_text())
  assert [outs[r]["denoiser_output"] for r in ("context", "full", "auto")] == ["context", "full", "full"]
  assert outs["auto"]["bits_per_token"] == outs["full"]["bits_per_token"]  # auto: a flat-CE run reads as full
  assert outs["full"]["cross_entropy_bits_by_t"] == pytest.approx(outs["context"]["cross_entropy_bits_by_t"], rel=1e-6)
  assert all(math.isfinite(v) and v > 0 for v in outs["full"]["elbo_integrand_bits_by_t"])
  assert abs(outs["full"]["bits_per_token"] - outs["context"]["bits_per_token"]) > 1e-3


def test_self_conditioned_passes_read_the_signal_through_its_branch_only(runs, tmp_path):
  """--self_cond_passes=1 scores a second pass fed the first's logits (still a function of the noisy canvas and
  the context, so the bound stays a bound: tests/diffusion/test_elbo.py bounds the likelihood for any logits). The
  signal enters only through the self-conditioning branch: with that branch's weights at zero the numbers are
  those of one pass; with them large (a 3-step model barely uses its signal) they are not."""
  from dgemma.checkpoints.native import save_model
  root, data = runs
  config, params, metadata = load_model(str(root / "diffusion" / "model"))
  silent = dict(params, self_conditioning=jax.tree.map(np.zeros_like, params["self_conditioning"]))
  save_model(str(tmp_path / "silent"), config, silent, metadata)
  loud = dict(params, self_conditioning=jax.tree.map(lambda w: 30 * w, params["self_conditioning"]))
  save_model(str(tmp_path / "loud"), config, loud, metadata)
  outs = {}
  for name in ("silent", "loud"):
    for passes in (0, 1):
      path = tmp_path / f"{name}_{passes}.json"
      assert load_script("scripts/eval_text.py").main(
          ["eval_text.py", f"--ckpt={tmp_path / name}", f"--data={data}", "--num_t=4", f"--self_cond_passes={passes}",
           f"--json_out={path}"]) == 0
      outs[name, passes] = json.loads(path.read_text())
  assert outs["loud", 1]["self_cond_passes"] == 1
  silent_0, silent_1 = (outs["silent", k]["elbo_integrand_bits_by_t"] for k in (0, 1))
  assert silent_1 == pytest.approx(silent_0, rel=1e-6)  # (two compiled programs: rounding apart, not more)
  assert abs(outs["loud", 1]["bits_per_token"] - outs["loud", 0]["bits_per_token"]) > 1e-4  # 100x the rounding
  assert all(math.isfinite(v) and v > 0 for v in outs["loud", 1]["elbo_integrand_bits_by_t"])
  with pytest.raises(ValueError, match="self_cond_passes must be >= 0"):
    likelihood.Settings(self_cond_passes=-1)
  with pytest.raises(ValueError, match="self_cond_passes is for the diffusion bound"):
    likelihood.Settings(mode="ar", self_cond_passes=1)


@pytest.mark.parametrize("loss, reading", [("flat_ce", "full"), ("elbo", "context"), (None, "full")])
def test_auto_reads_the_denoiser_as_its_loss_trained_it(loss, reading):
  diffusion = {} if loss is None else {"loss": loss}  # None: no training config (an HF checkpoint): the recipe's
  assert likelihood.settings_from(diffusion).denoiser_output == reading


def test_an_ar_checkpoint_gets_its_exact_nll(runs):
  root, data = runs
  out_path = root / "ar.json"
  assert load_script("scripts/eval_text.py").main(["eval_text.py", f"--ckpt={root / 'ar' / 'model'}", f"--data={data}",
                                           f"--json_out={out_path}", "--limit=3"]) == 0
  out = json.loads(out_path.read_text())
  assert out["mode"] == "ar" and out["num_examples"] == 3
  # an untrained-ish byte model: positive, finite, and under 8 bits (a uniform guess over 256 bytes) is not asked
  assert math.isfinite(out["nll_bits_per_token"]) and out["nll_bits_per_token"] > 0
  assert out["num_text_bytes"] == sum(min(len(r["response"].strip()), 2 * 16) for r in ROWS[:3])
  assert out["bits_per_byte"] * out["num_text_bytes"] == pytest.approx(out["nll_bits_per_token"] * out["num_tokens"])


def test_bad_input_is_one_line(runs, tmp_path, capsys):
  root, data = runs
  script = load_script("scripts/eval_text.py")
  assert script.main(["eval_text.py", f"--ckpt={root / 'ar' / 'model'}", f"--data={tmp_path / 'nope.jsonl'}"]) == 1
  assert capsys.readouterr().err.strip() == f"error: --data={tmp_path / 'nope.jsonl'} does not exist"
  assert script.main(["eval_text.py", f"--ckpt={root / 'ar' / 'model'}", f"--data={data}", "--num_t=0"]) == 1
  assert capsys.readouterr().err.strip() == "error: --num_t must be >= 1, got 0"
  assert script.main(["eval_text.py", f"--ckpt={root / 'ar' / 'model'}", f"--data={data}", "--self_cond_passes=1"]) == 1
  assert capsys.readouterr().err.strip() == ("error: --self_cond_passes is for the diffusion bound; an AR model's NLL "
                                             "reads the causal encoder")
  assert script.main(["eval_text.py", f"--ckpt={root / 'ar' / 'model'}", f"--data={data}",
                      "--self_cond_passes=-1"]) == 1
  assert capsys.readouterr().err.strip() == "error: --self_cond_passes must be >= 0, got -1"
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
  c.eval.update(dict(every=1, data=str(data), num_t=2, limit=3, num_samples=0 if objective == "diffusion" else 2))
  train.train(c, str(tmp_path / objective))
  out = capsys.readouterr().out
  lines = [ln for ln in out.splitlines() if ln.startswith("eval at step")]
  assert len(lines) == 2
  number = float(re.search(f"held-out {what} ([0-9.]+) ", lines[-1]).group(1))
  assert math.isfinite(number) and number > 0
  texts = metrics.read_texts(str(tmp_path / objective / "tb"))
  if objective == "diffusion":  # num_samples=0: no samples
    assert texts == {} and "eval/sample_" not in out
    return
  # objective=ar: greedy completions of the first two held-out prompts, at each evaluation; the last ones are what
  # the exported model decodes greedily from the prompts as sampling encodes them.
  assert sorted(texts) == ["eval/sample_1", "eval/sample_2"]
  assert all([s for s, _ in texts[tag]] == [1, 2] for tag in texts)
  config, params, metadata = load_model(str(tmp_path / objective / "model"))
  task = tasks.for_checkpoint(config, metadata)
  tokens, valid = task.encode(np.array([r["prompt"] for r in ROWS[:2]], dtype=object))
  out_ar = generate_autoregressive(params, task.config, tokens, valid, jax.random.key(c.seed),
                                   ARConfig(max_new_tokens=32, stop_ids=task.config.stop_ids))
  expected = task.decode(np.asarray(out_ar.tokens))
  for i, row in enumerate(ROWS[:2]):
    shown = texts[f"eval/sample_{i + 1}"][-1][1]
    assert samples.sample_of(shown) == expected[i]
    assert row["prompt"] in shown.split(samples.SAMPLE)[0]
    assert f"eval/sample_{i + 1}:" in out  # and in the console log


def test_training_reads_the_self_conditioned_bound_as_eval_text_does(runs, tmp_path, capsys):
  """eval.self_cond_passes=1: the final in-training number is eval_text.py's --self_cond_passes=1 on the exported
  model (same examples, t values and seed); an AR run refuses it before training."""
  root, data = runs
  c = text_config.get_config(f"data={data},size=debug")
  c.num_train_steps = 2
  c.eval.update(dict(every=2, data=str(data), num_t=2, limit=3, num_samples=0, self_cond_passes=1))
  train.train(c, str(tmp_path / "run"))
  in_training = metrics.read_scalars(str(tmp_path / "run" / "tb"))["eval/elbo_bits_per_token"][-1][1]
  after = {}
  for passes in (0, 1):
    path = tmp_path / f"after_{passes}.json"
    assert load_script("scripts/eval_text.py").main(
        ["eval_text.py", f"--ckpt={tmp_path / 'run' / 'model'}", f"--data={data}", "--num_t=2", "--limit=3",
         f"--self_cond_passes={passes}", f"--json_out={path}"]) == 0
    after[passes] = json.loads(path.read_text())["bits_per_token"]
  assert in_training == pytest.approx(after[1], rel=1e-6)
  assert abs(in_training - after[0]) > 10 * abs(in_training - after[1])  # not the one-pass number
  ar = text_config.get_config(f"data={data},size=debug,objective=ar")
  ar.eval.update(dict(every=1, data=str(data), self_cond_passes=1))
  with pytest.raises(ValueError, match="self_cond_passes is for the diffusion bound"):
    train.train(ar, str(tmp_path / "ar"))


def test_training_writes_samples_that_sample_py_reproduces(runs, tmp_path, capsys):
  """A diffusion run's samples in TensorBoard are what sample.py generates from the exported model for the same
  prompts and seed; each text holds the held-out prompt and response."""
  root, data = runs
  c = text_config.get_config(f"data={data},size=debug")
  c.num_train_steps = 2
  c.eval.update(dict(every=2, data=str(data), num_t=2, limit=2, num_samples=2))
  workdir = tmp_path / "run"
  train.train(c, str(workdir))
  texts = metrics.read_texts(str(workdir / "tb"))
  assert sorted(texts) == ["eval/sample_1", "eval/sample_2"]
  assert "eval/sample_1" not in metrics.read_scalars(str(workdir / "tb"))  # a text is no scalar
  prompts = tmp_path / "prompts.txt"
  prompts.write_text("".join(r["prompt"] + "\n" for r in ROWS[:2]))
  capsys.readouterr()
  assert load_script("sample.py").main(["sample.py", f"--ckpt={workdir / 'model'}", f"--prompts_file={prompts}",
                                        f"--seed={c.seed}"]) == 0
  printed = capsys.readouterr().out
  for i, row in enumerate(ROWS[:2]):
    [(step, shown)] = texts[f"eval/sample_{i + 1}"]
    assert step == 2
    head, rest = shown.split(f"\n{samples.SAMPLE}\n")
    assert head.startswith(samples.PROMPT + "\n") and row["prompt"] in head
    reference = rest.rsplit(f"\n{samples.REFERENCE}\n", 1)[1]
    assert reference and row["response"].startswith(reference)  # (cut at the canvases' capacity)
    answer = printed.split(f"=== prompt {i + 1}/2\n", 1)[1].split("\nsteps per canvas:", 1)[0]
    assert samples.sample_of(shown) == answer


def test_eval_every_without_data_is_refused(runs, tmp_path):
  root, data = runs
  c = text_config.get_config(f"data={data},size=debug")
  c.eval.every = 1
  with pytest.raises(ValueError, match="eval.every > 0 needs eval.data"):
    train.train(c, str(tmp_path / "run"))


def _twin_bits_by_hand(ar_dir, prompt_row, completion_ids):
  """The AR checkpoint's NLL (bits) of the completion after the left-padded prompt, through the functional API:
  one causal encode of the whole row, each completion token read from the logits one slot before it."""
  from dgemma import model
  config, params, _ = load_model(str(ar_dir))
  row = np.concatenate([prompt_row, np.asarray(completion_ids, np.int32)])[None]
  valid = row != config.pad_id
  logits, _ = model.encode(params, config, jax.numpy.asarray(row), model.init_cache(config, 1, row.shape[1]),
                           jax.numpy.asarray(valid))
  logp = jax.nn.log_softmax(np.asarray(logits[0], np.float64), -1)
  p = len(prompt_row)
  return -sum(float(logp[p - 1 + j, t]) for j, t in enumerate(completion_ids)) / math.log(2)


def test_decoding_benchmark_runs_both_decoders_at_batch_1(runs, capsys):
  root, data = runs
  out_path = root / "decoding.json"
  args = ["bench_text_decoding.py", f"--diffusion={root / 'diffusion' / 'model'}", f"--ar={root / 'ar' / 'model'}",
          f"--data={data}", "--num=2", "--show=1", f"--json_out={out_path}", "--steps=2"]
  bench = load_script("scripts/bench_text_decoding.py")
  assert bench.main(args) == 0
  out = json.loads(out_path.read_text())
  summary, rows = out["summary"], out["per_prompt"]
  assert summary["prompts"] == len(rows) == 2
  assert summary["max_denoising_steps"] == summary["sampler"]["max_denoising_steps"] == 2  # --steps reached it
  for r in rows:
    assert r["steps_per_canvas"] and all(1 <= s <= 2 for s in r["steps_per_canvas"])
    assert 0 < r["diffusion_tokens"] <= summary["max_new_tokens"] and 0 < r["ar_tokens"] <= summary["max_new_tokens"]
  assert "=== completion 1, diffusion" in capsys.readouterr().out
  # the twin's score of each completion, against the AR checkpoint's log-probabilities read by hand
  ar_dir = root / "ar" / "model"
  task, _, meta = bench._load_text(str(ar_dir))
  prompt_row = bench._prompts(task, meta, str(data), 1)[0][0][0]
  for which in ("ar", "diffusion"):
    ids = rows[0][f"{which}_ids"]
    assert ids and rows[0][f"{which}_twin_scored"] == len(ids)
    assert rows[0][f"{which}_twin_bits"] == pytest.approx(_twin_bits_by_hand(ar_dir, prompt_row, ids), rel=1e-4)
  assert summary["ar_twin_bits_per_token"] == pytest.approx(
      sum(r["ar_twin_bits"] for r in rows) / sum(len(r["ar_ids"]) for r in rows))
  # the ancestral sampler (every step runs), the AR twin sampled, and another model as the judge
  diffusion_dir = root / "diffusion" / "model"
  assert bench.main(args + ["--update=ancestral", "--adaptive_stopping=false", "--ar_temperature=1",
                            f"--judge={diffusion_dir}", "--nosame_length"]) == 0
  judged = json.loads(out_path.read_text())
  assert judged["summary"]["ar_same_length_s_median"] is None  # --nosame_length: no exact-length AR timing
  assert all(r["ar_same_length_s"] is None for r in judged["per_prompt"])
  assert summary["ar_same_length_s_median"] > 0 and summary["device"] == jax.devices()[0].device_kind
  assert judged["summary"]["sampler"]["update"] == "ancestral" and judged["summary"]["ar_temperature"] == 1
  assert judged["summary"]["judge"] == str(diffusion_dir)
  for r in judged["per_prompt"]:
    assert r["steps_per_canvas"] and all(s == 2 for s in r["steps_per_canvas"])
  first = judged["per_prompt"][0]
  assert first["ar_twin_bits"] == pytest.approx(_twin_bits_by_hand(diffusion_dir, prompt_row, first["ar_ids"]),
                                                rel=1e-4)
  capsys.readouterr()
  assert bench.main(args[:2] + args[3:]) == 1  # no --ar: one error line
  assert capsys.readouterr().err.strip() == "error: --ar is required"
  assert bench.main(args + ["--ar_temperature=-1"]) == 1
  assert capsys.readouterr().err.strip() == "error: --ar_temperature must be >= 0, got -1.0"


def test_completions_that_parse_as_python(tmp_path):
  bench = load_script("scripts/bench_text_decoding.py")
  chat = tmp_path / "chat.jsonl"
  chat.write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
  with pytest.raises(ValueError, match=r"chat.jsonl:1 has no string 'prompt' field"):
    bench._prompt_texts(str(chat), 1)
  prompt = 'def f(x):\n    """Add one."""\n'  # the chat template trims the body's first indentation off
  assert bench._parses(prompt, "y = x + 1\n    return y\n", "    ")
  assert not bench._parses(prompt, "y = x +\n    return y\n", "    ")
  assert not bench._parses(prompt, "y = x + 1\n  return y\n", "    ")  # an unindent that matches nothing
  assert not bench._parses(prompt, "x\0", "    ")  # a NUL byte: not Python, not an exception
  assert not bench._parses(prompt, " \n", "    ")  # nothing completed, though the docstring alone parses
  assert list(bench._completion_mask(np.array([5, 6, 1, 0, 0]), np.array([1]))) == [1, 1, 1, 0, 0]
  assert list(bench._completion_mask(np.array([5, 6, 7]), np.array([1]))) == [1, 1, 1]


def test_a_bad_num_samples_is_refused(runs, tmp_path):
  root, data = runs
  c = text_config.get_config(f"data={data},size=debug")
  c.eval.update(dict(every=1, data=str(data), num_samples=-1))
  with pytest.raises(ValueError, match=r"^eval.num_samples must be an integer >= 0 \(0: no samples\), got -1$"):
    train.train(c, str(tmp_path / "run"))
