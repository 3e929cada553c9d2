"""sample.py on an objective=ar text checkpoint (a 3-step debug model): greedy causal decoding, checked against a
brute-force greedy decode that re-encodes the whole prefix for every token; --decode to force either decoder;
the diffusion-only flags refused in one line; JSONL prompts whatever the batch size."""

import json
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import train
from configs import text as text_config
from dgemma import tasks
from dgemma.loading import load_model
from dgemma.model.cache import init_cache
from dgemma.model.transformer import DiffusionGemma
from dgemma.tasks.text.chat import Turn
from tests.script_loader import load_script

ROWS = [{"prompt": f"Say {w}.", "response": f"{w} {w}."} for w in ("hi", "yes", "no", "red")]
PROMPTS = [{"prompt": "Say hi."}, {"prompt": "Say red, twice."},
           {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]}]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
  """(the objective=ar model, the same weights recorded as a diffusion run's, a JSONL prompts file)."""
  root = tmp_path_factory.mktemp("sample_ar")
  data = root / "toy.jsonl"
  data.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  train.train(text_config.get_config(f"data={data},size=debug,objective=ar"), str(root / "ar"))
  ar = root / "ar" / "model"
  # A "diffusion checkpoint" without a second training run: the metadata is all that decides --decode=auto.
  diffusion = root / "diffusion_model"
  shutil.copytree(ar, diffusion)
  record = json.loads((diffusion / "dgemma.json").read_text())
  record["metadata"]["train_config"]["diffusion"]["diffusion_loss_weight"] = 1.0
  (diffusion / "dgemma.json").write_text(json.dumps(record))
  prompts = root / "prompts.jsonl"
  prompts.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
  return str(ar), str(diffusion), str(prompts)


def _greedy_by_whole_prefix(params, config, prompt_P, valid_P, stop_ids, limit, features) -> list[int]:
  """Greedy decoding the slow way: every token from one causal encode of the whole prefix in a fresh cache
  (nothing reused), the arg-max at its last position; the stop token included."""
  model = DiffusionGemma(config)
  p = len(prompt_P)
  tokens_T = np.full(p + limit, config.pad_id, np.int32)
  valid_T = np.zeros(p + limit, bool)
  tokens_T[:p], valid_T[:p] = prompt_P, valid_P
  table = None if features is None else jnp.asarray(features)

  @jax.jit
  def logits_at(tokens_T, valid_T, last):  # later slots are invalid, and a causal encoder never sees them anyway
    logits, _ = model.apply({"params": params}, tokens_T[None], init_cache(config, 1, p + limit), valid_T[None],
                            True, table, method=DiffusionGemma.encode)
    return logits[0, last]

  out = []
  for i in range(limit):
    token = int(np.argmax(np.asarray(logits_at(tokens_T, valid_T, p + i - 1))))
    out.append(token)
    if token in stop_ids:
      break
    tokens_T[p + i], valid_T[p + i] = token, True
  return out


def _run(args, capsys):
  capsys.readouterr()
  rc = load_script("sample.py").main(["sample.py", *args])
  captured = capsys.readouterr()
  return rc, captured.out, captured.err


def test_an_ar_checkpoint_decodes_greedily_as_its_encoder_predicts(ckpts, tmp_path, capsys):
  ar, _, prompts = ckpts
  out_path = tmp_path / "out.jsonl"
  rc, out, _ = _run([f"--ckpt={ar}", f"--prompts_file={prompts}", f"--output={out_path}"], capsys)
  assert rc == 0
  assert "decoding autoregressively (trained with objective=ar)" in out
  assert "steps per canvas" not in out
  records = [json.loads(line) for line in out_path.read_text().splitlines()]
  config, params, metadata = load_model(ar)
  task = tasks.for_checkpoint(config, metadata, ar)
  capacity = task.config.canvas_length * task.max_canvases  # as the training samples: the canvases' capacity
  assert len(records) == len(PROMPTS)
  for given, record in zip(PROMPTS, records):
    assert {k: record[k] for k in given} == given
    turns = np.empty(1, object)  # the prompt row as training encodes it (chat template, left padding)
    if "messages" in given:
      turns[0] = tuple(Turn(m["role"], m["content"]) for m in given["messages"])
    else:
      turns[0] = given["prompt"]
    tokens, valid = task.encode(turns)
    expected = _greedy_by_whole_prefix(params, task.config, tokens[0], valid[0], task.config.stop_ids, capacity,
                                       metadata.get("position_features"))
    kept = [t for t in expected if t not in task.config.stop_ids and t != task.config.pad_id]
    assert record["tokens"] == kept
    assert record["completion"] == task.tokenizer.decode(kept, skip_special=True)
    assert record["steps"] == len(expected)  # tokens generated, a stop token included
  # --max_new_tokens asks for fewer.
  rc, out, _ = _run([f"--ckpt={ar}", "--prompt=Say hi.", "--max_new_tokens=5", f"--output={out_path}"], capsys)
  assert rc == 0 and "up to 5 new tokens" in out
  [record] = [json.loads(line) for line in out_path.read_text().splitlines()]
  assert record["steps"] <= 5 and record["tokens"] == records[0]["tokens"][:len(record["tokens"])]


def test_jsonl_prompts_do_not_depend_on_the_batch_size(ckpts, capsys):
  ar, _, prompts = ckpts
  lines = {}
  for batch_size in (0, 2):
    rc, out, err = _run([f"--ckpt={ar}", f"--prompts_file={prompts}", f"--batch_size={batch_size}"], capsys)
    assert rc == 0 and "decoding autoregressively" in err  # without --output: JSON on stdout, the rest on stderr
    lines[batch_size] = out.splitlines()
  assert len(lines[0]) == len(PROMPTS) and lines[0] == lines[2]
  assert all("tokens" in json.loads(line) and "completion" in json.loads(line) for line in lines[0])


def test_decode_forces_either_decoder(ckpts, tmp_path, capsys):
  ar, diffusion, _ = ckpts
  # The diffusion sampler on the AR checkpoint: its step counts per canvas, no AR line.
  rc, out, _ = _run([f"--ckpt={ar}", "--prompt=Say hi.", "--decode=diffusion", "--steps=2",
                     f"--output={tmp_path / 'd.jsonl'}"], capsys)
  assert rc == 0 and "decoding autoregressively" not in out and "steps per canvas:" in out
  [record] = [json.loads(line) for line in (tmp_path / "d.jsonl").read_text().splitlines()]
  assert isinstance(record["steps"], list) and all(1 <= s <= 2 for s in record["steps"])
  # auto on a diffusion run's checkpoint: the sampler; --decode=autoregressive: the AR decode of the same weights.
  rc, out, _ = _run([f"--ckpt={diffusion}", "--prompt=Say hi.", "--steps=2"], capsys)
  assert rc == 0 and "decoding autoregressively" not in out and "steps per canvas:" in out
  for ckpt, name in ((ar, "ar"), (diffusion, "forced")):
    decode = ["--decode=autoregressive"] if ckpt == diffusion else []
    rc, out, _ = _run([f"--ckpt={ckpt}", "--prompt=Say hi.", *decode, f"--output={tmp_path / name}.jsonl"], capsys)
    assert rc == 0
  assert "decoding autoregressively (--decode=autoregressive)" in out
  assert (tmp_path / "ar.jsonl").read_text() == (tmp_path / "forced.jsonl").read_text()


@pytest.mark.parametrize("flags,named", [
    (["--steps=4"], "--steps"), (["--stream"], "--stream"), (["--samples=2"], "--samples"),
    (["--show_steps", "--t_max=0.5"], "--show_steps, --t_max"),
    (["--show_steps_html=x.html"], "--show_steps_html")])
def test_diffusion_only_flags_are_refused_in_one_line(ckpts, capsys, flags, named):
  ar, diffusion, _ = ckpts
  rc, _, err = _run([f"--ckpt={ar}", "--prompt=Say hi.", *flags], capsys)
  assert rc != 0
  assert err.strip().splitlines() == [
      f"error: {named} only apply to the diffusion sampler, and {ar} (trained with objective=ar) is decoded "
      "autoregressively; --decode=diffusion to use the sampler anyway"]
  rc, _, err = _run([f"--ckpt={diffusion}", "--prompt=Say hi.", "--decode=autoregressive", *flags], capsys)
  assert rc != 0
  assert err.strip().splitlines() == [f"error: {named} only apply to the diffusion sampler, not to "
                                      "--decode=autoregressive"]
