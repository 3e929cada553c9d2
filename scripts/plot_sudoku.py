"""PNG plots of a Sudoku run: the diffusion loss per noise level and the held-out puzzle accuracy over training
(both from the run's TensorBoard logs; --compare adds other runs, e.g. the AR baseline, to the accuracy plot),
and puzzle accuracy against the number of denoising steps (evaluated now, with scripts/eval_sudoku.py).

    pip install -e '.[plots]'
    python scripts/plot_sudoku.py --workdir=workdirs/sft_sudoku --compare="AR baseline=workdirs/sft_sudoku_ar" \
        --data=data/sudoku_eval_1000.npz --steps=1,2,4,8,12,24,48 --limit=256 --out_dir=docs/figures
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import matplotlib

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from absl import app, flags  # noqa: E402

from dgemma.training import metrics  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir (tb/ and model/).", required=True)
_DATA = flags.DEFINE_string("data", "", "Held-out puzzles for the accuracy-vs-steps curve ('' to skip it).")
_STEPS = flags.DEFINE_list("steps", ["1", "2", "4", "8", "12", "24", "48"], "Max denoising steps to evaluate.")
_LIMIT = flags.DEFINE_integer("limit", 256, "Puzzles per evaluation.")
_OUT_DIR = flags.DEFINE_string("out_dir", "docs/figures", "Where the PNGs go.")
_COMPARE = flags.DEFINE_list("compare", [], "Other runs for the accuracy-over-training plot: LABEL=WORKDIR,...")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def plot_loss_by_noise_level(workdir: str, path: str) -> None:
  scalars = metrics.read_scalars(os.path.join(workdir, "tb"))
  tags = sorted(t for t in scalars if t.startswith("loss_by_t/"))
  if not tags:
    raise ValueError(f"{workdir}/tb has no loss_by_t/* scalars")
  fig, ax = plt.subplots(figsize=(7, 4.5))
  cmap = plt.get_cmap("viridis")
  for i, tag in enumerate(tags):
    steps, values = zip(*sorted(scalars[tag]))
    ax.plot(steps, values, color=cmap(i / max(len(tags) - 1, 1)), label="t " + tag.split("/")[1])
  ax.set_xlabel("training step")
  ax.set_ylabel("diffusion loss (flat CE)")
  ax.set_title("Diffusion loss per noise level")
  ax.legend(fontsize=7, ncol=2)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f"wrote {path}")


def plot_accuracy_during_training(runs: list[tuple[str, str]], path: str) -> None:
  """eval/accuracy (solid) and eval/cell_accuracy (dashed) against the training step, one colour per run."""
  fig, ax = plt.subplots(figsize=(7, 4.5))
  for i, (label, workdir) in enumerate(runs):
    scalars = metrics.read_scalars(os.path.join(workdir, "tb"))
    if "eval/accuracy" not in scalars:
      raise ValueError(f"{workdir}/tb has no eval/accuracy scalars (train with eval.every > 0)")
    for tag, style, what in (("eval/accuracy", "o-", "puzzles solved"), ("eval/cell_accuracy", "s--", "blank cells")):
      steps, values = zip(*sorted(scalars[tag]))
      ax.plot(steps, values, style, color=f"C{i}", label=f"{label}: {what}")
  ax.set_xlabel("training step")
  ax.set_ylabel("accuracy on held-out puzzles")
  ax.set_ylim(0, 1)
  ax.set_title("Held-out accuracy during training")
  ax.legend(fontsize=8)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  print(f"wrote {path}")


def plot_accuracy_vs_steps(workdir: str, data: str, steps: list[int], limit: int, out_dir: str) -> None:
  fixed, adaptive = [], []
  for n in steps:
    for stopping, sink in ((False, fixed), (True, adaptive)):
      json_out = os.path.join(out_dir, f"eval_steps{n}_{'adaptive' if stopping else 'fixed'}.json")
      subprocess.run([sys.executable, "scripts/eval_sudoku.py", f"--ckpt={os.path.join(workdir, 'model')}",
                      f"--data={data}", f"--limit={limit}", f"--max_steps={n}",
                      f"--adaptive_stopping={str(stopping).lower()}", f"--json_out={json_out}"],
                     cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
      with open(json_out) as f:
        r = json.load(f)
      sink.append((n, r["accuracy"], r["mean_steps"]))
  fig, ax = plt.subplots(figsize=(6, 4))
  ax.plot([s for s, _, _ in fixed], [a for _, a, _ in fixed], "o-", label="fixed steps")
  ax.plot([m for _, _, m in adaptive], [a for _, a, _ in adaptive], "s--", label="adaptive stop (x = mean steps)")
  ax.set_xscale("log", base=2)
  ax.set_xlabel("denoising steps")
  ax.set_ylabel("puzzle accuracy")
  ax.set_ylim(0, 1)
  ax.set_title(f"Accuracy vs denoising steps ({limit} held-out puzzles)")
  ax.legend()
  fig.tight_layout()
  path = os.path.join(out_dir, "accuracy_vs_steps.png")
  fig.savefig(path, dpi=120)
  print(f"wrote {path}")


def main(argv):
  del argv
  os.makedirs(_OUT_DIR.value, exist_ok=True)
  plot_loss_by_noise_level(_WORKDIR.value, os.path.join(_OUT_DIR.value, "loss_by_noise_level.png"))
  runs = [("diffusion", _WORKDIR.value)]
  for item in _COMPARE.value:
    if "=" not in item:
      raise app.UsageError(f"--compare expects LABEL=WORKDIR, got {item!r}")
    runs.append(tuple(item.split("=", 1)))
  plot_accuracy_during_training(runs, os.path.join(_OUT_DIR.value, "accuracy_during_training.png"))
  if _DATA.value:
    plot_accuracy_vs_steps(_WORKDIR.value, _DATA.value, [int(s) for s in _STEPS.value], _LIMIT.value, _OUT_DIR.value)


if __name__ == "__main__":
  app.run(main)
