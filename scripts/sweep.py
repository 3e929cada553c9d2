"""Run a grid of config overrides one after another; write one results table (markdown + CSV).

    python scripts/sweep.py --config=configs/sft_sudoku.py --eval_data=data/sudoku_eval_1000.npz \
        --grid="diffusion.schedule=linear,cosine;diffusion.self_cond_prob=0,0.5;eval.entropy_bound=0.1,0.3" \
        --out_dir=sweeps/first

Axes are separated by ';', values by ','. Keys starting with `eval.` are flags of scripts/eval_sudoku.py
(sampler knobs); every other key is a `--config.` override of train.py. Runs that share their training keys are
trained once. Each run's workdir is kept under out_dir; a finished run is not trained again when the sweep is
restarted.
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import subprocess
import sys
import time

from absl import app, flags

_CONFIG = flags.DEFINE_string("config", "configs/sft_sudoku.py", "Base config file (with :args if any).")
_GRID = flags.DEFINE_string("grid", None, "key=v1,v2;key2=v1,v2 ...", required=True)
_EVAL_DATA = flags.DEFINE_string("eval_data", None, "Held-out puzzles (.csv or .npz).", required=True)
_EVAL_LIMIT = flags.DEFINE_integer("eval_limit", 256, "Puzzles evaluated per run (0: all).")
_OUT_DIR = flags.DEFINE_string("out_dir", None, "Where runs and the results table go.", required=True)
_EXTRA = flags.DEFINE_multi_string("train_flag", [], "Extra train.py flags for every run, e.g. --config.num_train_steps=300.")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_grid(text: str) -> list[tuple[str, list[str]]]:
  axes = []
  for axis in filter(None, (a.strip() for a in text.split(";"))):
    if "=" not in axis:
      raise ValueError(f"grid axis {axis!r} is not key=v1,v2")
    key, values = axis.split("=", 1)
    axes.append((key.strip(), [v.strip() for v in values.split(",") if v.strip()]))
  return axes


def run(cmd: list[str], log_path: str) -> None:
  print("$", " ".join(cmd), flush=True)
  with open(log_path, "a") as log:
    proc = subprocess.run(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)
  if proc.returncode:
    raise RuntimeError(f"command failed (exit {proc.returncode}); see {log_path}")


def main(argv):
  del argv
  axes = parse_grid(_GRID.value)
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  rows = []
  for combo in itertools.product(*[[(k, v) for v in vs] for k, vs in axes]):
    train_keys = [(k, v) for k, v in combo if not k.startswith("eval.")]
    eval_keys = [(k[len("eval."):], v) for k, v in combo if k.startswith("eval.")]
    train_name = "_".join(f"{k.split('.')[-1]}={v}" for k, v in train_keys) or "base"
    workdir = os.path.join(_OUT_DIR.value, train_name)
    log = os.path.join(_OUT_DIR.value, f"{train_name}.log")
    timing_file = os.path.join(workdir, "train_seconds.txt")
    if not os.path.exists(timing_file):  # train once per distinct training setting
      start = time.time()
      run([sys.executable, "train.py", f"--config={_CONFIG.value}", f"--workdir={workdir}",
           *[f"--config.{k}={v}" for k, v in train_keys], *_EXTRA.value], log)
      with open(timing_file, "w") as f:
        f.write(f"{time.time() - start:.1f}\n")
    train_seconds = float(open(timing_file).read())
    name = "_".join([train_name] + [f"{k}={v}" for k, v in eval_keys])
    json_out = os.path.join(_OUT_DIR.value, f"{name}.json")
    run([sys.executable, "scripts/eval_sudoku.py", f"--ckpt={os.path.join(workdir, 'model')}",
         f"--data={_EVAL_DATA.value}", f"--limit={_EVAL_LIMIT.value}", f"--json_out={json_out}",
         *[f"--{k}={v}" for k, v in eval_keys]], log)
    with open(json_out) as f:
      result = json.load(f)
    result = result.get("diffusion", result)
    rows.append({**dict(combo), "accuracy": result["accuracy"], "cell_accuracy": result["cell_accuracy"],
                 "mean_steps": result["mean_steps"], "train_minutes": round(train_seconds / 60, 1)})
    write_tables(rows)


def write_tables(rows: list[dict]) -> None:
  keys = list(rows[0])
  with open(os.path.join(_OUT_DIR.value, "results.csv"), "w", newline="") as f:
    writer = csv.DictWriter(f, keys)
    writer.writeheader()
    writer.writerows(rows)
  fmt = lambda v: f"{v:.3f}" if isinstance(v, float) else str(v)
  lines = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
  lines += ["| " + " | ".join(fmt(r[k]) for k in keys) + " |" for r in rows]
  with open(os.path.join(_OUT_DIR.value, "results.md"), "w") as f:
    f.write("\n".join(lines) + "\n")
  print("\n".join(lines), flush=True)


if __name__ == "__main__":
  app.run(main)
