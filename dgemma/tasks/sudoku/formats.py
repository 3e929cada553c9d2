"""Readers and writers for public Sudoku CSV formats.

Accepted inputs are the two common Kaggle layouts, one puzzle per row as
81-character digit strings with '0' for blanks:

* ``puzzle,solution``   (rohanrao, "9 million Sudoku puzzles and solutions")
* ``quizzes,solutions`` (bryanpark, "1 million Sudoku games")

Extra columns are ignored. Results use the same dict layout as
:func:`dgemma.tasks.sudoku.puzzles.generate_dataset`.
"""

from __future__ import annotations

import csv
import os

import numpy as np

from dgemma.tasks.sudoku import puzzles as sudoku
from dgemma.tasks.sudoku import rules

__all__ = ["ACCEPTED_HEADERS", "read_csv", "read_checked_csv", "check_rows", "write_csv"]

# (puzzle column, solution column) pairs, in order of preference.
ACCEPTED_HEADERS: tuple[tuple[str, str], ...] = (("puzzle", "solution"), ("quizzes", "solutions"))


def _parse_row_field(text: str, path: str, line: int, column: str) -> np.ndarray:
    text = text.strip()
    if len(text) != sudoku.NUM_CELLS or not text.isdigit() or not text.isascii():
        shown = text if len(text) <= 20 else text[:20] + "..."
        raise ValueError(
            f"{path}: line {line}: column '{column}' must be 81 digits, got {len(text)} "
            f"characters {shown!r}"
        )
    return np.frombuffer(text.encode("ascii"), dtype=np.uint8) - ord("0")


def read_csv(
    path: str, limit: int | None = None, label_difficulty: bool = True
) -> dict[str, np.ndarray]:
    """Reads a Kaggle-style Sudoku CSV, refusing it at the first row that breaks the rules.

    Returns ``{"puzzle": [n,81] int8, "solution": [n,81] int8,
    "num_clues": [n] int16, "needs_search": [n] bool}``. ``needs_search`` runs
    the singles-only solver on every puzzle (about 0.1 ms each); with
    ``label_difficulty=False`` it is skipped and the key is omitted.
    ``limit`` keeps only the first ``limit`` puzzles.
    """
    return read_checked_csv(path, limit, label_difficulty)[0]


def check_rows(puzzles: np.ndarray, solutions: np.ndarray, where: list[str],
               skip_bad_rows: bool = False) -> np.ndarray:
    """[n] bool: the (puzzle, solution) rows that keep the rules (`rules.solution_problem`). A bad row raises a
    one-line ValueError "<where[i]>: <problem>", or with `skip_bad_rows` is left out of the mask."""
    keep = np.ones(len(puzzles), bool)
    for i, (puzzle, solution) in enumerate(zip(puzzles, solutions)):
        problem = rules.solution_problem(puzzle, solution)
        if problem is not None:
            if not skip_bad_rows:
                raise ValueError(f"{where[i]}: {problem} (skip such rows with skip_bad_rows)")
            keep[i] = False
    return keep


def read_checked_csv(
    path: str, limit: int | None = None, label_difficulty: bool = True, skip_bad_rows: bool = False
) -> tuple[dict[str, np.ndarray], int]:
    """(`read_csv`'s data, the number of rows skipped). Every row must hold clues that keep the rules and a
    complete solution that keeps them and agrees with the clues: a bad row refuses the file in one line naming
    its line, or with ``skip_bad_rows`` is left out and counted. ``limit`` counts the rows read."""
    if not os.path.isfile(path):
        raise ValueError(f"{path}: sudoku CSV file not found")
    with open(path, newline="") as f:
        reader = csv.reader(f)
        header = next(reader, None)
        if header is None:
            raise ValueError(f"{path}: file is empty, expected a header row")
        names = [h.strip().lower() for h in header]
        for puzzle_col, solution_col in ACCEPTED_HEADERS:
            if puzzle_col in names and solution_col in names:
                break
        else:
            accepted = " or ".join(",".join(h) for h in ACCEPTED_HEADERS)
            raise ValueError(f"{path}: unknown header {','.join(header)!r}; expected {accepted}")
        pi, si = names.index(puzzle_col), names.index(solution_col)

        puzzles: list[np.ndarray] = []
        solutions: list[np.ndarray] = []
        lines: list[str] = []
        for row in reader:
            if limit is not None and len(puzzles) >= limit:
                break
            line = reader.line_num
            if not row or all(not field.strip() for field in row):
                continue  # tolerate blank lines, e.g. a trailing newline
            if len(row) <= max(pi, si):
                raise ValueError(
                    f"{path}: line {line}: expected at least {max(pi, si) + 1} columns, "
                    f"got {len(row)}"
                )
            puzzles.append(_parse_row_field(row[pi], path, line, puzzle_col))
            solutions.append(_parse_row_field(row[si], path, line, solution_col))
            lines.append(f"{path}: line {line}")

    puzzle = np.array(puzzles, dtype=np.int8).reshape(-1, sudoku.NUM_CELLS)
    solution = np.array(solutions, dtype=np.int8).reshape(-1, sudoku.NUM_CELLS)
    keep = check_rows(puzzle, solution, lines, skip_bad_rows)
    puzzle, solution = puzzle[keep], solution[keep]
    data = {
        "puzzle": puzzle,
        "solution": solution,
        "num_clues": (puzzle != 0).sum(axis=1).astype(np.int16),
    }
    if label_difficulty:
        data["needs_search"] = np.array(
            [sudoku.solve_with_singles(p) is None for p in puzzle], dtype=bool
        ).reshape(-1)
    return data, int((~keep).sum())


def write_csv(path: str, data: dict[str, np.ndarray]) -> None:
    """Writes ``data["puzzle"]`` and ``data["solution"]`` as a ``puzzle,solution`` CSV."""
    puzzles = np.asarray(data["puzzle"])
    solutions = np.asarray(data["solution"])
    if puzzles.shape != solutions.shape or puzzles.ndim != 2 or puzzles.shape[1] != 81:
        raise ValueError(
            f"expected puzzle and solution arrays of shape [n, 81], got {puzzles.shape} and "
            f"{solutions.shape}"
        )
    directory = os.path.dirname(path)
    if directory:
        os.makedirs(directory, exist_ok=True)
    with open(path, "w", newline="") as f:
        f.write("puzzle,solution\n")
        for p, s in zip(_rows_as_text(puzzles), _rows_as_text(solutions)):
            f.write(f"{p},{s}\n")


def _rows_as_text(grids: np.ndarray) -> list[str]:
    # Converting the whole array to ASCII at once is far faster than per-cell str().
    ascii_bytes = np.ascontiguousarray(grids.astype(np.uint8) + ord("0"))
    return [row.decode("ascii") for row in ascii_bytes.view("S81").ravel()]
