"""scripts/bench_train_step.py: it times the real train step, whose FLOP count follows the batch."""

import functools
import os

from configs import sft_sudoku
from tests.script_loader import load_script

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@functools.cache  # once per process: the script defines absl flags
def _bench_module():
  return load_script("scripts/bench_train_step.py")


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


def test_merged_busy_intervals():
  bench = _bench_module()
  # A nested event counts once, touching intervals join, disjoint ones stay apart.
  assert bench._merged([(5, 6), (0, 4), (1, 2), (4, 4.5)]) == [(0, 4.5), (5, 6)]


def test_profile_shares_add_up(tmp_path):
  bench = _bench_module()
  c = sft_sudoku.get_config("size=debug")
  c.data.cache_dir = str(tmp_path / "data")
  r = bench.time_train_step(c, steps=1)
  kinds, busy = bench.profile_steps(r, num_steps=2)
  assert abs(sum(share for _, _, share in kinds) - 1) < 1e-6
  assert abs(sum(busy.values()) - 1) < 1e-6 and set(busy) <= {0, 1, 2}
  assert all(ms >= 0 for _, ms, _ in kinds)


def test_bad_input_is_one_line(capsys):
  bench = _bench_module()
  script = os.path.join(ROOT, "scripts", "bench_train_step.py")
  assert bench.main([script]) == 1
  assert capsys.readouterr().err.strip() == "error: --config is required, e.g. --config=configs/sft_sudoku.py"
  assert bench.main([script, "--config=configs/sft_sudoku.py:size=debug", "--steps=0"]) == 1
  assert capsys.readouterr().err.strip() == "error: --steps must be >= 1, got 0"
