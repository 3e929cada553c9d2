"""Generate a Sudoku set (unique solutions, difficulty labels) as a CSV or .npz, e.g. a held-out eval set.

    python scripts/make_sudoku_data.py --n=1000 --seed=12345 --out=data/sudoku_eval_1000.npz

Use a seed the training never used (training generates with data.seed, default 0).
"""

from __future__ import annotations

import os
import sys

import numpy as np
from absl import app, flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
from dgemma.tasks.sudoku import puzzles as sudoku, formats as sudoku_formats  # noqa: E402

_N = flags.DEFINE_integer("n", 1000, "Number of puzzles.")
_SEED = flags.DEFINE_integer("seed", 12345, "Generator seed.")
_MIN = flags.DEFINE_integer("min_clues", 22, "Fewest clues.")
_MAX = flags.DEFINE_integer("max_clues", 36, "Most clues.")
_WORKERS = flags.DEFINE_integer("workers", 1, "Processes.")
_OUT = flags.DEFINE_string("out", None, "Output .csv or .npz.", required=True)


def main(argv):
  del argv
  data = sudoku.generate_dataset(_N.value, _SEED.value, _MIN.value, _MAX.value, num_workers=_WORKERS.value)
  os.makedirs(os.path.dirname(os.path.abspath(_OUT.value)), exist_ok=True)
  if _OUT.value.endswith(".npz"):
    np.savez(_OUT.value, **data)
  else:
    sudoku_formats.write_csv(_OUT.value, data)
  search = float(np.mean(data["needs_search"]))
  print(f"wrote {_N.value} puzzles to {_OUT.value} (clues {_MIN.value}-{_MAX.value}, {search:.0%} need search)")


if __name__ == "__main__":
  app.run(main)
