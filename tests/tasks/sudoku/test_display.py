"""The step-by-step view of a Sudoku canvas as a 9x9 grid."""

import numpy as np

from dgemma.tasks.sudoku import display


def test_sudoku_grid_frames():
  first = np.zeros(81, np.int8)
  second = np.arange(81) % 10  # digits 0..9 cycling; 0 shows as a blank
  trajectory = np.stack([first, second, second])[:, :, None]  # `cells` below reads the digits directly
  frames = display.sudoku_frames(trajectory, 2, lambda canvas: canvas[:, 0])
  assert [f.label for f in frames] == ["step 1/3", "step 2/3"]
  text = "".join(t for t, _ in frames[1].pieces)
  lines = text.split("\n")
  assert len(lines) == 11  # 9 rows and 2 separators
  assert lines[0] == "· 1 2 | 3 4 5 | 6 7 8" and lines[3] == "------+-------+------"
  cells = [(t, c) for t, c in frames[1].pieces if t.strip() and t.strip() not in "|" and "-" not in t]
  assert len(cells) == 81
  assert [c for _, c in cells] == [bool(d) for d in second]  # changed exactly where a digit appeared
