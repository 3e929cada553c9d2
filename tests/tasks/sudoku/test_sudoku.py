"""Tests for the Sudoku data layer: generator, solver, formats, task encoding, pipeline."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

from dgemma.tasks.sudoku import puzzles as sudoku, formats as sudoku_formats, digits as sudoku_task

# A well-known puzzle that needs search (singles alone stall on it).
HARD = "800000000003600000070090200050007000000045700000100030001000068008500010090000400"
# The Wikipedia example puzzle: naked/hidden singles solve it completely.
EASY = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
EASY_SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


@pytest.fixture(scope="module")
def dataset() -> dict[str, np.ndarray]:
    return sudoku.generate_dataset(24, seed=0)


# --- Grid helpers --------------------------------------------------------------


def test_string_round_trip_and_dots():
    grid = sudoku.from_string(EASY)
    assert grid.dtype == np.int8 and grid.shape == (81,)
    assert sudoku.to_string(grid) == EASY
    assert (sudoku.from_string(EASY.replace("0", ".")) == grid).all()


@pytest.mark.parametrize(
    "bad, message",
    [(EASY[:80], "81 characters, got 80"), (EASY[:80] + "x", "invalid characters ['x']")],
)
def test_from_string_errors(bad, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        sudoku.from_string(bad)


def test_is_valid_solution_and_buckets():
    solution = sudoku.from_string(EASY_SOLUTION)
    assert sudoku.is_valid_solution(solution)
    swapped = solution.copy()
    swapped[[0, 1]] = swapped[[1, 0]]  # breaks two columns and keeps rows valid
    assert not sudoku.is_valid_solution(swapped)
    assert not sudoku.is_valid_solution(sudoku.from_string(EASY))  # has blanks
    assert [sudoku.difficulty_bucket(n) for n in (17, 29, 30, 39, 40, 80)] == [
        "hard", "hard", "medium", "medium", "easy", "easy"
    ]


# --- Solvers -------------------------------------------------------------------


def test_first_valid_index_checks_clues_and_rules():
    puzzle = sudoku.from_string(EASY)
    solution = sudoku.from_string(EASY_SOLUTION)
    relabelled = (solution % 9) + 1  # obeys the rules, breaks the clues
    broken = solution.copy()
    broken[[0, 1]] = broken[[1, 0]]  # keeps the digits, breaks a column (and maybe a clue)
    broken_blank = solution.copy()
    broken_blank[np.flatnonzero(puzzle == 0)[0]] = 0  # one blank left unfilled
    assert sudoku.is_valid_solution(relabelled)
    assert sudoku.first_valid_index(puzzle, np.stack([relabelled, broken, broken_blank, solution])) == 3
    assert sudoku.first_valid_index(puzzle, np.stack([solution, relabelled])) == 0
    assert sudoku.first_valid_index(puzzle, np.stack([broken, relabelled, broken_blank])) is None  # none valid


def test_solve_known_puzzles():
    (easy,) = sudoku.solve(sudoku.from_string(EASY))
    assert sudoku.to_string(easy) == EASY_SOLUTION
    hard_solutions = sudoku.solve(sudoku.from_string(HARD))
    assert len(hard_solutions) == 1
    hard = sudoku.from_string(HARD)
    assert sudoku.is_valid_solution(hard_solutions[0])
    assert (hard_solutions[0][hard != 0] == hard[hard != 0]).all()


def test_solve_counts_multiple_and_no_solutions():
    assert len(sudoku.solve(np.zeros(81, np.int8), max_solutions=3)) == 3
    conflicting = np.zeros(81, np.int8)
    conflicting[0] = conflicting[1] = 5  # same digit twice in a row
    assert sudoku.solve(conflicting) == []
    assert sudoku.solve_with_singles(conflicting) is None


def test_singles_solver():
    assert sudoku.to_string(sudoku.solve_with_singles(sudoku.from_string(EASY))) == EASY_SOLUTION
    assert sudoku.solve_with_singles(sudoku.from_string(HARD)) is None


# --- Generation ----------------------------------------------------------------


def test_generated_puzzles_are_proper(dataset):
    assert dataset["puzzle"].shape == (24, 81) and dataset["puzzle"].dtype == np.int8
    assert dataset["solution"].dtype == np.int8
    assert dataset["num_clues"].dtype == np.int16 and dataset["needs_search"].dtype == bool
    for puzzle, solution, clues, needs_search in zip(
        dataset["puzzle"], dataset["solution"], dataset["num_clues"], dataset["needs_search"]
    ):
        solutions = sudoku.solve(puzzle, max_solutions=2)
        assert len(solutions) == 1, "puzzle must have a unique solution"
        assert (solutions[0] == solution).all()
        assert sudoku.is_valid_solution(solution)
        given = puzzle != 0
        assert (puzzle[given] == solution[given]).all()
        assert clues == given.sum() and 22 <= clues <= 36
        singles = sudoku.solve_with_singles(puzzle)
        # The singles solver agrees with the full solver whenever it succeeds.
        assert needs_search == (singles is None)
        if singles is not None:
            assert (singles == solution).all()
    # Both labels and a spread of clue counts show up even in a small sample.
    assert dataset["needs_search"].any() and not dataset["needs_search"].all()
    assert dataset["num_clues"].max() - dataset["num_clues"].min() >= 5


def test_generate_puzzle_exact_target_and_determinism():
    puzzle, solution = sudoku.generate_puzzle(np.random.default_rng(7), 30, 30)
    assert (puzzle != 0).sum() == 30
    again = sudoku.generate_puzzle(np.random.default_rng(7), 30, 30)
    assert (again[0] == puzzle).all() and (again[1] == solution).all()
    with pytest.raises(ValueError, match="min_clues"):
        sudoku.generate_puzzle(np.random.default_rng(0), 10, 20)


def test_generate_dataset_determinism(dataset):
    prefix = sudoku.generate_dataset(24, seed=0)
    for key in dataset:
        np.testing.assert_array_equal(prefix[key], dataset[key])
    other = sudoku.generate_dataset(4, seed=1)
    assert not (other["puzzle"] == dataset["puzzle"][:4]).all()
    # Per-puzzle seeds: the worker count must not change the data.
    parallel = sudoku.generate_dataset(4, seed=1, num_workers=2)
    for key in other:
        np.testing.assert_array_equal(parallel[key], other[key])


def test_cache_round_trip(tmp_path, monkeypatch):
    data = sudoku.generate_dataset(3, seed=5, min_clues=25, max_clues=30, cache_dir=str(tmp_path))
    assert os.listdir(tmp_path) == ["sudoku_5_3_25_30.npz"]  # no leftover temp files

    def fail(*args, **kwargs):
        raise AssertionError("should have loaded from the cache")

    monkeypatch.setattr(sudoku, "_generate_chunk", fail)
    cached = sudoku.generate_dataset(3, seed=5, min_clues=25, max_clues=30, cache_dir=str(tmp_path))
    for key in data:
        assert cached[key].dtype == data[key].dtype
        np.testing.assert_array_equal(cached[key], data[key])


def test_damaged_cache_is_generated_again(tmp_path, capsys):
    data = sudoku.generate_dataset(3, seed=5, min_clues=25, max_clues=30, cache_dir=str(tmp_path))
    path = tmp_path / "sudoku_5_3_25_30.npz"
    path.write_bytes(path.read_bytes()[:500])
    again = sudoku.generate_dataset(3, seed=5, min_clues=25, max_clues=30, cache_dir=str(tmp_path))
    assert f"Sudoku cache {path} is unreadable" in capsys.readouterr().out
    for key in data:
        np.testing.assert_array_equal(again[key], data[key])
    with np.load(path) as f:  # and the cache is whole again
        np.testing.assert_array_equal(f["puzzle"], data["puzzle"])


# --- Augmentation --------------------------------------------------------------


def test_augment_keeps_validity_and_changes_grids(dataset):
    rng = np.random.default_rng(0)
    puzzle, solution = dataset["puzzle"][0], dataset["solution"][0]
    aug_p, aug_s = sudoku.augment(puzzle, solution, rng)
    assert sudoku.is_valid_solution(aug_s)
    assert not (aug_s == solution).all()
    (solved,) = sudoku.solve(aug_p)  # symmetries preserve uniqueness
    assert (solved == aug_s).all()

    puzzles, solutions = sudoku.augment_batch(dataset["puzzle"], dataset["solution"], rng)
    assert puzzles.dtype == np.int8 and puzzles.shape == dataset["puzzle"].shape
    for p, s, orig_p, orig_s in zip(puzzles, solutions, dataset["puzzle"], dataset["solution"]):
        assert sudoku.is_valid_solution(s)
        given = p != 0
        assert (p[given] == s[given]).all()
        assert given.sum() == (orig_p != 0).sum()
        assert not (s == orig_s).all()
        # Digit relabelling aside, the multiset of clue digits keeps its shape.
        counts = np.bincount(p, minlength=10)[1:]
        assert sorted(counts) == sorted(np.bincount(orig_p, minlength=10)[1:])


def test_augment_batch_covers_transpose_and_is_deterministic(dataset):
    u = np.full((1, sudoku.NUM_AUGMENT_UNIFORMS), 0.9)
    u[0, :33] = np.arange(33) / 33  # identity permutations everywhere
    p, s = sudoku.augment_batch_from_uniforms(dataset["puzzle"][:1], dataset["solution"][:1], u)
    np.testing.assert_array_equal(s, dataset["solution"][:1])  # no transpose: identity
    u[0, 33] = 0.1
    p, s = sudoku.augment_batch_from_uniforms(dataset["puzzle"][:1], dataset["solution"][:1], u)
    np.testing.assert_array_equal(s[0].reshape(9, 9), dataset["solution"][0].reshape(9, 9).T)
    a = sudoku.augment_batch(dataset["puzzle"], dataset["solution"], np.random.default_rng(3))
    b = sudoku.augment_batch(dataset["puzzle"], dataset["solution"], np.random.default_rng(3))
    np.testing.assert_array_equal(a[0], b[0])


# --- CSV formats ---------------------------------------------------------------


def test_csv_round_trip_and_bryanpark_header(tmp_path, dataset):
    path = tmp_path / "out.csv"
    sudoku_formats.write_csv(str(path), dataset)
    assert path.read_text().splitlines()[0] == "puzzle,solution"
    data = sudoku_formats.read_csv(str(path))
    for key in dataset:
        np.testing.assert_array_equal(data[key], dataset[key])
    assert len(sudoku_formats.read_csv(str(path), limit=5)["puzzle"]) == 5

    other = tmp_path / "bryanpark.csv"
    hard_solution = sudoku.to_string(sudoku.solve(sudoku.from_string(HARD))[0])  # (rows are checked: a real one)
    other.write_text(f"id,quizzes,solutions\n7,{EASY},{EASY_SOLUTION}\n8,{HARD},{hard_solution}\n")
    data = sudoku_formats.read_csv(str(other))
    assert sudoku.to_string(data["puzzle"][0]) == EASY
    assert sudoku.to_string(data["solution"][0]) == EASY_SOLUTION
    assert data["num_clues"].tolist() == [81 - EASY.count("0"), 81 - HARD.count("0")]
    assert data["needs_search"].tolist() == [False, True]
    assert "needs_search" not in sudoku_formats.read_csv(str(other), label_difficulty=False)


def test_csv_errors(tmp_path):
    missing = tmp_path / "nope.csv"
    with pytest.raises(ValueError, match="nope.csv: sudoku CSV file not found"):
        sudoku_formats.read_csv(str(missing))
    bad_header = tmp_path / "header.csv"
    bad_header.write_text(f"a,b\n{EASY},{EASY_SOLUTION}\n")
    message = "header.csv: unknown header 'a,b'; expected puzzle,solution or quizzes,solutions"
    with pytest.raises(ValueError, match=message):
        sudoku_formats.read_csv(str(bad_header))
    bad_row = tmp_path / "row.csv"
    bad_row.write_text(f"puzzle,solution\n{EASY},{EASY_SOLUTION}\n{EASY[:-1]},{EASY_SOLUTION}\n")
    message = "row.csv: line 3: column 'puzzle' must be 81 digits, got 80"
    with pytest.raises(ValueError, match=message):
        sudoku_formats.read_csv(str(bad_row))


# --- Task encoding and scoring -------------------------------------------------


def test_encode_example_layout():
    puzzle, solution = sudoku.from_string(EASY), sudoku.from_string(EASY_SOLUTION)
    ex = sudoku_task.encode_example(puzzle, solution, prompt_len=88, canvas_len=90)
    assert ex["prompt"].dtype == np.int32 and ex["prompt"].shape == (88,)
    assert ex["prompt"][0] == sudoku_task.BOS_ID == 2
    assert ex["prompt"][1:82].tolist() == [3 + int(ch) for ch in EASY]
    assert (ex["prompt"][82:] == sudoku_task.PAD_ID).all() and sudoku_task.PAD_ID == 0
    assert ex["canvas"].shape == (90,) and ex["canvas"].dtype == np.int32
    assert ex["canvas"][:81].tolist() == [3 + int(ch) for ch in EASY_SOLUTION]
    assert (ex["canvas"][81:] == sudoku_task.EOS_ID).all() and sudoku_task.EOS_ID == 1
    assert ex["canvas_mask"].dtype == bool and ex["canvas_mask"].all()
    assert sudoku_task.digit_to_id(0) == 3 and sudoku_task.digit_to_id(9) == 12
    assert sudoku_task.DIGIT_VOCAB_SIZE == 13

    puzzles, solutions = np.stack([puzzle, puzzle]), np.stack([solution, solution])
    batch = sudoku_task.encode_batch(puzzles, solutions, 88, 90)
    for key in ex:
        np.testing.assert_array_equal(batch[key][1], ex[key])
    with pytest.raises(ValueError, match="prompt_len must be >= 82"):
        sudoku_task.encode_example(puzzle, solution, prompt_len=81, canvas_len=90)
    with pytest.raises(ValueError, match="canvas_len must be >= 81"):
        sudoku_task.encode_example(puzzle, solution, prompt_len=82, canvas_len=80)


def test_decode_canvas_maps_non_digits_to_blank():
    tokens = np.array([3 + int(ch) for ch in EASY_SOLUTION] + [1, 1])
    assert sudoku_task.decode_canvas(tokens) == EASY_SOLUTION
    tokens[:4] = [0, 1, 2, 13]  # PAD, EOS, BOS, an out-of-vocab (e.g. mask) id
    assert sudoku_task.decode_canvas(tokens) == "0000" + EASY_SOLUTION[4:]


def _brute_force_score(puzzles, solutions, predictions):
    exact = clues_kept_all = 0
    blank_total = blank_right = clue_total = clue_right = 0
    for p, s, q in zip(puzzles, solutions, predictions):
        exact += all(int(a) == int(b) for a, b in zip(q, s))
        kept = True
        for cell in range(81):
            if p[cell] == 0:
                blank_total += 1
                blank_right += q[cell] == s[cell]
            else:
                clue_total += 1
                clue_right += q[cell] == p[cell]
                kept &= bool(q[cell] == p[cell])
        clues_kept_all += kept
    n = len(puzzles)
    return {
        "accuracy": exact / n,
        "cell_accuracy": blank_right / blank_total,
        "clue_preservation": clue_right / clue_total,
        "exact_clue_preservation": clues_kept_all / n,
    }


def test_score_matches_brute_force():
    puzzle, solution = sudoku.from_string(EASY), sudoku.from_string(EASY_SOLUTION)
    blanks = np.flatnonzero(puzzle == 0)
    clues = np.flatnonzero(puzzle != 0)
    perfect = solution.copy()
    wrong_blank = solution.copy()
    wrong_blank[blanks[:3]] = 0  # three blanks left unfilled
    broken_clue = solution.copy()
    broken_clue[clues[0]] = solution[clues[0]] % 9 + 1  # one clue overwritten
    copy_of_puzzle = puzzle.copy()  # only the clues, nothing filled
    predictions = np.stack([perfect, wrong_blank, broken_clue, copy_of_puzzle])
    puzzles = np.stack([puzzle] * 4)
    solutions = np.stack([solution] * 4)
    got = sudoku_task.score(puzzles, solutions, predictions)
    expected = _brute_force_score(puzzles, solutions, predictions)
    assert got.keys() == expected.keys()
    for key in expected:
        assert got[key] == pytest.approx(expected[key]), key
    assert got["accuracy"] == 0.25 and got["exact_clue_preservation"] == 0.75


# --- Grain pipeline ------------------------------------------------------------


def _take(it, n):
    return [next(it) for _ in range(n)]


def test_pipeline_resume_gives_identical_batches(dataset):
    ds = sudoku_task.make_train_dataset(
        dataset, batch_size=5, prompt_len=84, canvas_len=88, seed=11
    )
    it = iter(ds)
    first = _take(it, 3)
    assert first[0]["prompt"].shape == (5, 84) and first[0]["canvas"].shape == (5, 88)
    assert first[0]["num_clues"].dtype == np.int16 and first[0]["needs_search"].dtype == bool
    state = it.get_state()
    expected = _take(it, 8)  # crosses an epoch boundary (24 records)
    resumed = iter(ds)
    resumed.set_state(state)
    got = _take(resumed, 8)
    for a, b in zip(expected, got):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])
    # Augmented examples are valid and consistent with their clues.
    for batch in expected:
        puzzles = batch["prompt"][:, 1:82] - 3
        solutions = batch["canvas"][:, :81] - 3
        assert all(sudoku.is_valid_solution(s) for s in solutions)
        assert ((puzzles == 0) | (puzzles == solutions)).all()
        np.testing.assert_array_equal(batch["num_clues"], (puzzles != 0).sum(1))
    # Same seed, fresh iterator: same stream.
    again = _take(iter(ds), 3)
    for a, b in zip(first, again):
        np.testing.assert_array_equal(a["canvas"], b["canvas"])


def test_pipeline_shards_are_disjoint_and_cover_each_epoch(dataset):
    index = {sudoku.to_string(p): i for i, p in enumerate(dataset["puzzle"])}
    seen = []
    for shard in range(2):
        ds = sudoku_task.make_train_dataset(
            dataset, batch_size=4, prompt_len=82, canvas_len=81, seed=3, augment=False,
            shard_index=shard, shard_count=2,
        )
        it = iter(ds)
        epochs = [
            [index[sudoku.to_string(row[1:82] - 3)] for b in _take(it, 3) for row in b["prompt"]]
            for _ in range(2)
        ]
        # Each epoch of a shard (12 records = 3 batches) visits every record once,
        # in a different order per epoch.
        assert sorted(epochs[0]) == sorted(epochs[1]) and len(set(epochs[0])) == 12
        assert epochs[0] != epochs[1]
        seen.append(set(epochs[0]))
    assert not seen[0] & seen[1]
    assert seen[0] | seen[1] == set(range(24))


def test_pipeline_augmentation_differs_across_epochs(dataset):
    data = {k: v[:2] for k, v in dataset.items()}
    ds = sudoku_task.make_train_dataset(data, batch_size=2, prompt_len=82, canvas_len=81, seed=0)
    it = iter(ds)
    batches = _take(it, 4)
    canvases = {tuple(row) for b in batches for row in b["canvas"]}
    assert len(canvases) == 8  # 2 records x 4 epochs, all distinct symmetries


# --- Deduction order -------------------------------------------------------------


def _singles_of(grid: list[int]) -> set[int]:
    """Brute force: blanks of `grid` that are a naked single or a hidden single, cell by cell."""
    def peers_values(i):
        r, c = divmod(i, 9)
        cells = {r * 9 + k for k in range(9)} | {k * 9 + c for k in range(9)}
        cells |= {(r // 3 * 3 + a) * 9 + c // 3 * 3 + b for a in range(3) for b in range(3)}
        return {grid[j] for j in cells if j != i}

    cand = {i: set(range(1, 10)) - peers_values(i) for i in range(81) if not grid[i]}
    singles = {i for i, ds in cand.items() if len(ds) == 1}
    units = ([[r * 9 + k for k in range(9)] for r in range(9)] + [[k * 9 + c for k in range(9)] for c in range(9)]
             + [[(br * 3 + a) * 9 + bc * 3 + b for a in range(3) for b in range(3)]
                for br in range(3) for bc in range(3)])
    for unit in units:
        for d in range(1, 10):
            homes = [i for i in unit if i in cand and d in cand[i]]
            if len(homes) == 1:
                singles.add(homes[0])
    return singles


def test_deduction_rounds_follow_singles_and_guess_only_when_stuck(dataset):
    rounds = sudoku.deduction_rounds(dataset["puzzle"], dataset["solution"])
    assert rounds.shape == (len(dataset["puzzle"]), 81)
    for puzzle, solution, r, needs_search in zip(dataset["puzzle"], dataset["solution"], rounds,
                                                 dataset["needs_search"]):
        np.testing.assert_array_equal(r == 0, puzzle != 0)  # clues first, every blank later
        grid, guesses = puzzle.astype(int).tolist(), 0
        for k in range(1, int(r.max()) + 1):
            filled = set(np.nonzero(r == k)[0].tolist())
            singles = _singles_of(grid)
            if singles:
                assert filled == singles, k  # every single of the grid so far, nothing else
            else:  # a guess: the blanks with the fewest candidates get their solution digits
                guesses += 1
                counts = {i: len(set(range(1, 10)) - {grid[j] for j in range(81) if j != i and (
                    j // 9 == i // 9 or j % 9 == i % 9 or (j // 27, j % 9 // 3) == (i // 27, i % 9 // 3))})
                    for i in range(81) if not grid[i]}
                assert filled == {i for i, n in counts.items() if n == min(counts.values())}, k
            for i in filled:
                grid[i] = int(solution[i])
        assert grid == solution.tolist()
        assert (guesses > 0) == bool(needs_search)  # the solver's own label: singles suffice or not


def test_deduction_rounds_reject_incomplete_solutions(dataset):
    with pytest.raises(ValueError, match="complete grids"):
        sudoku.deduction_rounds(dataset["puzzle"][:1], dataset["puzzle"][:1])


def test_deduction_rounds_move_with_symmetries(dataset):
    rng = np.random.default_rng(5)
    u = rng.random((len(dataset["puzzle"]), sudoku.NUM_AUGMENT_UNIFORMS))
    puzzles, solutions = sudoku.augment_batch_from_uniforms(dataset["puzzle"], dataset["solution"], u)
    moved = sudoku.permute_cells_from_uniforms(sudoku.deduction_rounds(dataset["puzzle"], dataset["solution"]), u)
    np.testing.assert_array_equal(sudoku.deduction_rounds(puzzles, solutions), moved)
    # The same cells move: clue positions land where the augmented puzzle has its clues.
    np.testing.assert_array_equal(
        sudoku.permute_cells_from_uniforms(dataset["puzzle"] != 0, u), puzzles != 0)


def test_pipeline_noise_rank_is_the_rounds_of_the_augmented_puzzle(dataset):
    ds = sudoku_task.make_train_dataset(dataset, batch_size=6, prompt_len=82, canvas_len=84, seed=2,
                                        noise_rank=True)
    plain = sudoku_task.make_train_dataset(dataset, batch_size=6, prompt_len=82, canvas_len=84, seed=2)
    for batch, without in zip(_take(iter(ds), 5), _take(iter(plain), 5)):
        np.testing.assert_array_equal(batch["canvas"], without["canvas"])  # same stream, one more key
        assert "noise_rank" not in without and batch["noise_rank"].shape == (6, 84)
        puzzles = (batch["prompt"][:, 1:82] - 3).astype(np.int8)
        solutions = (batch["canvas"][:, :81] - 3).astype(np.int8)
        np.testing.assert_array_equal(batch["noise_rank"][:, :81], sudoku.deduction_rounds(puzzles, solutions))
        assert (batch["noise_rank"][:, 81:] == 0).all()  # EOS fill: known from the start


def test_oversample_search_repeats_exactly_the_search_puzzles(dataset):
    assert sudoku.oversample_search(dataset, 1) is dataset
    search = dataset["needs_search"]
    assert 0 < search.sum() < len(search)  # the fixture has both kinds, so the test can tell them apart
    out = sudoku.oversample_search(dataset, 3)
    assert out.keys() == dataset.keys()
    assert len(out["puzzle"]) == len(search) + 2 * search.sum()
    # Every original record stays; each search puzzle appears 3 times, each singles puzzle once.
    keys = [p.tobytes() for p in out["puzzle"]]
    for puzzle, needs_search in zip(dataset["puzzle"], search):
        assert keys.count(puzzle.tobytes()) == (3 if needs_search else 1)
    # Rows stay aligned across the arrays.
    for k in range(len(out["puzzle"])):
        assert ((out["puzzle"][k] == 0) | (out["puzzle"][k] == out["solution"][k])).all()
        assert out["num_clues"][k] == (out["puzzle"][k] != 0).sum()
        assert out["needs_search"][k] == (sudoku.solve_with_singles(out["puzzle"][k]) is None)
    # The copies go through the pipeline as separate records, with their own symmetries.
    batch = next(iter(sudoku_task.make_train_dataset(out, batch_size=len(out["puzzle"]), prompt_len=84,
                                                     canvas_len=88, seed=3)))
    assert batch["needs_search"].sum() == 3 * search.sum()
    assert len({c.tobytes() for c in batch["canvas"]}) == len(out["puzzle"])


@pytest.mark.parametrize("bad", [0, -2, 1.5, True, "2"])
def test_oversample_search_rejects_bad_repeat(dataset, bad):
    with pytest.raises(ValueError, match="search_repeat must be an integer >= 1"):
        sudoku.oversample_search(dataset, bad)
