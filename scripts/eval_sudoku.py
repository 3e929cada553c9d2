"""Evaluates a Sudoku checkpoint: block diffusion, the autoregressive baseline with the same backbone, or both.

  python scripts/eval_sudoku.py --ckpt=PATH --data=FILE.csv [--limit=256] [--max_steps=48]
      [--adaptive_stopping=false] [--mode=diffusion|ar|both] [--samples=1] [--json_out=results.json]

--data is a Kaggle-style CSV (puzzle,solution or quizzes,solutions) or an .npz written by
`dgemma.tasks.sudoku.puzzles.generate_dataset`. The checkpoint may use either Sudoku task (the digit vocabulary or the
official text format with its tokenizer, see dgemma/tasks/sudoku/task.py). Reports puzzle accuracy, cell accuracy over the blanks, clue
preservation, denoising steps (mean, median), tokens per forward pass and wall time, overall and split by
difficulty: clue-count buckets as the official eval (easy >= 40, medium 30-39, hard < 30) and our solver label
(singles: solvable by naked/hidden singles alone; search: needs search).

--samples=K samples every puzzle K times (independent random draws) and answers with the first sample that keeps
the clues and obeys the rules (a check any Sudoku program can make, without the solution), else the first sample:
test-time compute, reported apart from the one-sample numbers. Steps and tokens per forward pass then count
all K samples' denoising steps; `sequential_mean_steps` is what drawing the samples one after another would
cost: each puzzle's steps up to and including its first sample that obeys the rules (all K when none does).
"""

from __future__ import annotations

import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402
from dgemma.cpu import huge_pages  # noqa: E402
from dgemma.sampling import flags as sampler_flags  # noqa: E402

FLAGS = flags.FlagValues()
_D = dict(flag_values=FLAGS)
flags.DEFINE_string("ckpt", None, "A Sudoku checkpoint (task sudoku_digits).", **_D)
flags.DEFINE_string("data", None, "Puzzles: a .csv or an .npz from generate_dataset.", **_D)
flags.DEFINE_integer("limit", 0, "Evaluate only the first N puzzles (0: all).", **_D)
flags.DEFINE_integer("batch_size", 64, "Puzzles per batch.", **_D)
flags.DEFINE_enum("mode", "diffusion", ["diffusion", "ar", "both"], "Which decoder(s) to evaluate.", **_D)
# One flag per sampler knob but those the task fixes (dgemma/sampling/flags.py), unset by default: a knob left unset
# takes the checkpoint's recorded default, else SamplerConfig's (in brackets). --max_steps: this script's old name.
sampler_flags.define(FLAGS, skip=("max_new_tokens", "canvas_length", "stop_ids", "return_trajectory"))
flags.DEFINE_alias("max_steps", sampler_flags.flag_name("max_denoising_steps"), flag_values=FLAGS)
flags.DEFINE_float("ar_temperature", 0.0, "Autoregressive baseline temperature (0: greedy).", **_D)
flags.DEFINE_integer("seed", 0, "Random seed.", **_D)
flags.DEFINE_integer("samples", 1, "Samples per puzzle; the answer is the first that obeys the rules.", **_D)
flags.DEFINE_string("json_out", None, "Also write the numbers to this JSON file.", **_D)
flags.DEFINE_bool("skip_bad_rows", False, "Leave out the rows whose puzzle or solution breaks the rules (with a "
                  "count) instead of refusing the file.", **_D)

BUCKETS = ("easy", "medium", "hard")


def load_data(path: str, limit: int = 0, skip_bad_rows: bool = False) -> dict:
  """{"puzzle", "solution", "num_clues", "needs_search"} from a CSV or an npz; every row is checked against the
  rules (a bad one refuses the file in one line, or with `skip_bad_rows` is left out: "skipped" counts them)."""
  import numpy as np

  from dgemma.tasks.sudoku import puzzles as sudoku, formats as sudoku_formats
  if not os.path.isfile(path):
    raise ValueError(f"{path}: data file not found")
  if path.endswith(".npz"):
    try:
      with np.load(path) as f:  # only the arrays used here; others (any shape) are left alone
        data = {k: f[k] for k in ("puzzle", "solution", "needs_search") if k in f.files}
    except Exception as e:
      raise ValueError(f"{path}: not a readable npz file ({e})") from None
    for key in ("puzzle", "solution"):
      if key not in data or np.asarray(data[key]).ndim != 2 or np.asarray(data[key]).shape[1] != 81:
        raise ValueError(f"{path}: expected a [n, 81] array {key!r}")
    for key, array in data.items():
      if array.ndim == 0 or len(array) != len(data["puzzle"]):
        raise ValueError(f"{path}: {key!r} has shape {array.shape} but 'puzzle' has {len(data['puzzle'])} rows")
    if limit:
      data = {k: v[:limit] for k, v in data.items()}
    for key in ("puzzle", "solution"):
      values = np.asarray(data[key])
      whole = np.issubdtype(values.dtype, np.integer) or (
          np.issubdtype(values.dtype, np.floating) and bool(np.all(values == np.round(values))))  # (NaN is not)
      if not whole:
        raise ValueError(f"{path}: {key!r} must hold whole numbers 0-9, got dtype {values.dtype}")
      if values.size and (values.min() < 0 or values.max() > 9):
        row, cell = np.argwhere((values < 0) | (values > 9))[0]
        raise ValueError(f"{path}: {key!r} row {row}: value {values[row, cell]} at cell {cell} is not a digit 0-9")
      data[key] = values.astype(np.int8)
    keep = sudoku_formats.check_rows(data["puzzle"], data["solution"],
                                     [f"{path}: row {i}" for i in range(len(data["puzzle"]))], skip_bad_rows)
    data = {k: v[keep] for k, v in data.items()}
    skipped = int((~keep).sum())
    if "needs_search" not in data:
      data["needs_search"] = np.array([sudoku.solve_with_singles(p) is None for p in data["puzzle"]], bool)
  else:
    data, skipped = sudoku_formats.read_checked_csv(path, limit=limit or None, skip_bad_rows=skip_bad_rows)
  data["skipped"] = skipped
  data["num_clues"] = (np.asarray(data["puzzle"]) != 0).sum(1)
  if len(data["puzzle"]) == 0:
    raise ValueError(f"{path}: no puzzles")
  return data


def summarize(data: dict, predictions, steps, tokens_per_forward, sequential_steps=None) -> dict:
  """Metrics overall and per group; groups without puzzles have count 0 and None metrics. With
  `sequential_steps` (--samples > 1) each group also has `sequential_mean_steps`."""
  import numpy as np

  from dgemma.tasks.sudoku import puzzles as sudoku, digits as sudoku_task

  def group(mask):
    n = int(mask.sum())
    sequential = {} if sequential_steps is None else {
        "sequential_mean_steps": float(np.mean(sequential_steps[mask])) if n else None}
    if n == 0:
      return {"count": 0, "accuracy": None, "cell_accuracy": None, "clue_preservation": None,
              "exact_clue_preservation": None, "mean_steps": None, "median_steps": None,
              "tokens_per_forward": None, **sequential}
    scores = sudoku_task.score(data["puzzle"][mask], data["solution"][mask], predictions[mask])
    return {"count": n, **scores, "mean_steps": float(np.mean(steps[mask])),
            "median_steps": float(np.median(steps[mask])),
            "tokens_per_forward": float(np.mean(tokens_per_forward[mask])), **sequential}

  predictions, steps = np.asarray(predictions), np.asarray(steps)
  tokens_per_forward = np.asarray(tokens_per_forward)
  buckets = np.array([sudoku.difficulty_bucket(int(c)) for c in data["num_clues"]])
  search = np.asarray(data["needs_search"], bool)
  out = group(np.ones(len(predictions), bool))
  out["by_difficulty"] = {b: group(buckets == b) for b in BUCKETS}
  out["by_solver_label"] = {"singles": group(~search), "search": group(search)}
  return out


def _batches(puzzles, batch_size):
  """Equal-shape batches (the last one padded by repeating its first puzzle), so one compilation serves all."""
  import numpy as np
  for start in range(0, len(puzzles), batch_size):
    chunk = puzzles[start:start + batch_size]
    n = len(chunk)
    if n < batch_size:
      chunk = np.concatenate([chunk, np.repeat(chunk[:1], batch_size - n, axis=0)])
    yield chunk, n


def decode(params, task, puzzles, mode: str, sampler, batch_size: int, seed: int, ar_temperature: float = 0.0,
           position_features=None):
  """Runs one decoder ("diffusion" or "ar") over `puzzles` [n, 81] in equal-shape batches: (predictions [n, 81],
  steps [n], tokens per forward [n], wall seconds, compile seconds). `position_features`: the model's feature
  table, when it has one (its checkpoint's metadata["position_features"])."""
  import jax
  import numpy as np

  from dgemma.tasks.sudoku import task as sudoku_sampling
  from dgemma.sampling.autoregressive import compile_autoregressive
  from dgemma.sampling.generate import compile_generate

  batch_size = min(batch_size, len(puzzles))
  example, valid = task.prompts(puzzles[:batch_size])
  key = jax.random.key(seed)
  if mode == "diffusion":
    run, compile_s = compile_generate(params, task.config, example, valid, key, task.sampler(sampler),
                                      position_features=position_features)
  else:
    run, compile_s = compile_autoregressive(params, task.config, example, valid, key,
                                            sudoku_sampling.ar_config(task, ar_temperature),
                                            position_features=position_features)
  preds, steps, tpf = [], [], []
  start = time.perf_counter()
  for index, (chunk, n) in enumerate(_batches(puzzles, batch_size)):
    tokens, valid = task.prompts(chunk)
    out = jax.block_until_ready(run(tokens, valid, jax.random.fold_in(key, index)))
    preds.append(task.decode(np.asarray(out.tokens))[:n])
    steps.append(np.asarray(out.steps_per_canvas[:, 0] if mode == "diffusion" else out.forward_passes)[:n])
    tpf.append(np.asarray(out.tokens_per_forward)[:n])
  wall = time.perf_counter() - start
  return np.concatenate(preds), np.concatenate(steps), np.concatenate(tpf), wall, compile_s


def evaluate(params, task, data: dict, mode: str, sampler, batch_size: int, seed: int,
             ar_temperature: float = 0.0, samples: int = 1, position_features=None) -> dict:
  """Runs one decoder over all puzzles; returns summarize(...) plus timing. With `samples` > 1 each puzzle is
  decoded that many times (consecutive rows, so each has its own random draws) and answered by its first sample
  that obeys the rules (`sudoku.first_valid_index`); steps count all its samples, and sequential_mean_steps
  those a one-at-a-time draw would spend."""
  import numpy as np

  from dgemma.tasks.sudoku import puzzles as sudoku

  puzzles = np.asarray(data["puzzle"])
  preds, steps, tpf, wall, compile_s = decode(params, task, np.repeat(puzzles, samples, axis=0), mode, sampler,
                                              batch_size, seed, ar_temperature, position_features)
  sequential_steps = None
  if samples > 1:  # one answer per puzzle; the compute of all its samples
    preds_NxKxC = preds.reshape(len(puzzles), samples, -1)
    first_valid = [sudoku.first_valid_index(p, c) for p, c in zip(puzzles, preds_NxKxC)]
    chosen = [0 if i is None else i for i in first_valid]  # no valid sample: answer with the first
    preds = preds_NxKxC[np.arange(len(puzzles)), chosen]
    steps_NxK = steps.reshape(-1, samples)
    steps = steps_NxK.sum(1)
    tpf = 1.0 / (1.0 / tpf.reshape(-1, samples)).sum(1)
    # Drawn one at a time, a puzzle would stop at its first valid sample; with none valid it spends all K.
    draws = np.array([samples if i is None else i + 1 for i in first_valid])
    sequential_steps = np.where(np.arange(samples)[None] < draws[:, None], steps_NxK, 0).sum(1)
  result = summarize(data, preds, steps, tpf, sequential_steps)
  result.update(wall_time_s=wall, compile_time_s=compile_s, samples=samples,
                puzzles_per_s=len(puzzles) / max(wall, 1e-9))
  return result


def _print(name: str, r: dict) -> None:
  def line(label, g):
    if not g["count"]:
      return f"  {label:<8} n=0"
    return (f"  {label:<8} n={g['count']:<5} acc {g['accuracy']:.3f}  cells {g['cell_accuracy']:.3f}  "
            f"clues {g['clue_preservation']:.3f}  steps {g['mean_steps']:.1f} (median {g['median_steps']:.0f})  "
            f"tok/fwd {g['tokens_per_forward']:.2f}"
            + (f"  one at a time {g['sequential_mean_steps']:.1f}" if "sequential_mean_steps" in g else ""))
  each = (f", {r['samples']} samples each, answered by the first that obeys the rules; 'one at a time': mean steps"
          " if drawn one after another until one does" if r["samples"] > 1 else "")
  print(f"== {name}: {r['count']} puzzles{each} in {r['wall_time_s']:.2f} s ({r['puzzles_per_s']:.1f}/s; "
        f"compile {r['compile_time_s']:.1f} s)")
  print(line("all", r))
  for b in BUCKETS:
    print(line(b, r["by_difficulty"][b]))
  for b in ("singles", "search"):
    print(line(b, r["by_solver_label"][b]))


def run() -> int:
  from dgemma.tasks.sudoku import task as sudoku_sampling

  if not FLAGS.ckpt or not FLAGS.data:
    raise ValueError("--ckpt and --data are required")
  if FLAGS.batch_size < 1 or FLAGS.limit < 0 or FLAGS.samples < 1:
    raise ValueError("--batch_size and --samples must be >= 1 and --limit >= 0")
  if not FLAGS.ar_temperature >= 0:
    raise ValueError(f"--ar_temperature must be >= 0, got {FLAGS.ar_temperature}")
  cli.check_seed(FLAGS.seed)
  if FLAGS.json_out:
    cli.check_output_path(FLAGS.json_out, "--json_out")
  data = load_data(FLAGS.data, FLAGS.limit, FLAGS.skip_bad_rows)
  if data["skipped"]:
    print(f"{FLAGS.data}: skipped {data['skipped']} row(s) that break the rules; evaluating {len(data['puzzle'])}")
  from dgemma.loading import load_model
  if not os.path.exists(FLAGS.ckpt):
    raise ValueError(f"checkpoint {FLAGS.ckpt} does not exist")
  try:
    config, params, metadata = load_model(FLAGS.ckpt)
  except Exception as e:
    raise ValueError(f"cannot load checkpoint {FLAGS.ckpt}: {str(e).splitlines()[0] if str(e) else e!r}") from None
  task = sudoku_sampling.load_task(config, metadata, FLAGS.ckpt)
  sampler = sampler_flags.sampler_config(FLAGS, metadata)  # the flags, else the checkpoint's, else SamplerConfig's

  settings = {"ckpt": FLAGS.ckpt, "task": task.name, "data": FLAGS.data, "max_steps": sampler.max_denoising_steps,
              "adaptive_stopping": sampler.adaptive_stopping, "t_max": sampler.t_max, "t_min": sampler.t_min,
              "schedule": sampler.schedule, "entropy_bound": sampler.entropy_bound,
              "stability_threshold": sampler.stability_threshold,
              "confidence_threshold": sampler.confidence_threshold, "restart_after": sampler.restart_after,
              "self_conditioning": sampler.self_conditioning, "seed": FLAGS.seed,
              "batch_size": FLAGS.batch_size, "samples": FLAGS.samples}
  modes = ["diffusion", "ar"] if FLAGS.mode == "both" else [FLAGS.mode]
  if "diffusion" in modes:  # the knobs in use: flags, else the checkpoint's recorded ones, else the released
    stop = f"at mean entropy {sampler.confidence_threshold}" if sampler.adaptive_stopping else "never"
    restarts = f"restart after {sampler.restart_after} steps" if sampler.restart_after else "no restarts"
    print(f"sampler: max {sampler.max_denoising_steps} steps, t {sampler.t_max} -> {sampler.t_min} "
          f"({sampler.schedule}), entropy bound {sampler.entropy_bound}, stop {stop}, {restarts}, "
          f"self-conditioning {'on' if sampler.self_conditioning else 'off'}")
  results = {}
  for mode in modes:
    results[mode] = evaluate(params, task, data, mode, sampler, FLAGS.batch_size, FLAGS.seed, FLAGS.ar_temperature,
                             FLAGS.samples, metadata.get("position_features"))
    _print("block diffusion" if mode == "diffusion" else "autoregressive", results[mode])
  report = dict(results[modes[0]], mode=modes[0], settings=settings)
  if "ar" in results and modes[0] != "ar":
    report["autoregressive"] = results["ar"]
    report["speedup_vs_autoregressive"] = results["ar"]["wall_time_s"] / max(results["diffusion"]["wall_time_s"],
                                                                             1e-9)
    print(f"== block diffusion is {report['speedup_vs_autoregressive']:.2f}x the autoregressive speed")
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(report, f, indent=2)
    print(f"wrote {FLAGS.json_out}")
  return 0


def main(argv: list[str]) -> int:
  """Runs with command-line `argv`; bad input prints one `error:` line and returns a non-zero code."""
  return cli.run_main(argv, __doc__, run, FLAGS)


if __name__ == "__main__":
  huge_pages.restart_with_huge_pages()  # faster XLA:CPU buffers (dgemma/cpu/huge_pages.py)
  cli.exit(main(sys.argv))
