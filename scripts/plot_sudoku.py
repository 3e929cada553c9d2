"""PNG plots of a Sudoku run: the diffusion loss per noise level over training (from TensorBoard), and puzzle
accuracy against the number of denoising steps (evaluated now, with scripts/eval_sudoku.py).

    pip install -e '.[plots]'
    python scripts/plot_sudoku.py --workdir=workdirs/sft_sudoku --data=data/sudoku_eval_1000.npz \
        --steps=1,2,4,8,12,24,48 --limit=256 --out_dir=assets/plots
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from absl import app, flags  # noqa: E402

from dgemma.training import metrics  # noqa: E402

_WORKDIR = flags.DEFINE_string("workdir", None, "Training workdir (tb/ and model/).", required=True)
_DATA = flags.DEFINE_string("data", "", "Held-out puzzles for the accuracy-vs-steps curve ('' to skip it).")
_STEPS = flags.DEFINE_list("steps", ["1", "2", "4", "8", "12", "24", "48"], "Max denoising steps to evaluate.")
_LIMIT = flags.DEFINE_integer("limit", 256, "Puzzles per evaluation.")
_OUT_DIR = flags.DEFINE_string("out_dir", "assets/plots", "Where the PNGs go.")

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
  if _DATA.value:
    plot_accuracy_vs_steps(_WORKDIR.value, _DATA.value, [int(s) for s in _STEPS.value], _LIMIT.value, _OUT_DIR.value)


if __name__ == "__main__":
  app.run(main)
