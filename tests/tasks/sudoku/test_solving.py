"""Sudoku: prompts, solving with both decoders, the evaluation script and sample.py on a digit-vocab model."""

import json
import os
import pathlib
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import tokenizers

from dgemma import model
from dgemma.checkpoints import save_model
from dgemma.config import small_dense
from dgemma.tasks.sudoku import puzzles as sudoku, formats as sudoku_formats, digits as sudoku_task, text as sudoku_text
from dgemma.sampling import SamplerConfig
from dgemma.tasks.sudoku import task as sudoku_sampling
from tests.script_loader import load_script

ROOT = pathlib.Path(__file__).resolve().parents[3]
CLASSIC = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
SAMPLER = SamplerConfig(max_denoising_steps=4)  # what eval_sudoku.py builds from --max_steps=4


@pytest.fixture(scope="module")
def data():
  solution = sudoku.solve(sudoku.from_string(CLASSIC))[0]
  rng = np.random.default_rng(0)
  puzzles = [sudoku.from_string(CLASSIC)]
  for clues in (45, 35, 25):  # easy, medium, hard
    p = solution.copy()
    p[rng.choice(81, 81 - clues, replace=False)] = 0
    puzzles.append(p)
  return {"puzzle": np.stack(puzzles).astype(np.int8), "solution": np.stack([solution] * 4).astype(np.int8)}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, data):
  config = small_dense(sudoku_task.DIGIT_VOCAB_SIZE, width=32, num_layers=2, num_heads=2, canvas_length=81)
  params = model.init_params(config, jax.random.key(0))
  path = tmp_path_factory.mktemp("sudoku")
  save_model(str(path / "ckpt"), config, params, {"task": {"name": "sudoku_digits", "prompt_len": 82}})
  sudoku_formats.write_csv(str(path / "puzzles.csv"), data)
  return path, config, params


def test_parse_puzzle_and_prompts(ckpt):
  _, config, _ = ckpt
  grid = sudoku_sampling.parse_puzzle(" ".join(CLASSIC.replace("0", ".")))
  np.testing.assert_array_equal(grid, sudoku.from_string(CLASSIC))
  with pytest.raises(ValueError, match="must be 81 digits"):
    sudoku_sampling.parse_puzzle(CLASSIC[:80])
  with pytest.raises(ValueError, match="must be 81 digits"):
    sudoku_sampling.parse_puzzle(CLASSIC[:80] + "x")
  task = sudoku_sampling.load_task(config, {"task": {"name": "sudoku_digits", "prompt_len": 90}})
  tokens, valid = task.prompts(grid[None])
  expected = sudoku_task.encode_example(grid, grid, 90, 81)["prompt"]
  np.testing.assert_array_equal(tokens[0], expected)  # exactly the training prompt
  np.testing.assert_array_equal(valid[0], expected != sudoku_task.PAD_ID)
  assert task.config.stop_ids == (sudoku_task.EOS_ID,)
  with pytest.raises(ValueError, match="not a Sudoku checkpoint"):
    sudoku_sampling.load_task(config, {"task": "demo"})


def test_solve_with_both_decoders(ckpt, data):
  _, config, params = ckpt
  task = sudoku_sampling.load_task(config, {"task": {"name": "sudoku_digits", "prompt_len": 82}})
  puzzles = data["puzzle"][:3]
  result = sudoku_sampling.solve(params, task, puzzles, jax.random.key(0), SAMPLER)
  assert result.tokens.shape == (3, 81)
  np.testing.assert_array_equal(result.predictions, sudoku_task.decode_batch(result.tokens))
  assert ((result.steps >= 1) & (result.steps <= 4)).all()
  ar = sudoku_sampling.solve_autoregressive(params, task, puzzles, jax.random.key(0))
  np.testing.assert_array_equal(ar.predictions, sudoku_task.decode_batch(ar.tokens))
  assert ((ar.steps >= 1) & (ar.steps <= 81)).all()


def _char_tokenizer(path):
  """One token per character of the official prompt and answers, turn markers as added tokens."""
  specials = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
  chars = sorted(set(sudoku_text.SUDOKU_PROMPT.replace("{text}", "")) | set("0123456789 "))
  vocab = {t: i for i, t in enumerate(specials + chars)}
  tok = tokenizers.Tokenizer(tokenizers.models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
  tok.add_special_tokens(specials)
  tok.decoder = tokenizers.decoders.Fuse()
  tok.save(str(path / "tokenizer.json"))
  return len(vocab)


def test_text_format_task(tmp_path, data):
  vocab = _char_tokenizer(tmp_path)
  config = small_dense(vocab, width=16, num_layers=1, num_heads=2, canvas_length=170)
  params = model.init_params(config, jax.random.key(1))
  metadata = {"task": {"name": "sudoku_text", "prompt_len": 400, "tokenizer": str(tmp_path)}}
  task = sudoku_sampling.load_task(config, metadata)
  assert task.config.stop_ids == (1, 5) and task.config.pad_id == 0  # EOS and <turn|>
  tokens, valid = task.prompts(data["puzzle"][:2])
  expected = sudoku_text.encode_batch(task.tokenizer, data["puzzle"][:2], None, 400, 170)
  np.testing.assert_array_equal(tokens, expected["prompt"])
  np.testing.assert_array_equal(valid, expected["prompt_valid"])
  # The answer text is read as in the official eval; a canvas holding the spaced solution decodes to it.
  answer = task.tokenizer.encode(sudoku_text.format_target(data["solution"][0]), add_bos=False)
  canvas = np.array([answer + [1] * (170 - len(answer))])
  np.testing.assert_array_equal(task.decode(canvas)[0], data["solution"][0])
  np.testing.assert_array_equal(task.cells(canvas[0, :20]), np.r_[data["solution"][0][:10], np.zeros(71)])
  result = sudoku_sampling.solve(params, task, data["puzzle"][:2], jax.random.key(0),
                                 SamplerConfig(max_denoising_steps=2))
  assert result.tokens.shape == (2, 170) and result.predictions.shape == (2, 81)
  np.testing.assert_array_equal(result.predictions, sudoku_text.decode_batch(task.tokenizer, result.tokens))
  with pytest.raises(ValueError, match="tokenizer .* does not exist"):
    sudoku_sampling.load_task(config, {"task": {"name": "sudoku_text", "tokenizer": str(tmp_path / "nope")}})


def test_summarize_counts_and_scores(data):
  evaluator = load_script("scripts/eval_sudoku.py")
  d = dict(data, num_clues=(data["puzzle"] != 0).sum(1), needs_search=np.array([False, False, True, True]))
  steps, tpf = np.array([2, 4, 6, 8]), np.ones(4)
  perfect = evaluator.summarize(d, d["solution"], steps, tpf)
  assert perfect["accuracy"] == 1.0 and perfect["cell_accuracy"] == 1.0 and perfect["mean_steps"] == 5.0
  assert {k: v["count"] for k, v in perfect["by_difficulty"].items()} == {"easy": 1, "medium": 2, "hard": 1}
  assert perfect["by_solver_label"]["search"]["median_steps"] == 7.0
  unfilled = evaluator.summarize(d, d["puzzle"], steps, tpf)
  assert unfilled["accuracy"] == 0.0 and unfilled["cell_accuracy"] == 0.0
  assert unfilled["clue_preservation"] == 1.0
  assert unfilled["by_difficulty"]["hard"]["accuracy"] == 0.0


def test_eval_script_writes_json(ckpt, tmp_path, capsys):
  path, _, _ = ckpt
  evaluator = load_script("scripts/eval_sudoku.py")
  out = tmp_path / "r.json"
  rc = evaluator.main(["eval_sudoku.py", f"--ckpt={path / 'ckpt'}", f"--data={path / 'puzzles.csv'}",
                       "--mode=both", "--max_steps=4", "--batch_size=3", f"--json_out={out}"])
  assert rc == 0, capsys.readouterr().err
  report = json.loads(out.read_text())
  for key in ("accuracy", "cell_accuracy", "clue_preservation", "mean_steps", "median_steps",
              "tokens_per_forward", "wall_time_s", "by_difficulty", "by_solver_label", "autoregressive"):
    assert key in report, key
  assert report["count"] == 4 and 1 <= report["mean_steps"] <= 4
  assert {b: report["by_difficulty"][b]["count"] for b in ("easy", "medium", "hard")} == \
      {"easy": 1, "medium": 2, "hard": 1}
  assert 0.0 <= report["by_difficulty"]["easy"]["accuracy"] <= 1.0
  assert report["autoregressive"]["count"] == 4 and report["autoregressive"]["mean_steps"] <= 81
  assert "block diffusion" in capsys.readouterr().out


def test_eval_script_self_conditioning_follows_the_checkpoint(ckpt, tmp_path, capsys):
  """auto: off for a checkpoint recorded as trained without self-conditioning, on otherwise; a flag overrides."""
  path, config, params = ckpt
  evaluator = load_script("scripts/eval_sudoku.py")
  save_model(str(tmp_path / "no_sc"), config, params,
             {"task": {"name": "sudoku_digits", "prompt_len": 82}, "self_conditioning": False})
  used = {}
  for name, ckpt_dir, flag in (("recorded_off", tmp_path / "no_sc", "auto"), ("unrecorded", path / "ckpt", "auto"),
                               ("forced_on", tmp_path / "no_sc", "on")):
    out = tmp_path / f"{name}.json"
    rc = evaluator.main(["eval_sudoku.py", f"--ckpt={ckpt_dir}", f"--data={path / 'puzzles.csv'}", "--max_steps=2",
                         f"--self_conditioning={flag}", f"--json_out={out}"])
    assert rc == 0, capsys.readouterr().err
    used[name] = json.loads(out.read_text())["settings"]["self_conditioning"]
  assert used == {"recorded_off": False, "unrecorded": True, "forced_on": True}


def test_eval_script_sampler_knobs_follow_the_checkpoint(ckpt, tmp_path, capsys):
  """Knobs without a flag come from the checkpoint's recorded defaults, else the released model's; flags win."""
  path, config, params = ckpt
  evaluator = load_script("scripts/eval_sudoku.py")
  save_model(str(tmp_path / "hot"), config, params, {"task": {"name": "sudoku_digits", "prompt_len": 82},
                                                     "sampler": {"t_max": 1.5, "t_min": 1.1, "max_denoising_steps": 3}})
  used = {}
  for name, ckpt_dir, flags in (("recorded", tmp_path / "hot", []), ("unrecorded", path / "ckpt", []),
                                ("flag", tmp_path / "hot", ["--t_min=0.7", "--max_steps=2"])):
    out = tmp_path / f"{name}.json"
    rc = evaluator.main(["eval_sudoku.py", f"--ckpt={ckpt_dir}", f"--data={path / 'puzzles.csv'}", *flags,
                         f"--json_out={out}"])
    assert rc == 0, capsys.readouterr().err
    report = json.loads(out.read_text())
    used[name] = (report["settings"]["t_max"], report["settings"]["t_min"], report["settings"]["max_steps"],
                  report["mean_steps"])
  assert used["recorded"][:3] == (1.5, 1.1, 3) and used["recorded"][3] <= 3
  assert used["unrecorded"][:3] == (0.8, 0.4, 48)
  assert used["flag"][:3] == (1.5, 0.7, 2) and used["flag"][3] <= 2


@pytest.mark.parametrize("asset", ["sudoku-small", "sudoku-small-12layers-h200"])  # every checkpoint assets/ ships
def test_shipped_checkpoint_solves_with_its_recorded_sampler(capsys, asset):
  """The shipped checkpoints work right after install: sample.py reads the recorded (hot) sampler and keeps the
  clues of an easy puzzle (checked against the grid, not the script's own verdict)."""
  sampler = load_script("sample.py")
  rc = sampler.main(["sample.py", f"--ckpt={ROOT / 'assets' / asset}", f"--prompt={CLASSIC}"])
  out = capsys.readouterr().out
  assert rc == 0
  assert "t 1.5 -> 1.2" in out  # the checkpoint's sampler, not the released model's 0.8 -> 0.4
  grid = np.array([[int(d) for d in line.split()] for line in out.splitlines()
                   if len(line.split()) == 9 and all(d.isdigit() for d in line.split())][:9])
  puzzle = sudoku.from_string(CLASSIC).reshape(9, 9)
  assert grid.shape == (9, 9) and np.all((puzzle == 0) | (grid == puzzle))


def test_eval_samples_answer_with_a_sample_that_obeys_the_rules(tmp_path):
  """--samples=K: a puzzle counts as solved exactly when one of its K samples is its (unique) solution, checked
  here against the solutions, which the script never sees; steps add up over the samples."""
  from dgemma.loading import load_model
  from dgemma.sampling import sampler_config
  evaluator = load_script("scripts/eval_sudoku.py")
  path = str(ROOT / "assets/sudoku-small")
  config, params, metadata = load_model(path)
  task = sudoku_sampling.load_task(config, metadata, path)
  generated = sudoku.generate_dataset(8, 4321, 30, 36)  # generated puzzles have one solution each
  np.savez(tmp_path / "p.npz", puzzle=generated["puzzle"], solution=generated["solution"])
  data = evaluator.load_data(str(tmp_path / "p.npz"))
  sampler, k = sampler_config(metadata, max_denoising_steps=6), 3
  features = metadata["position_features"]  # the model's feature table travels in its metadata
  preds, steps, _, _, _ = evaluator.decode(params, task, np.repeat(data["puzzle"], k, axis=0), "diffusion",
                                           sampler, batch_size=12, seed=0, position_features=features)
  right_NxK = (preds.reshape(8, k, 81) == np.asarray(data["solution"])[:, None]).all(-1)
  report = evaluator.evaluate(params, task, data, "diffusion", sampler, batch_size=12, seed=0, samples=k,
                              position_features=features)
  assert report["accuracy"] == pytest.approx(right_NxK.any(1).mean())
  assert report["mean_steps"] == pytest.approx(steps.reshape(8, k).sum(1).mean())
  assert right_NxK.any() and not right_NxK.all()  # some samples right and some wrong: the choice mattered
  # One draw after another: steps up to the first right sample (the solution is unique), all K when none is.
  sequential = [sum(steps.reshape(8, k)[i, :(list(right_NxK[i]).index(True) + 1 if right_NxK[i].any() else k)])
                for i in range(8)]
  assert report["sequential_mean_steps"] == pytest.approx(np.mean(sequential))
  search = np.asarray(data["needs_search"], bool)
  for label, mask in (("singles", ~search), ("search", search)):
    expected = np.mean(np.asarray(sequential)[mask]) if mask.any() else None
    assert report["by_solver_label"][label]["sequential_mean_steps"] == pytest.approx(expected)
  assert report["sequential_mean_steps"] < report["mean_steps"]  # some puzzle was answered before its last draw


def test_sample_script_answers_with_the_first_draw_that_obeys_the_rules(capsys, tmp_path):
  """sample.py --samples=K prints the first of K draws that is a solution. The K draws are recomputed with
  `solve` (same batch, same key) and judged against the solver's unique solution, which sample.py never sees."""
  from dgemma.loading import load_model
  from dgemma.sampling import sampler_config
  path, k = str(ROOT / "assets/sudoku-small"), 6
  generated = sudoku.generate_dataset(4, 99, 26, 30)
  config, params, metadata = load_model(path)
  task = sudoku_sampling.load_task(config, metadata, path)
  draws = sudoku_sampling.solve(params, task, np.repeat(generated["puzzle"], k, axis=0), jax.random.key(3),
                                sampler_config(metadata, max_denoising_steps=12), metadata["position_features"])
  right_NxK = (draws.predictions.reshape(4, k, 81) == generated["solution"][:, None]).all(-1)
  assert (right_NxK.any(1) & ~right_NxK[:, 0]).any()  # a puzzle answered by a later draw: the choice matters
  tmp = tmp_path / "puzzles.txt"
  tmp.write_text("\n".join(sudoku.to_string(p) for p in generated["puzzle"]) + "\n")
  sampler = load_script("sample.py")
  rc = sampler.main(["sample.py", f"--ckpt={path}", f"--prompts_file={tmp}", "--steps=12", f"--samples={k}",
                     "--seed=3"])
  out = capsys.readouterr().out
  assert rc == 0, out
  blocks = out.split("=== prompt ")[1:]
  assert len(blocks) == 4
  for i, block in enumerate(blocks):
    grid = np.array([int(d) for line in block.splitlines()[1:10] for d in line.split()])
    steps_i = draws.steps.reshape(4, k)[i]
    if right_NxK[i].any():
      first = int(np.argmax(right_NxK[i]))
      assert np.array_equal(grid, generated["solution"][i])
      assert (f"draw {first + 1} of {k} is the first that obeys the rules; one draw after another that is "
              f"{int(steps_i[:first + 1].sum())} steps (all {k}: {int(steps_i.sum())})") in block
    else:
      assert np.array_equal(grid, draws.predictions.reshape(4, k, 81)[i, 0])
      assert f"none of {k} draws obeys the rules" in block


def test_restarts_are_fresh_attempts_of_the_plain_sampler():
  """restart_after=L, max L*K: each row's answer is that of the first of K plain runs (max L steps, the row's key
  folded with RESTART_SALT + j for attempt j >= 1) that stopped, with the steps of all attempts before it; a row
  that never stops ends with its last attempt after L*K steps. The plain runs are the reference, computed apart."""
  import dataclasses

  from dgemma.loading import load_model
  from dgemma.sampling import generate, sampler_config
  from dgemma.sampling.generate import RESTART_SALT, row_keys
  path = str(ROOT / "assets/sudoku-small")
  config, params, metadata = load_model(path)
  task = sudoku_sampling.load_task(config, metadata, path)
  puzzles = sudoku.generate_dataset(16, 7, 22, 28)["puzzle"]  # hard: some rows need more than one attempt
  tokens, valid = task.prompts(puzzles)
  length, attempts = 10, 4
  plain = task.sampler(sampler_config(metadata, max_denoising_steps=length))
  keys = row_keys(jax.random.key(5), len(puzzles))
  features = metadata["position_features"]
  restarted = generate(params, task.config, tokens, valid, keys,
                       dataclasses.replace(plain, max_denoising_steps=length * attempts, restart_after=length),
                       position_features=features)
  runs = [generate(params, task.config, tokens, valid,
                   keys if j == 0 else jax.vmap(jax.random.fold_in)(keys, jnp.full(len(puzzles), RESTART_SALT + j)),
                   plain, position_features=features) for j in range(attempts)]
  got_tokens, got_steps = np.asarray(restarted.tokens), np.asarray(restarted.steps_per_canvas[:, 0])
  succeeded_in = []
  for row in range(len(puzzles)):
    for j, run in enumerate(runs):
      steps_j = int(run.steps_per_canvas[row, 0])
      last = j == attempts - 1
      # A plain run that used all L steps may or may not have stopped at the last one: the total tells which.
      if steps_j < length or last or got_steps[row] == (j + 1) * length:
        assert got_steps[row] == j * length + steps_j, row
        np.testing.assert_array_equal(got_tokens[row], np.asarray(run.tokens[row]))
        succeeded_in.append(j if steps_j < length else None)
        break
  assert 0 in succeeded_in and any(j is not None and j > 0 for j in succeeded_in)  # restarts happened and mattered
  assert np.all(got_steps <= length * attempts)


@pytest.mark.parametrize("bad, message", [
    (dict(restart_after=-1), "restart_after must be an integer >= 0"),
    (dict(restart_after=4, adaptive_stopping=False), "restart_after > 0 needs adaptive_stopping"),
])
def test_bad_restart_knobs(bad, message):
  with pytest.raises(ValueError, match=message):
    SamplerConfig(**bad)


def test_eval_script_errors(ckpt, tmp_path, capsys):
  path, _, _ = ckpt
  evaluator = load_script("scripts/eval_sudoku.py")
  text_model = tmp_path / "text"
  config = small_dense(16, width=16, num_layers=1, num_heads=2, canvas_length=8)
  save_model(str(text_model), config, model.init_params(config, jax.random.key(0)))
  rc = evaluator.main(["eval_sudoku.py", f"--ckpt={text_model}", f"--data={path / 'puzzles.csv'}"])
  err = capsys.readouterr().err
  assert rc == 1 and err.strip().startswith("error: not a Sudoku checkpoint: its metadata names no task")
  rc = evaluator.main(["eval_sudoku.py", f"--ckpt={path / 'ckpt'}", f"--data={path / 'puzzles.csv'}",
                       "--max_steps=0"])
  err = capsys.readouterr().err
  assert rc == 1 and err.count("\n") == 1 and "max_denoising_steps must be a positive integer" in err
  # As a program: the script finds the package from the repository root and fails with one line.
  proc = subprocess.run([sys.executable, str(ROOT / "scripts/eval_sudoku.py"), f"--ckpt={path / 'ckpt'}",
                         f"--data={tmp_path / 'missing.csv'}"], capture_output=True, text=True,
                        cwd=str(tmp_path), env=dict(os.environ, JAX_PLATFORMS="cpu"))
  assert proc.returncode == 1
  assert proc.stderr.strip() == f"error: {tmp_path / 'missing.csv'}: data file not found"
  # An npz whose arrays disagree in length fails before any decoding (arrays it does not read are ignored).
  grids = np.stack([sudoku.from_string(CLASSIC)] * 3)
  np.savez(tmp_path / "mismatch.npz", puzzle=grids, solution=grids[:2], note=np.int32(7))
  for extra, message in (([], f"{tmp_path / 'mismatch.npz'}: 'solution' has shape (2, 81) but 'puzzle' has 3 rows"),
                         (["--seed=4294967296"], "--seed must be in [0, 2**32), got 4294967296")):
    rc = evaluator.main(["eval_sudoku.py", f"--ckpt={path / 'ckpt'}", f"--data={tmp_path / 'mismatch.npz'}",
                         "--max_steps=2", *extra])
    captured = capsys.readouterr()
    assert rc == 1 and captured.err == f"error: {message}\n" and "block diffusion" not in captured.out
  solved = np.stack([sudoku.solve(grids[0])[0]] * 3)  # (a solution must be complete: load_data checks every row)
  np.savez(tmp_path / "fine.npz", puzzle=grids, solution=solved, note=np.int32(7))
  assert len(evaluator.load_data(str(tmp_path / "fine.npz"), limit=2)["puzzle"]) == 2


def test_sample_script_solves_and_shows_steps(ckpt, tmp_path, capsys):
  path, _, _ = ckpt
  sampler = load_script("sample.py")
  html = tmp_path / "steps.html"
  rc = sampler.main(["sample.py", f"--ckpt={path / 'ckpt'}", f"--prompt={CLASSIC}", "--steps=4",
                     f"--show_steps_html={html}"])
  out = capsys.readouterr().out
  assert rc == 0
  assert "valid solution:" in out and "steps per canvas:" in out and "tokens/s" in out
  grid_lines = [line for line in out.splitlines() if len(line.split()) == 9]
  assert len(grid_lines) >= 9
  assert '"label": "step 1/4"' in html.read_text()
  rc = sampler.main(["sample.py", f"--ckpt={path / 'ckpt'}", "--prompt=12345"])
  err = capsys.readouterr().err
  assert rc == 1 and err.strip().startswith("error: a Sudoku puzzle must be 81 digits")
  # The task fixes the canvas, the length and the stop token: flags that would be ignored are refused.
  rc = sampler.main(["sample.py", f"--ckpt={path / 'ckpt'}", f"--prompt={CLASSIC}", "--max_new_tokens=100",
                     "--stop_ids=1"])
  err = capsys.readouterr().err
  assert rc == 1 and err.startswith("error: --max_new_tokens, --stop_ids cannot be set for a Sudoku checkpoint")
