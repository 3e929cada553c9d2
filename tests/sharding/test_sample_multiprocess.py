"""sample.py across two processes on localhost (jax.distributed, CPU collectives): process 0 prints exactly
what a single process prints for the same seed; process 1 computes silently."""

import os
import subprocess
import sys

import jax

from dgemma import checkpoints, model
from dgemma.config import small_dense
from dgemma.tasks.sudoku import digits as sudoku_task
from tests.sharding import common

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PUZZLE = "021009000870030900064005200000080705000160080000000063000010050000002600700400000"


def _sample(ckpt, *extra, env=None):
  cmd = [sys.executable, "sample.py", f"--ckpt={ckpt}", f"--prompt={PUZZLE}", "--seed=3", "--steps=4", *extra]
  return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _answer(stdout: str) -> list[str]:
  """The grid and the verdict lines (timings differ between runs)."""
  return [line for line in stdout.splitlines() if not line.startswith("---")]


def test_two_process_sampling_matches_one_process(tmp_path):
  config = small_dense(sudoku_task.DIGIT_VOCAB_SIZE, width=32, num_layers=2, num_heads=2,
                       stop_ids=(sudoku_task.EOS_ID,))
  ckpt = str(tmp_path / "ckpt")
  checkpoints.save_model(ckpt, config, model.init_params(config, jax.random.key(0)),
                         {"task": {"name": "sudoku_digits", "prompt_len": sudoku_task.PROMPT_CONTENT_LEN}})
  env = common.subprocess_env(1)
  single = _sample(ckpt, env=env)
  out_single, err_single = single.communicate(timeout=300)
  assert single.returncode == 0, err_single
  port = common.free_port()
  procs = [_sample(ckpt, "--coordinator_address=127.0.0.1:%d" % port, "--num_processes=2", f"--process_id={i}",
                   env=env) for i in range(2)]
  outs = [p.communicate(timeout=300) for p in procs]
  assert [p.returncode for p in procs] == [0, 0], [e for _, e in outs]
  assert _answer(outs[0][0]) == _answer(out_single) and "=== prompt 1/1" in outs[0][0]
  assert outs[1][0].strip() == ""  # only process 0 prints
