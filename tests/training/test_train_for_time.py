"""scripts/train_for_time.py: a probe measures the step rate, the real run gets the steps that fit."""

import re
import subprocess
import sys

import pytest

from dgemma.training import checkpointing
from tests.script_loader import ROOT, load_script


def test_plan_is_the_remaining_time_times_the_rate():
  plan_steps = load_script("scripts/train_for_time.py").plan_steps
  # 600 s budget, 100 s gone, one more 50 s start-up and a 10 s export: 440 s, 10% kept back, at 10 steps/s
  assert plan_steps(600, 100, 50, 10.0, 0.1, 10) == int(440 * 0.9 * 10)
  assert plan_steps(60, 100, 0, 10.0, 0.0, 0) < 1  # already over budget: nothing to plan
  assert plan_steps(600, 100, 50, 10.0, 0.1, 10, max_steps=500) == 500  # the cap wins
  with pytest.raises(ValueError, match="margin"):
    plan_steps(600, 0, 0, 1.0, 1.0, 0)


def _run(*args):
  return subprocess.run([sys.executable, "scripts/train_for_time.py", "--config=configs/sft_sudoku.py:size=debug",
                         "--config.log_every=5", "--config.checkpoint_every=1000", *args],
                        cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_trains_the_planned_steps_and_exports(tmp_path):
  # A generous budget, capped at 12 steps so that the test stays short on any machine.
  done = _run(f"--workdir={tmp_path}/run", "--minutes=5", "--probe_steps=6", "--max_steps=12")
  assert done.returncode == 0, done.stderr[-2000:]
  planned = int(re.search(r"planned (\d+) steps", done.stdout).group(1))
  assert planned == 12  # debug steps take milliseconds: far more than 12 fit in 5 minutes
  assert checkpointing.Checkpointer(f"{tmp_path}/run").latest_step() == 12  # the final checkpoint
  assert (tmp_path / "run" / "model").is_dir()
  # The same workdir again: one line, nothing overwritten.
  again = _run(f"--workdir={tmp_path}/run", "--minutes=5", "--probe_steps=6", "--max_steps=12")
  assert again.returncode != 0
  assert again.stderr.strip().splitlines()[-1].startswith(f"train_for_time.py: error: {tmp_path}/run already holds")
  # A budget that cannot hold the warm-up: one line after the probe, and no run is started.
  short = _run(f"--workdir={tmp_path}/short", "--minutes=5", "--probe_steps=6", "--max_steps=12",
               "--config.optimizer.warmup_steps=1000000")
  assert short.returncode != 0
  assert "no more than optimizer.warmup_steps=1000000" in short.stderr.strip().splitlines()[-1]
  assert not (tmp_path / "short").exists()
