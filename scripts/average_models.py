"""Write the uniform average of the weights of several checkpoints of one model (a "model soup" of points along one
training trajectory, e.g. the last checkpoints of a run and of the run it continued):

    python scripts/export_model.py --workdir=workdirs/RUN --step=2500 --out=workdirs/RUN/model_2500
    python scripts/average_models.py --ckpt=workdirs/sft_sudoku_14200_rb10/model,workdirs/RUN/model_2500,workdirs/RUN/model \
        --out=workdirs/soup

The sampler settings and task recorded in the output are the first checkpoint's.
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402

FLAGS = flags.FlagValues()
_D = dict(flag_values=FLAGS)
flags.DEFINE_list("ckpt", None, "Two or more checkpoints of the same model (ours, training workdirs or HF "
                  "directories), comma-separated.", **_D)
flags.DEFINE_string("out", None, "Output directory (our inference checkpoint).", **_D)


def run() -> int:
  import jax
  import jax.numpy as jnp

  from dgemma import checkpoints, loading, tasks
  if not FLAGS.ckpt or len(FLAGS.ckpt) < 2 or not FLAGS.out:
    raise ValueError("--ckpt needs two or more checkpoints and --out is required")
  config, total, metadata = loading.load_model(FLAGS.ckpt[0])
  dtypes = jax.tree.map(lambda a: a.dtype, total)
  total = jax.tree.map(lambda a: a.astype(jnp.float32), total)
  for path in FLAGS.ckpt[1:]:
    other_config, params, _ = loading.load_model(path)
    if other_config != config:
      raise ValueError(f"{path} is a different model from {FLAGS.ckpt[0]} (their configs differ); only checkpoints "
                       "of one model can be averaged")
    total = jax.tree.map(lambda t, p: t + p.astype(jnp.float32), total, params)
  metadata = tasks.export_files(config, metadata, FLAGS.ckpt[0], FLAGS.out)  # (its tokenizer file, if any)
  average = jax.tree.map(lambda t, d: (t / len(FLAGS.ckpt)).astype(d), total, dtypes)
  checkpoints.save_model(FLAGS.out, config, average,
                         {**metadata, "averaged_from": [os.path.abspath(p) for p in FLAGS.ckpt]})
  print(f"wrote the average of {len(FLAGS.ckpt)} checkpoints to {FLAGS.out}")
  return 0


def main(argv: list[str]) -> int:
  return cli.run_main(argv, __doc__, run, FLAGS)


if __name__ == "__main__":
  cli.exit(main(sys.argv))
