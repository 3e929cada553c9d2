"""A new task is one module plus one registry line: the toy task of docs/tasks.md, run from the doc itself,
trains end to end through train.train and samples through sample.py."""

import os
import pathlib
import re

import numpy as np
import pytest

import train
from configs import sft_sudoku
from dgemma import tasks
from dgemma.loading import load_model
from tests.script_loader import load_script

ROOT = pathlib.Path(__file__).resolve().parents[2]


@pytest.fixture
def toy(monkeypatch):
  """The doc's toy-task block, executed with a registry that is restored afterwards."""
  monkeypatch.setattr(tasks, "_REGISTRY", dict(tasks._REGISTRY))
  doc = (ROOT / "docs" / "tasks.md").read_text()
  code = re.search(r"<!-- toy-task -->\n```python\n(.*?)```", doc, re.S).group(1)
  namespace = {"__name__": "toy_task"}
  exec(compile(code, "docs/tasks.md", "exec"), namespace)
  return namespace


def toy_config(tmp_path):
  c = sft_sudoku.get_config("size=debug,positions=absolute")
  c.task.name = "reverse_digits"
  c.model.update(dict(canvas_length=16, learned_positions=32))
  c.num_train_steps, c.checkpoint_every = 3, 3
  c.data.cache_dir = str(tmp_path / "data")
  return c


def test_toy_task_trains_and_samples(toy, tmp_path, capsys):
  assert "reverse_digits" in tasks.names() and tasks.get("reverse_digits") is toy["ReverseDigits"]
  c = toy_config(tmp_path)
  out = train.train(c, str(tmp_path / "run"))
  assert np.isfinite(out["loss"])
  config, params, metadata = load_model(str(tmp_path / "run" / "model"))
  assert metadata["task"] == {"name": "reverse_digits", "prompt_len": 9}
  task = tasks.for_checkpoint(config, metadata)
  assert isinstance(task, toy["ReverseDigits"]) and isinstance(task, tasks.Task)
  digits = np.array([[1, 2, 3, 4, 5, 6, 7, 8]])
  np.testing.assert_array_equal(task.decode(task.example(digits)["canvas"]), digits[:, ::-1])
  capsys.readouterr()
  rc = load_script("sample.py").main(["sample.py", f"--ckpt={tmp_path / 'run' / 'model'}", "--prompt=12345678",
                                      "--steps=2"])
  lines = capsys.readouterr().out.splitlines()
  assert rc == 0 and lines[0] == "=== prompt 1/1"
  assert re.fullmatch(r"\d( \d){7}", lines[1]), lines[1]  # the task's answer: 8 digits, shown by the task


def test_toy_task_stream_is_sharded_and_resumes_exactly(toy, tmp_path):
  c = toy_config(tmp_path)
  config = train.build_model(c)[0]
  task = tasks.for_config(c, config)
  it = iter(task.train_dataset(c, 4, 0, 1, noise_rank=False))
  next(it), next(it)
  state = it.get_state()
  expected = next(it)
  resumed = iter(task.train_dataset(c, 4, 0, 1, noise_rank=False))
  resumed.set_state(state)
  got = next(resumed)
  assert all(np.array_equal(expected[k], got[k]) for k in ("prompt", "canvas", "canvas_mask"))
  # Each of two processes reads every other record of the same 200 (one epoch = one batch of 100 here).
  rows = np.random.default_rng(c.data.seed).integers(0, 10, (c.data.num_train, 8))
  for i in range(2):
    prompt = next(iter(task.train_dataset(c, 100, i, 2, noise_rank=False)))["prompt"]
    assert sorted(map(tuple, prompt[:, 1:] - 3)) == sorted(map(tuple, rows[i::2]))


def test_unknown_task_name_lists_the_registered_ones(tmp_path):
  c = toy_config(tmp_path)
  with pytest.raises(ValueError, match=r"^unknown task 'reverse_digits'; registered tasks: sudoku_digits, "
                                       r"sudoku_text, text$"):
    train.train(c, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run" / "checkpoints")
