"""Write the inference checkpoint of any saved step of a training run (or of one of its moving averages), e.g. to
evaluate a run mid-way with scripts/eval_sudoku.py.

    python scripts/export_model.py --workdir=workdirs/RUN --step=2000 --out=workdirs/RUN/model_2000
    python scripts/export_model.py --workdir=workdirs/RUN --step=2000 --ema=0.995 --out=workdirs/RUN/model_2000_ema
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402

FLAGS = flags.FlagValues()
_D = dict(flag_values=FLAGS)
flags.DEFINE_string("workdir", None, "A training workdir (with checkpoints/ and run.json).", **_D)
flags.DEFINE_integer("step", None, "The checkpoint step (default: the latest).", **_D)
flags.DEFINE_float("ema", None, "Export the run's moving average of this decay instead of the weights.", **_D)
flags.DEFINE_string("out", None, "Output directory (our inference checkpoint).", **_D)


def run() -> int:
  from dgemma import checkpoints, tasks
  from dgemma.training import checkpointing
  if not FLAGS.workdir or not FLAGS.out:
    raise ValueError("--workdir and --out are required")
  if not os.path.isdir(os.path.join(FLAGS.workdir, "checkpoints")):
    raise ValueError(f"{FLAGS.workdir} is not a training workdir (no checkpoints/)")
  saved = checkpointing.Checkpointer(FLAGS.workdir).all_steps()
  if FLAGS.step is not None and FLAGS.step not in saved:
    raise ValueError(f"{FLAGS.workdir} has no checkpoint at step {FLAGS.step} (saved: {saved or 'none'})")
  config, params, metadata = checkpointing.load_inference(FLAGS.workdir, FLAGS.step, FLAGS.ema)
  metadata = tasks.export_files(config, metadata, FLAGS.workdir, FLAGS.out)  # (its tokenizer file, if any)
  checkpoints.save_model(FLAGS.out, config, params, metadata)
  which = f"moving average (decay {FLAGS.ema:g})" if FLAGS.ema is not None else "weights"
  print(f"wrote the {which} of {FLAGS.workdir} at step {FLAGS.step or max(saved)} to {FLAGS.out}")
  return 0


def main(argv: list[str]) -> int:
  return cli.run_main(argv, __doc__, run, FLAGS)


if __name__ == "__main__":
  cli.exit(main(sys.argv))
