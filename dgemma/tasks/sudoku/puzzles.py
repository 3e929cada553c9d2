"""Sudoku generation, solving, labelling and symmetry augmentation.

Grids are 81-length ``np.int8`` arrays in row-major order, with 0 for a blank
cell and 1..9 for digits.

The solver works on Python lists of 9-bit candidate masks (bit ``d - 1`` set
means digit ``d`` is still possible). Propagation applies the two classic
rules -- naked singles (a cell with one candidate) and hidden singles (a digit
with one possible cell in a unit) -- and the full solver adds depth-first
search on the cell with the fewest candidates. Pure Python on small ints is
much faster here than numpy, whose per-call overhead dominates for 81 cells.

Puzzle generation fills a random grid by randomized backtracking and then
removes clues in random order while the solution stays unique. Everything is
deterministic given the ``np.random.Generator`` passed in.
"""

from __future__ import annotations

import multiprocessing
import os
import random
import sys
import tempfile
import time
from typing import Sequence

import numpy as np

__all__ = [
    "NUM_CELLS",
    "NUM_AUGMENT_UNIFORMS",
    "to_string",
    "from_string",
    "solve",
    "solve_with_singles",
    "is_valid_solution",
    "generate_puzzle",
    "generate_dataset",
    "augment",
    "augment_batch",
    "augment_batch_from_uniforms",
    "permute_cells_from_uniforms",
    "difficulty_bucket",
    "deduction_rounds",
]

NUM_CELLS = 81
_ALL = 0x1FF  # all nine candidate bits

# --- Static board geometry -------------------------------------------------

_ROWS = [[r * 9 + c for c in range(9)] for r in range(9)]
_COLS = [[r * 9 + c for r in range(9)] for c in range(9)]
_BOXES = [
    [(br * 3 + r) * 9 + bc * 3 + c for r in range(3) for c in range(3)]
    for br in range(3)
    for bc in range(3)
]
_UNITS: list[list[int]] = _ROWS + _COLS + _BOXES
_ROW_OF = [i // 9 for i in range(81)]
_COL_OF = [i % 9 for i in range(81)]
_BOX_OF = [(i // 27) * 3 + (i % 9) // 3 for i in range(81)]
_PEERS: list[tuple[int, ...]] = [
    tuple(
        sorted(
            (set(_ROWS[_ROW_OF[i]]) | set(_COLS[_COL_OF[i]]) | set(_BOXES[_BOX_OF[i]]))
            - {i}
        )
    )
    for i in range(81)
]

# Lookup tables indexed by a 9-bit mask.
_POPCOUNT = [bin(m).count("1") for m in range(512)]
_BITS_OF: list[tuple[int, ...]] = [
    tuple(1 << b for b in range(9) if m >> b & 1) for m in range(512)
]
_DIGIT_OF_BIT = {1 << b: b + 1 for b in range(9)}

# --- String conversion -----------------------------------------------------


def to_string(grid: np.ndarray | Sequence[int]) -> str:
    """Returns the 81-character digit string of ``grid`` ('0' for blanks)."""
    arr = np.asarray(grid)
    if arr.shape != (NUM_CELLS,):
        raise ValueError(f"expected a grid of shape (81,), got shape {arr.shape}")
    return "".join(str(int(v)) for v in arr)


def from_string(s: str) -> np.ndarray:
    """Parses an 81-character string of digits, with '0' or '.' for blanks."""
    s = s.strip()
    if len(s) != NUM_CELLS:
        raise ValueError(f"sudoku string must have 81 characters, got {len(s)}: {s!r}")
    bad = sorted({ch for ch in s if not (ch.isdigit() or ch == ".")})
    if bad:
        raise ValueError(f"sudoku string has invalid characters {bad} (only 0-9 and '.' allowed)")
    digits = np.frombuffer(s.replace(".", "0").encode("ascii"), dtype=np.uint8) - ord("0")
    return digits.astype(np.int8)


# --- Solver core -------------------------------------------------------------


def _candidates_from_grid(values: Sequence[int]) -> list[int] | None:
    """Candidate masks for a grid of values, or None if two clues conflict."""
    row = [0] * 9
    col = [0] * 9
    box = [0] * 9
    for i, v in enumerate(values):
        if v:
            bit = 1 << (v - 1)
            r, c, b = _ROW_OF[i], _COL_OF[i], _BOX_OF[i]
            if (row[r] | col[c] | box[b]) & bit:
                return None
            row[r] |= bit
            col[c] |= bit
            box[b] |= bit
    cand = [0] * 81
    for i, v in enumerate(values):
        if v:
            cand[i] = 1 << (v - 1)
        else:
            cand[i] = _ALL & ~(row[_ROW_OF[i]] | col[_COL_OF[i]] | box[_BOX_OF[i]])
    return cand


def _propagate(cand: list[int], stack: list[int]) -> bool:
    """Applies naked and hidden singles in place until nothing changes.

    ``stack`` holds cells that became single but whose digit has not yet been
    eliminated from their peers. Returns False on a contradiction.
    """
    units = _UNITS
    peers = _PEERS
    while True:
        # Naked singles: eliminate each settled digit from the cell's peers.
        while stack:
            i = stack.pop()
            bit = cand[i]
            for p in peers[i]:
                c = cand[p]
                if c & bit:
                    c ^= bit
                    if not c:
                        return False
                    cand[p] = c
                    if not c & (c - 1):
                        stack.append(p)
        # Hidden singles: digits that fit in exactly one cell of a unit.
        for unit in units:
            once = twice = 0
            for i in unit:
                c = cand[i]
                twice |= once & c
                once |= c
            if once != _ALL:
                return False  # some digit has no place left in this unit
            hidden = once & ~twice
            if hidden:
                for i in unit:
                    c = cand[i]
                    h = c & hidden
                    if h and c != h:
                        if h & (h - 1):
                            return False  # one cell is the only home of two digits
                        cand[i] = h
                        stack.append(i)
        if not stack:
            return True


def _initial_state(values: Sequence[int]) -> list[int] | None:
    """Candidate masks after propagation, or None if the grid is contradictory."""
    cand = _candidates_from_grid(values)
    if cand is None:
        return None
    stack = [i for i in range(81) if not values[i] and not cand[i] & (cand[i] - 1)]
    if any(c == 0 for c in cand):
        return None
    return cand if _propagate(cand, stack) else None


def _search(
    cand: list[int], limit: int, out: list[list[int]], rand: random.Random | None = None
) -> None:
    """Depth-first search appending up to ``limit`` solved mask lists to ``out``.

    ``cand`` must already be propagated. With ``rand``, digits are tried in a
    random order (used to fill random grids).
    """
    best = -1
    best_n = 10
    for i in range(81):
        n = _POPCOUNT[cand[i]]
        if 1 < n < best_n:
            best, best_n = i, n
            if n == 2:
                break
    if best < 0:
        out.append(cand)
        return
    bits = _BITS_OF[cand[best]]
    if rand is not None:
        bits = list(bits)
        rand.shuffle(bits)
    for bit in bits:
        child = cand[:]
        child[best] = bit
        if _propagate(child, [best]):
            _search(child, limit, out, rand)
            if len(out) >= limit:
                return


def _masks_to_grid(cand: list[int]) -> np.ndarray:
    return np.array([_DIGIT_OF_BIT[c] for c in cand], dtype=np.int8)


def _as_values(grid: np.ndarray | Sequence[int]) -> list[int]:
    arr = np.asarray(grid)
    if arr.shape != (NUM_CELLS,):
        raise ValueError(f"expected a grid of shape (81,), got shape {arr.shape}")
    if arr.min() < 0 or arr.max() > 9:
        raise ValueError("grid values must be in 0..9")
    return arr.astype(np.int64).tolist()


def solve(grid: np.ndarray | Sequence[int], max_solutions: int = 2) -> list[np.ndarray]:
    """Returns up to ``max_solutions`` solutions of ``grid`` (empty if none).

    Use ``max_solutions=2`` to test uniqueness: the puzzle is proper iff exactly
    one solution comes back.
    """
    if max_solutions < 1:
        raise ValueError(f"max_solutions must be >= 1, got {max_solutions}")
    cand = _initial_state(_as_values(grid))
    if cand is None:
        return []
    out: list[list[int]] = []
    _search(cand, max_solutions, out)
    return [_masks_to_grid(c) for c in out]


def solve_with_singles(grid: np.ndarray | Sequence[int]) -> np.ndarray | None:
    """Solves using only naked and hidden singles; None if they do not suffice.

    A puzzle that this solves gets the difficulty label ``"singles"``, the rest
    ``"search"``.
    """
    cand = _initial_state(_as_values(grid))
    if cand is None or any(c & (c - 1) for c in cand):
        return None
    return _masks_to_grid(cand)


def is_valid_solution(grid: np.ndarray | Sequence[int]) -> bool:
    """True iff ``grid`` is a complete grid with every unit a permutation of 1..9."""
    arr = np.asarray(grid)
    if arr.shape != (NUM_CELLS,):
        return False
    values = arr.astype(np.int64)
    if values.min() < 1 or values.max() > 9:
        return False
    units = values[np.asarray(_UNITS)]  # [27, 9]
    return bool((np.sort(units, axis=1) == np.arange(1, 10)).all())


def first_valid_index(puzzle: np.ndarray | Sequence[int], candidates: np.ndarray) -> int | None:
    """Index of the first of ``candidates`` ([k, 81]) that keeps every clue of ``puzzle`` and is a valid
    complete grid (a check of the rules, not of a known solution); None when none is."""
    puzzle = np.asarray(puzzle)
    clues = puzzle != 0
    for index, grid in enumerate(np.asarray(candidates)):
        if (grid[clues] == puzzle[clues]).all() and is_valid_solution(grid):
            return index
    return None


def difficulty_bucket(num_clues: int) -> str:
    """Clue-count bucket used by the official eval: easy >= 40, medium 30-39, hard < 30."""
    if num_clues >= 40:
        return "easy"
    if num_clues >= 30:
        return "medium"
    return "hard"


# --- Generation --------------------------------------------------------------

_MAX_GENERATION_ATTEMPTS = 100


def _random_full_grid(rand: random.Random) -> list[int]:
    """A random complete grid (as digit values) by randomized backtracking."""
    out: list[list[int]] = []
    _search([_ALL] * 81, 1, out, rand)
    return [_DIGIT_OF_BIT[c] for c in out[0]]


def _removal_keeps_unique(values: list[int], cell: int, digit: int) -> bool:
    """Whether blanking ``cell`` (whose unique-solution digit is ``digit``) keeps uniqueness.

    The current puzzle has a unique solution, so the reduced puzzle is unique
    iff it has no solution with a different digit at ``cell``.
    """
    bit = 1 << (digit - 1)
    # Cheap path: the peers' clues already force the digit (a naked single).
    seen = 0
    for p in _PEERS[cell]:
        v = values[p]
        if v:
            seen |= 1 << (v - 1)
    if seen == _ALL ^ bit:
        return True
    values[cell] = 0
    cand = _candidates_from_grid(values)
    assert cand is not None  # a subset of consistent clues stays consistent
    cand[cell] &= ~bit
    if not cand[cell]:
        values[cell] = digit
        return True
    stack = [i for i in range(81) if not values[i] and not cand[i] & (cand[i] - 1)]
    values[cell] = digit
    if not _propagate(cand, stack):
        return True
    out: list[list[int]] = []
    _search(cand, 1, out)
    return not out


def generate_puzzle(
    rng: np.random.Generator, min_clues: int = 22, max_clues: int = 36
) -> tuple[np.ndarray, np.ndarray]:
    """Generates a (puzzle, solution) pair with a unique solution.

    A target clue count is drawn uniformly from ``[min_clues, max_clues]``;
    clues are removed in random order while the solution stays unique until the
    target is reached. If uniqueness blocks that, the (locally minimal) puzzle
    reached is kept when it has at most ``max_clues`` clues, else a new grid is
    tried. Deterministic given ``rng``.
    """
    if not 17 <= min_clues <= max_clues <= NUM_CELLS:
        raise ValueError(
            f"need 17 <= min_clues <= max_clues <= 81, got min_clues={min_clues}, "
            f"max_clues={max_clues}"
        )
    target = int(rng.integers(min_clues, max_clues + 1))
    # Python's Random is much cheaper per call than numpy's for tiny shuffles;
    # seeding it from ``rng`` keeps the whole procedure deterministic.
    rand = random.Random(int(rng.integers(0, 2**63)))
    for _ in range(_MAX_GENERATION_ATTEMPTS):
        solution = _random_full_grid(rand)
        values = solution[:]
        order = list(range(81))
        rand.shuffle(order)
        clues = 81
        for cell in order:
            if clues <= target:
                break
            if _removal_keeps_unique(values, cell, solution[cell]):
                values[cell] = 0
                clues -= 1
        if clues <= max_clues:
            return np.array(values, dtype=np.int8), np.array(solution, dtype=np.int8)
    raise RuntimeError(
        f"could not reach <= {max_clues} clues with a unique solution in "
        f"{_MAX_GENERATION_ATTEMPTS} attempts; raise max_clues"
    )


def _generate_chunk(
    args: tuple[Sequence[np.random.SeedSequence], int, int],
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Generates one puzzle per seed sequence (a top-level function so it pickles)."""
    seeds, min_clues, max_clues = args
    puzzles = np.zeros((len(seeds), NUM_CELLS), np.int8)
    solutions = np.zeros((len(seeds), NUM_CELLS), np.int8)
    needs_search = np.zeros((len(seeds),), bool)
    for k, ss in enumerate(seeds):
        puzzles[k], solutions[k] = generate_puzzle(np.random.default_rng(ss), min_clues, max_clues)
        needs_search[k] = solve_with_singles(puzzles[k]) is None
    return puzzles, solutions, needs_search


def _cache_path(cache_dir: str, n: int, seed: int, min_clues: int, max_clues: int) -> str:
    return os.path.join(cache_dir, f"sudoku_{seed}_{n}_{min_clues}_{max_clues}.npz")


def _save_npz_atomic(path: str, data: dict[str, np.ndarray]) -> None:
    """Writes to a temp file in the same directory, then renames it into place."""
    directory = os.path.dirname(path) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".sudoku_", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            np.savez(f, **data)
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.remove(tmp)
        raise


def generate_dataset(
    n: int,
    seed: int,
    min_clues: int = 22,
    max_clues: int = 36,
    cache_dir: str | None = None,
    num_workers: int = 1,
) -> dict[str, np.ndarray]:
    """Generates ``n`` puzzles; deterministic in (n, seed, min_clues, max_clues).

    Returns ``{"puzzle": [n,81] int8, "solution": [n,81] int8,
    "num_clues": [n] int16, "needs_search": [n] bool}``. Each puzzle has its
    own spawned seed, so results do not depend on ``num_workers``. With
    ``cache_dir``, the result is loaded from / saved to
    ``cache_dir/sudoku_{seed}_{n}_{min}_{max}.npz``.
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    path = _cache_path(cache_dir, n, seed, min_clues, max_clues) if cache_dir else None
    if path and os.path.exists(path):
        try:
            with np.load(path) as f:
                return {k: f[k] for k in ("puzzle", "solution", "num_clues", "needs_search")}
        except Exception as e:  # a damaged cache (a killed write of an older version, a full disk): rebuilt
            print(f"Sudoku cache {path} is unreadable ({type(e).__name__}: {e}); generating it again",
                  flush=True)

    seeds = np.random.SeedSequence(seed).spawn(n)
    chunk = max(1, min(256, n // max(1, 8 * num_workers)))
    jobs = [(seeds[i : i + chunk], min_clues, max_clues) for i in range(0, n, chunk)]
    report = n >= 2000
    next_report, done, start = n / 10, 0, time.perf_counter()
    parts = []

    def on_part(part: tuple[np.ndarray, np.ndarray, np.ndarray]) -> None:
        nonlocal done, next_report
        parts.append(part)
        done += len(part[0])
        if report and done >= next_report:
            rate = done / max(time.perf_counter() - start, 1e-9)
            print(f"sudoku: generated {done}/{n} puzzles ({rate:.0f} puzzles/s)", file=sys.stderr)
            next_report += n / 10

    if num_workers > 1 and len(jobs) > 1:
        # "spawn" avoids forking a parent that may hold JAX/thread state.
        ctx = multiprocessing.get_context("spawn")
        with ctx.Pool(num_workers) as pool:
            for part in pool.imap(_generate_chunk, jobs):
                on_part(part)
    else:
        for job in jobs:
            on_part(_generate_chunk(job))

    puzzles = np.concatenate([p[0] for p in parts]) if parts else np.zeros((0, 81), np.int8)
    data = {
        "puzzle": puzzles,
        "solution": (
            np.concatenate([p[1] for p in parts]) if parts else np.zeros((0, 81), np.int8)
        ),
        "num_clues": (puzzles != 0).sum(axis=1).astype(np.int16),
        "needs_search": (
            np.concatenate([p[2] for p in parts]) if parts else np.zeros((0,), bool)
        ),
    }
    if path:
        _save_npz_atomic(path, data)
    return data


def oversample_search(data: dict[str, np.ndarray], repeat: int) -> dict[str, np.ndarray]:
    """``data`` with every puzzle that needs search appearing ``repeat`` times (copies appended at the end).

    The copies are separate records, so the training pipeline gives each its own shuffle position and its own
    random symmetry; ``repeat=1`` returns ``data`` unchanged.
    """
    if isinstance(repeat, bool) or not isinstance(repeat, (int, np.integer)) or repeat < 1:
        raise ValueError(f"data.search_repeat must be an integer >= 1, got {repeat!r}")
    if repeat == 1:
        return data
    if "needs_search" not in data:
        raise ValueError("search_repeat > 1 needs the 'needs_search' labels (read CSVs with label_difficulty=True)")
    search = np.flatnonzero(np.asarray(data["needs_search"], bool))
    order = np.concatenate([np.arange(len(data["needs_search"])), np.tile(search, repeat - 1)])
    return {k: np.asarray(v)[order] for k, v in data.items()}


# --- Deduction order ---------------------------------------------------------

_UNIT_OF_CELL = np.array([[_ROW_OF[i], 9 + _COL_OF[i], 18 + _BOX_OF[i]] for i in range(81)])  # [81, 3]
_UNIT_CELLS = np.array(_UNITS)  # [27, 9]


def deduction_rounds(puzzles: np.ndarray, solutions: np.ndarray) -> np.ndarray:
    """[N, 81] int16: the round in which a human-style solver fills each cell (0 for clues).

    Round k fills, all at once, every blank that is a naked single (one digit left given the filled cells)
    or a hidden single (the only place for a digit in one of its units) given rounds < k. When nothing is a
    single (a puzzle that needs search), the round fills the blanks with the fewest candidates with their
    solution digits -- where a backtracking solver would branch; all of them, so that the rounds move with
    the cells under Sudoku symmetries -- and deduction resumes. Every blank gets a round. Used to corrupt
    cells that are deduced late before cells deduced early (`diffusion.ordered_noise_prob`).
    """
    puzzles = np.asarray(puzzles)
    solutions = np.asarray(solutions)
    if puzzles.ndim != 2 or puzzles.shape[1] != NUM_CELLS or solutions.shape != puzzles.shape:
        raise ValueError(f"expected puzzles and solutions of shape [N, 81], got {puzzles.shape} and "
                         f"{solutions.shape}")
    if solutions.size and not ((solutions >= 1) & (solutions <= 9)).all():
        raise ValueError("solutions must be complete grids (digits 1..9 in every cell)")
    grid = puzzles.astype(np.int64).copy()
    rounds = np.zeros(grid.shape, np.int16)
    k = 0
    while True:
        active = np.nonzero((grid == 0).any(1))[0]  # puzzles with blanks left
        if not active.size:
            return rounds
        k += 1
        g = grid[active]
        empty = g == 0  # [A, 81]
        onehot = np.eye(10, dtype=bool)[g][..., 1:]  # [A, 81, 9]; blanks are all False
        unit_has = onehot[:, _UNIT_CELLS].any(axis=2)  # [A, 27, 9]
        blocked = unit_has[:, _UNIT_OF_CELL].any(axis=2)  # [A, 81, 9]
        cand = empty[..., None] & ~blocked
        num_cand = cand.sum(-1)
        naked = empty & (num_cand == 1)
        places = cand[:, _UNIT_CELLS].sum(axis=2)  # [A, 27, 9]: where each digit can go in each unit
        hidden = (cand & (places[:, _UNIT_OF_CELL] == 1).any(axis=2)).any(-1)
        newly = naked | hidden
        stalled = ~newly.any(1)
        if stalled.any():  # guess: every blank with the fewest candidates (the same cells under any symmetry)
            fewest = np.where(empty, num_cand, 99).min(axis=1, keepdims=True)
            newly |= stalled[:, None] & empty & (num_cand == fewest)
        grid[active] = np.where(newly, solutions[active], g)
        rounds[active] = np.where(newly, k, rounds[active])


# --- Symmetry augmentation ---------------------------------------------------

# Uniform draws consumed per grid: 3 band + 9 row, 3 stack + 9 column,
# 9 digit and 1 transpose.
NUM_AUGMENT_UNIFORMS = 34


def _perm(u: np.ndarray) -> np.ndarray:
    """Random permutations from uniform keys along the last axis."""
    return np.argsort(u, axis=-1, kind="stable")


def _line_map(u: np.ndarray) -> np.ndarray:
    """[B, 12] uniforms -> [B, 9] map of new line -> old line (bands then lines in band)."""
    bsz = u.shape[0]
    band = _perm(u[:, :3])  # [B, 3]
    within = _perm(u[:, 3:12].reshape(bsz, 3, 3))  # [B, 3, 3]
    return (band[:, :, None] * 3 + within).reshape(bsz, 9)


def _cell_source(u: np.ndarray) -> np.ndarray:
    """[B, 81]: the old cell each new cell comes from, under the symmetry chosen by ``u``."""
    row_map = _line_map(u[:, 0:12])
    col_map = _line_map(u[:, 12:24])
    src = row_map[:, :, None] * 9 + col_map[:, None, :]  # [B, 9, 9]: new (r, c) <- old cell
    transpose = u[:, 33] < 0.5
    return np.where(transpose[:, None, None], src.transpose(0, 2, 1), src).reshape(u.shape[0], 81)


def permute_cells_from_uniforms(cells: np.ndarray, u: np.ndarray) -> np.ndarray:
    """Moves per-cell values [B, 81] (e.g. :func:`deduction_rounds`) as
    :func:`augment_batch_from_uniforms` moves the cells for the same ``u``, without relabelling digits."""
    return np.take_along_axis(np.asarray(cells), _cell_source(u), 1)


def augment_batch_from_uniforms(
    puzzles: np.ndarray, solutions: np.ndarray, u: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Applies one symmetry per row, chosen by uniforms ``u`` [B, NUM_AUGMENT_UNIFORMS].

    The same cell permutation and digit relabelling is applied to a puzzle and
    its solution, so clues stay consistent; blanks (0) stay blank.
    """
    puzzles = np.asarray(puzzles)
    solutions = np.asarray(solutions)
    bsz = puzzles.shape[0]
    if puzzles.shape != (bsz, NUM_CELLS) or solutions.shape != (bsz, NUM_CELLS):
        raise ValueError(
            f"expected puzzles and solutions of shape [B, 81], got {puzzles.shape} and "
            f"{solutions.shape}"
        )
    if u.shape != (bsz, NUM_AUGMENT_UNIFORMS):
        raise ValueError(
            f"expected uniforms of shape [{bsz}, {NUM_AUGMENT_UNIFORMS}], got {u.shape}"
        )
    src = _cell_source(u)
    # Digit relabelling table with 0 (blank) fixed.
    lut = np.zeros((bsz, 10), dtype=puzzles.dtype)
    lut[:, 1:] = _perm(u[:, 24:33]) + 1
    new_puzzles = np.take_along_axis(lut, np.take_along_axis(puzzles, src, 1).astype(np.intp), 1)
    new_solutions = np.take_along_axis(
        lut.astype(solutions.dtype), np.take_along_axis(solutions, src, 1).astype(np.intp), 1
    )
    return new_puzzles, new_solutions


def augment_batch(
    puzzles: np.ndarray, solutions: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Applies an independent random Sudoku symmetry to each row of [B, 81] arrays."""
    u = rng.random((np.asarray(puzzles).shape[0], NUM_AUGMENT_UNIFORMS))
    return augment_batch_from_uniforms(puzzles, solutions, u)


def augment(
    puzzle: np.ndarray, solution: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """Applies a random element of the Sudoku symmetry group to one pair.

    The group is generated by digit relabelling, row permutations within bands,
    band permutations, column permutations within stacks, stack permutations
    and transposition.
    """
    p, s = augment_batch(np.asarray(puzzle)[None], np.asarray(solution)[None], rng)
    return p[0], s[0]
