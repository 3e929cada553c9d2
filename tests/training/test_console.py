"""train.py's terminal shows the run's own lines and warnings; library INFO logging goes to WORKDIR/train.log."""

import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
ABSL_INFO = re.compile(r"^I\d{4} \d\d:\d\d:\d\d")  # absl's prefix of an INFO record: I<mmdd> <time>


def test_debug_run_prints_progress_and_logs_library_info_to_the_workdir(tmp_path):
  workdir = tmp_path / "run"
  out = subprocess.run([sys.executable, "train.py", "--config=configs/sft_sudoku.py:size=debug",
                        f"--workdir={workdir}"], cwd=ROOT, capture_output=True, text=True, timeout=600)
  assert out.returncode == 0, out.stderr[-3000:]
  terminal = (out.stdout + out.stderr).splitlines()
  assert not [line for line in terminal if ABSL_INFO.match(line) or "orbax" in line], terminal
  assert any(line.startswith("step 6/6 | loss") for line in out.stdout.splitlines()), out.stdout
  assert f"Saved the final model to {workdir / 'model'}" in out.stdout
  logged = (workdir / "train.log").read_text().splitlines()
  orbax_info = [line for line in logged if ABSL_INFO.match(line) and "checkpoint_manager.py" in line]
  assert any("Saving checkpoint at step 6" in line for line in orbax_info), logged[:20]


def test_terminal_keeps_warnings_on_one_line(tmp_path):
  code = f"""
import warnings
from absl import app, logging
from dgemma.training import logs

def main(argv):
  logs.log_to_workdir({str(tmp_path)!r})
  logging.info("a library's progress")
  logging.warning("a library's warning")
  warnings.warn("first line\\nsecond line", RuntimeWarning)

app.run(main)
"""
  out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "JAX_PLATFORMS": "cpu"})
  assert out.returncode == 0, out.stderr
  terminal = (out.stdout + out.stderr).splitlines()
  assert len(terminal) == 2, terminal
  assert terminal[0].startswith("W") and terminal[0].endswith("a library's warning")
  assert terminal[1].startswith("W") and terminal[1].endswith("RuntimeWarning: first line second line")
  logged = (tmp_path / "train.log").read_text()
  for text in ("a library's progress", "a library's warning", "RuntimeWarning: first line second line"):
    assert text in logged
