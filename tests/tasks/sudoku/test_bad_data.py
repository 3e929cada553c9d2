"""Data and puzzles that break the rules are refused in one line (or skipped and counted), before any sampling."""

import os
import re
import subprocess
import sys

import jax
import numpy as np
import pytest

from dgemma import model
from dgemma.checkpoints import save_model
from dgemma.config import small_dense
from dgemma.tasks.sudoku import digits, formats
from dgemma.tasks.sudoku import puzzles as sudoku
from tests.script_loader import load_script

CLASSIC = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
SOLVED = "".join(map(str, sudoku.solve(sudoku.from_string(CLASSIC))[0]))
TWO_FIVES = "55" + CLASSIC[2:]  # row 1 starts 5 5
# Keeps the rules, yet row 1 misses only a 9 and column 9 already has one: no solution.
NO_SOLUTION = "123456780" + "000000009" + "0" * 63
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def _write_csv(path, rows):
  path.write_text("puzzle,solution\n" + "".join(f"{p},{s}\n" for p, s in rows))
  return path


BAD_ROWS = [  # (puzzle, solution, the problem named)
    (TWO_FIVES, SOLVED, "the puzzle breaks the rules: two 5s in row 1"),
    (CLASSIC, SOLVED[:80] + "0", "the solution has 1 blank cell"),
    (CLASSIC, SOLVED[1] + SOLVED[0] + SOLVED[2:], "the solution breaks the rules: two "),
    (CLASSIC, SOLVED.replace("5", "x").replace("3", "5").replace("x", "3"),
     "the solution contradicts the clue at row 1, column 1 (clue 5, solution 3)"),
]


@pytest.mark.parametrize("puzzle, solution, problem", BAD_ROWS)
def test_a_bad_csv_row_refuses_the_file_naming_its_line(tmp_path, puzzle, solution, problem):
  path = _write_csv(tmp_path / "bad.csv", [(CLASSIC, SOLVED), (puzzle, solution), (CLASSIC, SOLVED)])
  with pytest.raises(ValueError, match=f"^{re.escape(f'{path}: line 3: {problem}')}"):
    formats.read_csv(str(path))
  data, skipped = formats.read_checked_csv(str(path), skip_bad_rows=True)
  assert skipped == 1 and len(data["puzzle"]) == 2
  np.testing.assert_array_equal(data["solution"][1], sudoku.from_string(SOLVED))


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
  config = small_dense(digits.DIGIT_VOCAB_SIZE, width=16, num_layers=1, num_heads=2, canvas_length=81)
  path = tmp_path_factory.mktemp("bad") / "ckpt"
  save_model(str(path), config, model.init_params(config, jax.random.key(0)),
             {"task": {"name": "sudoku_digits", "prompt_len": 82}})
  return path


def _main(script, args, capsys):
  rc = load_script(script).main([os.path.basename(script), *args])
  captured = capsys.readouterr()
  return rc, captured.out, captured.err


def test_eval_refuses_or_skips_bad_rows(ckpt, tmp_path, capsys):
  path = _write_csv(tmp_path / "bad.csv", [(CLASSIC, SOLVED), (CLASSIC, SOLVED[:80] + "0")])
  rc, out, err = _main("scripts/eval_sudoku.py", [f"--ckpt={ckpt}", f"--data={path}", "--max_steps=1"], capsys)
  assert rc == 1 and err == f"error: {path}: line 3: the solution has 1 blank cell (skip such rows with " \
                            "skip_bad_rows)\n" and "block diffusion" not in out
  rc, out, err = _main("scripts/eval_sudoku.py", [f"--ckpt={ckpt}", f"--data={path}", "--max_steps=1",
                                                  "--skip_bad_rows"], capsys)
  assert rc == 0, err
  assert f"{path}: skipped 1 row(s) that break the rules; evaluating 1" in out


def test_eval_checks_npz_rows(ckpt, tmp_path, capsys):
  puzzles = np.stack([sudoku.from_string(CLASSIC)] * 3)
  solutions = np.stack([sudoku.from_string(SOLVED)] * 3)
  bad = solutions.copy()
  bad[2] = sudoku.from_string(SOLVED.replace("5", "x").replace("3", "5").replace("x", "3"))  # 3 <-> 5: a clue wrong
  np.savez(tmp_path / "clue.npz", puzzle=puzzles, solution=bad)
  out_of_range = solutions.copy()
  out_of_range[1, 4] = 12
  np.savez(tmp_path / "range.npz", puzzle=puzzles, solution=out_of_range)
  for name, message in (("clue.npz", "row 2: the solution contradicts the clue at row 1, column 1 (clue 5, "
                                     "solution 3)"),
                        ("range.npz", "'solution' row 1: value 12 at cell 4 is not a digit 0-9")):
    rc, out, err = _main("scripts/eval_sudoku.py", [f"--ckpt={ckpt}", f"--data={tmp_path / name}"], capsys)
    assert rc == 1 and err.startswith(f"error: {tmp_path / name}: {message}") and err.count("\n") == 1, err
  evaluator = load_script("scripts/eval_sudoku.py")
  data = evaluator.load_data(str(tmp_path / "clue.npz"), skip_bad_rows=True)
  assert data["skipped"] == 1 and len(data["puzzle"]) == 2


def test_eval_checks_json_out_before_the_run(ckpt, tmp_path, capsys):
  path = _write_csv(tmp_path / "ok.csv", [(CLASSIC, SOLVED)])
  rc, out, err = _main("scripts/eval_sudoku.py", [f"--ckpt={ckpt}", f"--data={path}",
                                                  f"--json_out={tmp_path}/no/such/dir/r.json"], capsys)
  assert rc == 1 and err == f"error: --json_out={tmp_path}/no/such/dir/r.json: directory {tmp_path}/no/such/dir " \
                            "does not exist\n"
  assert "block diffusion" not in out  # refused before the run


@pytest.mark.parametrize("prompt, message", [
    (TWO_FIVES, "the puzzle breaks the rules: two 5s in row 1"),
    (NO_SOLUTION, "the puzzle has no solution"),
    (CLASSIC[:11] + "x" + CLASSIC[12:], "a Sudoku puzzle must be 81 digits (0 or . for blanks): character 'x' at "
                                        "position 12 is not one"),
])
def test_sample_refuses_a_bad_puzzle_before_sampling(ckpt, capsys, prompt, message):
  rc, out, err = _main("sample.py", [f"--ckpt={ckpt}", f"--prompt={prompt}"], capsys)
  assert rc == 1 and err == f"error: {message}\n" and "steps per canvas" not in out


def test_sample_names_the_line_of_a_bad_prompt_and_checks_output_paths(ckpt, tmp_path, capsys):
  prompts = tmp_path / "prompts.txt"
  prompts.write_text(f"{CLASSIC}\n\n{TWO_FIVES}\n")
  rc, out, err = _main("sample.py", [f"--ckpt={ckpt}", f"--prompts_file={prompts}"], capsys)
  assert rc == 1 and err == f"error: {prompts}: line 3: the puzzle breaks the rules: two 5s in row 1\n"
  for flag in ("show_steps_html", "show_steps_gif"):
    rc, out, err = _main("sample.py", [f"--ckpt={ckpt}", f"--prompt={CLASSIC}", "--steps=1",
                                       f"--{flag}={tmp_path}/missing/steps.x"], capsys)
    assert rc == 1 and err == f"error: --{flag}={tmp_path}/missing/steps.x: directory {tmp_path}/missing does " \
                              "not exist\n" and "steps per canvas" not in out


def test_sample_names_an_unknown_task(tmp_path, capsys):
  config = small_dense(64, width=16, num_layers=1, num_heads=2, canvas_length=4, stop_ids=(1,))
  save_model(str(tmp_path / "ckpt"), config, model.init_params(config, jax.random.key(0)),
             {"task": {"name": "chess_moves"}})
  rc, out, err = _main("sample.py", [f"--ckpt={tmp_path / 'ckpt'}", "--prompt=e4"], capsys)
  assert rc == 1 and err.startswith(f"error: the checkpoint {tmp_path / 'ckpt'} was trained on task 'chess_moves', "
                                    "which is not registered here (registered tasks: sudoku_digits, sudoku_text")


def test_training_on_a_csv_with_bad_rows(tmp_path):
  from tests.training.test_train import debug_config
  import train
  path = _write_csv(tmp_path / "train.csv", [(CLASSIC, SOLVED)] * 4 + [(TWO_FIVES, SOLVED)])
  c = debug_config(tmp_path, num_train_steps=1, **{"data.csv": str(path)})
  with pytest.raises(ValueError, match=rf"^{path}: line 6: the puzzle breaks the rules: two 5s in row 1"):
    train.train(c, str(tmp_path / "refused"))
  proc = subprocess.run([sys.executable, "train.py", "--config=configs/sft_sudoku.py:size=debug",
                         "--config.num_train_steps=1", f"--config.data.csv={path}", "--config.data.skip_bad_rows=true",
                         f"--workdir={tmp_path / 'run'}"], cwd=ROOT, capture_output=True, text=True, timeout=300)
  assert proc.returncode == 0, proc.stderr
  assert f"{path}: skipped 1 row that break the rules (data.skip_bad_rows); training on 4" in proc.stdout


def test_sample_names_a_task_entry_it_cannot_read(tmp_path, capsys):
  config = small_dense(64, width=16, num_layers=1, num_heads=2, canvas_length=4, stop_ids=(1,))
  save_model(str(tmp_path / "ckpt"), config, model.init_params(config, jax.random.key(0)), {"task": "chess"})
  rc, out, err = _main("sample.py", [f"--ckpt={tmp_path / 'ckpt'}", "--prompt=e4"], capsys)
  assert rc == 1 and err.startswith(f"error: the checkpoint {tmp_path / 'ckpt'} records a task this dgemma cannot "
                                    "read ('chess'; registered tasks: sudoku_digits, sudoku_text")
