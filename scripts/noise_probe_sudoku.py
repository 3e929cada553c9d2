"""One denoiser pass at fixed noise levels: how much of a Sudoku a checkpoint can read off a corrupted canvas.

For each noise level t the solution canvas is corrupted as in training (each cell replaced by a uniform random
token with probability t), denoised once, and scored on the blank cells: argmax accuracy, the share of blanks the
model is confident about (entropy < --confident) and how often those confident cells are right. A model that
"repairs light noise but cannot start from noise" shows high accuracy at small t and none at t = 1; the sampler
needs confident, correct cells at high t to get going.

    python scripts/noise_probe_sudoku.py --ckpt=workdirs/sft_sudoku --data=data/sudoku_eval_1000.npz --limit=128
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402

_D = dict(flag_values=flags.FLAGS)
flags.DEFINE_string("ckpt", None, "A Sudoku checkpoint (task sudoku_digits) or training workdir.", **_D)
flags.DEFINE_string("data", None, "Puzzles: a .csv or an .npz from scripts/make_sudoku_data.py.", **_D)
flags.DEFINE_integer("limit", 128, "Puzzles used (0: all).", **_D)
flags.DEFINE_list("t", ["1.0", "0.9", "0.7", "0.5", "0.3", "0.1"], "Noise levels.", **_D)
flags.DEFINE_float("confident", 0.1, "Entropy (nats) below which a cell counts as confident.", **_D)
flags.DEFINE_integer("seed", 0, "Random seed of the corruption.", **_D)
FLAGS = flags.FLAGS


def probe(params, config, puzzles, solutions, noise_levels, confident: float, seed: int,
          position_features=None) -> list[dict]:
  import jax
  import jax.numpy as jnp
  import numpy as np

  from dgemma import model
  from dgemma.tasks.sudoku import digits as sudoku_task
  from dgemma.diffusion import corruption

  batch = sudoku_task.encode_batch(puzzles, solutions, prompt_len=sudoku_task.PROMPT_CONTENT_LEN,
                                   canvas_len=config.canvas_length)
  prompt, canvas = jnp.asarray(batch["prompt"]), jnp.asarray(batch["canvas"])
  b = prompt.shape[0]
  _, cache = model.encode(params, config, prompt, model.init_cache(config, b, prompt.shape[1]),
                          position_features=position_features)
  denoise = jax.jit(lambda x: model.denoise(params, config, x, cache, position_features=position_features))
  blank = np.zeros(np.asarray(canvas).shape, bool)
  blank[:, :81] = np.asarray(puzzles) == 0
  rows = []
  for i, t in enumerate(noise_levels):
    x_t, _ = corruption.corrupt(jax.random.key(seed + i), canvas, jnp.full((b,), 1.0 - t), config.vocab_size)
    logits = denoise(x_t)
    right = np.asarray(jnp.argmax(logits, -1) == canvas)
    logp = jax.nn.log_softmax(logits, -1)
    entropy = np.asarray(-jnp.sum(jnp.exp(logp) * logp, -1))
    sure = (entropy < confident) & blank
    rows.append({"t": t, "blank_accuracy": float(right[blank].mean()), "confident": float(sure.sum() / blank.sum()),
                 "confident_precision": float(right[sure].mean()) if sure.any() else float("nan")})
  return rows


def run() -> int:
  import numpy as np

  from dgemma.loading import load_model
  from dgemma.tasks.sudoku import task as sudoku_solver
  from scripts.eval_sudoku import load_data

  if not FLAGS.ckpt or not FLAGS.data:
    raise ValueError("--ckpt and --data are required")
  config, params, metadata = load_model(FLAGS.ckpt)
  task = sudoku_solver.load_task(config, metadata, FLAGS.ckpt)
  if task.name != "sudoku_digits":
    raise ValueError(f"{FLAGS.ckpt}: the probe reads digit-vocabulary Sudoku models, not {task.name!r}")
  data = load_data(FLAGS.data, FLAGS.limit)
  rows = probe(params, config, np.asarray(data["puzzle"]), np.asarray(data["solution"]),
               [float(t) for t in FLAGS.t], FLAGS.confident, FLAGS.seed, metadata.get("position_features"))
  print(f"{len(data['puzzle'])} puzzles, one denoiser pass, blank cells only")
  print("| noise t | argmax right | confident (H < %.2g) | confident and right |" % FLAGS.confident)
  print("|---|---|---|---|")
  for r in rows:
    precision = "-" if r["confident_precision"] != r["confident_precision"] else f"{r['confident_precision']:.1%}"
    print(f"| {r['t']:.1f} | {r['blank_accuracy']:.1%} | {r['confident']:.1%} | {precision} |")
  return 0


def main(argv: list[str]) -> int:
  return cli.run_main(argv, __doc__, run, FLAGS)


if __name__ == "__main__":
  cli.exit(main(sys.argv))
