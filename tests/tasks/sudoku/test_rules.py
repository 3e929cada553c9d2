"""The rule checks name the broken rule; checked against a brute-force scan of every pair of cells."""

import itertools

import numpy as np
import pytest

from dgemma.tasks.sudoku.rules import rule_violation, solution_problem

SOLUTION = np.array([int(c) for c in
                     "534678912672195348198342567859761423426853791713924856961537284287419635345286179"])
PUZZLE = np.array([int(c) for c in
                   "530070000600195000098000060800060003400803001700020006060000280000419005000080079"])


def _brute_force_conflict(grid) -> bool:
  for a, b in itertools.combinations(range(81), 2):
    same_unit = a // 9 == b // 9 or a % 9 == b % 9 or (a // 27 == b // 27 and a % 9 // 3 == b % 9 // 3)
    if same_unit and grid[a] and grid[a] == grid[b]:
      return True
  return False


def test_valid_pair_has_no_problem():
  assert rule_violation(PUZZLE) is None and rule_violation(SOLUTION) is None
  assert solution_problem(PUZZLE, SOLUTION) is None


def test_agrees_with_brute_force_on_random_grids():
  rng = np.random.default_rng(0)
  for _ in range(300):
    grid = np.where(rng.random(81) < 0.25, rng.integers(1, 10, 81), 0)
    assert (rule_violation(grid) is not None) == _brute_force_conflict(grid)


def test_names_the_unit():
  grid = PUZZLE.copy()
  grid[1] = 5  # row 1 now has 5 at columns 1 and 2 (and box 1)
  assert rule_violation(grid) == "two 5s in row 1"
  grid = np.zeros(81, int)
  grid[[4, 13 + 27]] = 7  # column 5, rows 1 and 5
  assert rule_violation(grid) == "two 7s in column 5"
  grid = np.zeros(81, int)
  grid[[0, 10]] = 3  # box 1 only
  assert rule_violation(grid) == "two 3s in box 1"
  assert "not a digit" in rule_violation(np.full(81, 11))


@pytest.mark.parametrize("change,expected", [
    (lambda p, s: (p, np.where(np.arange(81) == 80, 0, s)), "the solution has 1 blank cell"),
    (lambda p, s: (p, np.roll(s, 1)), "the solution breaks the rules"),
    (lambda p, s: (np.where(np.arange(81) == 2, 5, p), s), "the puzzle breaks the rules: two 5s in row 1"),
])
def test_bad_pairs(change, expected):
  assert solution_problem(*change(PUZZLE, SOLUTION)).startswith(expected)


def test_solution_contradicting_a_clue():
  # A valid grid (digits 1 and 2 swapped everywhere) that keeps the rules but not the clues.
  swapped = np.select([SOLUTION == 1, SOLUTION == 2], [2, 1], SOLUTION)
  assert solution_problem(PUZZLE, swapped).startswith("the solution contradicts the clue at row")
