"""The rules of Sudoku as checks that say what is wrong, in words a user can act on.

Grids are 81 values in row-major order, 0 for a blank. Rows, columns and boxes are numbered from 1 as people
number them; boxes left to right, top to bottom.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

_ROWS = [[9 * r + c for c in range(9)] for r in range(9)]
_COLUMNS = [[9 * r + c for r in range(9)] for c in range(9)]
_BOXES = [[9 * (3 * (b // 3) + i) + 3 * (b % 3) + j for i in range(3) for j in range(3)] for b in range(9)]
_UNITS = [("row", _ROWS), ("column", _COLUMNS), ("box", _BOXES)]


def rule_violation(grid: Sequence[int] | np.ndarray) -> str | None:
  """The first broken rule of a (possibly partial) grid, e.g. "two 5s in row 1"; None if it keeps them."""
  values = np.asarray(grid).reshape(-1)
  if values.shape != (81,):
    return f"a grid has 81 cells, got {values.size}"
  if values.min() < 0 or values.max() > 9:
    cell = int(np.flatnonzero((values < 0) | (values > 9))[0])
    return f"value {int(values[cell])} at row {cell // 9 + 1}, column {cell % 9 + 1} is not a digit 0-9"
  for kind, units in _UNITS:
    for number, cells in enumerate(units, 1):
      digits = values[cells]
      counts = np.bincount(digits, minlength=10)[1:]
      if counts.max() > 1:
        return f"two {int(np.argmax(counts > 1)) + 1}s in {kind} {number}"
  return None


def solution_problem(puzzle: Sequence[int] | np.ndarray, solution: Sequence[int] | np.ndarray) -> str | None:
  """What is wrong with a (puzzle, solution) pair, or None: the clues keep the rules, the solution is complete,
  keeps the rules and agrees with every clue."""
  puzzle, solution = np.asarray(puzzle).reshape(-1), np.asarray(solution).reshape(-1)
  broken = rule_violation(puzzle)
  if broken:
    return f"the puzzle breaks the rules: {broken}"
  blanks = int((solution == 0).sum())
  if blanks:
    return f"the solution has {blanks} blank cell{'s' if blanks > 1 else ''}"
  broken = rule_violation(solution)
  if broken:
    return f"the solution breaks the rules: {broken}"
  clues = np.flatnonzero((puzzle != 0) & (puzzle != solution))
  if clues.size:
    cell = int(clues[0])
    return (f"the solution contradicts the clue at row {cell // 9 + 1}, column {cell % 9 + 1} "
            f"(clue {int(puzzle[cell])}, solution {int(solution[cell])})")
  return None
