"""Step-by-step pictures of a Sudoku canvas: each step's argmax canvas as a 9x9 grid, changed cells marked."""

from __future__ import annotations

from typing import Callable

import numpy as np

from dgemma.sampling.display import Frame
from dgemma.tasks.sudoku import puzzles as sudoku


def sudoku_frames(trajectory_SxC: np.ndarray, steps: int, cells: Callable[[np.ndarray], np.ndarray]
                  ) -> list[Frame]:
  """Frames of a Sudoku canvas as a 9x9 grid: `cells` maps a canvas to its 81 digits (0: blank so far)."""
  frames, previous = [], None
  for k in range(int(steps)):
    grid = np.asarray(cells(np.asarray(trajectory_SxC[k])))
    changed = np.ones(sudoku.NUM_CELLS, bool) if previous is None else grid != previous
    label = f"step {k + 1}/{len(trajectory_SxC)}"
    frames.append(Frame(label, _grid_pieces([str(d) if 1 <= d <= 9 else "·" for d in grid], changed)))
    previous = grid
  return frames


def grid_text(grid: np.ndarray) -> str:
  """81 digits as nine lines of nine ('.' for 0)."""
  return "\n".join(" ".join(str(d) if d else "." for d in grid[r * 9:(r + 1) * 9]) for r in range(9))


def _grid_pieces(cells: list[str], changed: np.ndarray) -> list[tuple[str, bool]]:
  pieces: list[tuple[str, bool]] = []
  for idx, (text, moved) in enumerate(zip(cells, changed)):
    pieces.append((text, bool(moved)))
    col = idx % 9
    if col == 8:
      if idx // 9 in (2, 5):
        pieces.append(("\n------+-------+------", False))
      if idx != sudoku.NUM_CELLS - 1:
        pieces.append(("\n", False))
    else:
      pieces.append((" | " if col in (2, 5) else " ", False))
  return pieces
