"""scripts/bench_train_step.py: it times the real train step, whose FLOP count follows the batch."""

import importlib.util
import os

from configs import sft_sudoku

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _bench_module():
  spec = importlib.util.spec_from_file_location("bench_train_step", os.path.join(ROOT, "scripts", "bench_train_step.py"))
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module


def test_step_flops_scale_with_the_batch(tmp_path):
  bench = _bench_module()
  counts = {}
  for batch in (4, 8):
    c = sft_sudoku.get_config("size=debug")
    c.data.cache_dir = str(tmp_path / "data")
    c.batch_size = batch
    r = bench.time_train_step(c, steps=1)
    assert r["median_s"] > 0 and r["examples_per_s"] == batch / r["median_s"]
    counts[batch] = r["flops"]
  # Every part of the step but the optimizer update grows with the examples (self-conditioning rows included).
  assert 1.8 < counts[8] / counts[4] < 2.05, counts
