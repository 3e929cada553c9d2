"""The front door end to end: configs/text.py on a toy text file, a few steps through train.train (diffusion
and objective=ar), then sample.py on the exported model prints text with no further flags."""

import json
import pathlib
import re
import subprocess
import sys

import numpy as np
import pytest

import train
from configs import text as text_config
from dgemma import tasks
from dgemma.loading import load_model
from tests.script_loader import load_script

ROOT = pathlib.Path(__file__).resolve().parents[3]

ROWS = [{"prompt": f"Say {w}.", "response": f"{w} {w}."} for w in ("hi", "yes", "no", "blue", "red", "one")] + [
    {"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hello to you too."}]}]


@pytest.fixture
def data(tmp_path):
  path = tmp_path / "toy.jsonl"
  path.write_text("".join(json.dumps(r) + "\n" for r in ROWS))
  return path


def test_train_then_sample_prints_text(data, tmp_path, capsys):
  c = text_config.get_config(f"data={data},size=debug")
  out = train.train(c, str(tmp_path / "run"))
  assert np.isfinite(out["loss"])
  config, _, metadata = load_model(str(tmp_path / "run" / "model"))
  assert metadata["task"] == {"name": "text", "prompt_len": 32, "tokenizer": "bytes", "chat_template": "gemma3",
                              "max_canvases": 2, "prompt_overflow": "truncate"}
  task = tasks.for_checkpoint(config, metadata)
  assert task.config.stop_ids == (1, 4)
  # What sampling feeds the model is what training did: the prompt row of a one-turn conversation.
  tokens, valid = task.encode(np.array(["Say hi."], dtype=object))
  batch = next(iter(task.train_dataset(c, 7, 0, 1, False)))
  assert any(np.array_equal(tokens[0], p) for p in batch["prompt"])
  assert valid.sum() == (tokens != 0).sum()
  capsys.readouterr()
  rc = load_script("sample.py").main(["sample.py", f"--ckpt={tmp_path / 'run' / 'model'}", "--prompt=Say hi.",
                                      "--steps=2"])
  lines = capsys.readouterr().out.splitlines()
  assert rc == 0 and lines[0] == "=== prompt 1/1"
  # The answer is text (decoded bytes, a 3-step model's), then the sampler's summary lines.
  assert not re.fullmatch(r"[\d,]*", lines[1]) and lines[-2].startswith("--- 1 prompt(s) · canvas 16 ·")
  assert "/2 canvas(es)" in lines[-2]  # as many canvases as training allowed
  sample = load_script("sample.py")
  model = f"--ckpt={tmp_path / 'run' / 'model'}"
  assert sample.main(["sample.py", model, "--prompt=Say hi.", "--steps=2", "--max_new_tokens=16"]) == 0
  assert "· 1/1 canvas(es) ·" in capsys.readouterr().out  # or fewer
  assert sample.main(["sample.py", model, "--prompt=Say hi.", "--canvas_length=8"]) != 0
  assert "--canvas_length cannot be set for a text checkpoint: the task sets them" in capsys.readouterr().err


def test_ar_variant_trains_the_same_backbone_causally(data, tmp_path):
  c = text_config.get_config(f"data={data},size=debug,objective=ar")
  assert c.diffusion.diffusion_loss_weight == 0 and c.diffusion.ar_targets == "canvas"
  out = train.train(c, str(tmp_path / "ar"))
  assert np.isfinite(out["loss"]) and out["loss"] == pytest.approx(out["ar_loss"])


def test_a_killed_text_run_resumes_bit_identically(data, tmp_path):
  """The text stream's state goes through the training checkpoint: stopped after 4 steps (checkpoint at 3)
  and resumed, the run ends with the weights of one that was never stopped."""
  import jax
  c = text_config.get_config(f"data={data},size=debug")
  c.num_train_steps, c.checkpoint_every = 6, 3
  train.train(c, str(tmp_path / "straight"))
  train.train(c, str(tmp_path / "resumed"), stop_at_step=4)
  train.train(c, str(tmp_path / "resumed"))
  a, b = (load_model(str(tmp_path / run / "model"))[1] for run in ("straight", "resumed"))
  assert jax.tree.all(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b))


def test_decode_stops_at_the_first_stop_id(data):
  c = text_config.get_config(f"data={data},size=debug")
  task = tasks.for_config(c, train.build_model(c)[0])
  ids = [16 + b for b in b"ok!"] + [4] + [16 + b for b in b"junk"] + [1]
  assert task.decode(np.array([ids, [16 + 104, 0, 16 + 105, 1, 16 + 33, 4, 0, 0, 0]])).tolist() == ["ok!", "hi"]


def test_config_arguments_are_checked():
  with pytest.raises(ValueError, match="unknown size 'huge'"):
    text_config.get_config("size=huge")
  with pytest.raises(ValueError, match="unknown objective 'mdlm'"):
    text_config.get_config("objective=mdlm")


def test_a_malformed_line_stops_train_py_with_one_line(tmp_path):
  path = tmp_path / "bad.jsonl"
  path.write_text(json.dumps(ROWS[0]) + "\n" + '{"prompt": "p", "answer": "a"}\n')
  run = subprocess.run([sys.executable, "train.py", f"--config=configs/text.py:data={path},size=debug",
                        f"--workdir={tmp_path / 'run'}"], capture_output=True, text=True,
                       cwd=str(ROOT))
  assert run.returncode == 1
  assert run.stderr.strip().splitlines()[-1] == (
      f"train.py: error: {path}:2: no string field 'response' (and no 'messages' list); keys: answer, prompt")


def test_chat_flag_and_conversations_on_a_text_checkpoint(data):
  """sample.py --chat on a text checkpoint: the recorded template (auto/on), plain BOS + prompt (off), and a clear
  refusal of --chat=on for a model trained without one; a JSONL conversation is rendered as in training."""
  from dgemma.tasks.text.chat import Turn
  c = text_config.get_config(f"data={data},size=debug")
  config = train.build_model(c)[0]
  task = tasks.for_config(c, config)
  assert task.chat_template == "gemma3" and task.with_chat("on") is task and task.with_chat("auto") is task
  tokens, valid = task.with_chat("off").encode(np.array(["hi"], dtype=object))
  assert tokens[0, valid[0]].tolist() == [2, 16 + ord("h"), 16 + ord("i")]
  conversation = np.empty(1, object)
  conversation[0] = (Turn("system", "Be brief."), Turn("user", "hi"))
  tokens, valid = task.encode(conversation)
  assert task.tokenizer.decode(tokens[0, valid[0]]) == \
      "<bos><start_of_turn>user\nBe brief.\n\nhi<end_of_turn>\n<start_of_turn>model\n"
  c.data.chat_template = "none"
  with pytest.raises(ValueError, match=r"^--chat=on but CKPT has no chat template \(trained with chat_template "
                                       r"'none'\)$"):
    tasks.for_config(c, config).with_chat("on", "CKPT")
