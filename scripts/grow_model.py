"""Write a deeper copy of a trained model that computes exactly the same logits (dgemma/grow.py), to train on with
`init_from` and the new depth:

    python scripts/grow_model.py --ckpt=workdirs/sft_sudoku_default2500_long4/model --out=workdirs/sudoku_grown12   # 6 -> 12
    python scripts/grow_model.py --ckpt=CKPT --out=OUT --insert_after=1,3,5                           # 6 -> 9
    python train.py --config=configs/sft_sudoku.py --config.init_from=workdirs/sudoku_grown12 \
        --config.model.num_layers=12 ...
"""

from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402

FLAGS = flags.FlagValues()
_D = dict(flag_values=FLAGS)
flags.DEFINE_string("ckpt", None, "The model to grow (our checkpoint, a training workdir or an HF directory).", **_D)
flags.DEFINE_string("out", None, "Output directory (our inference checkpoint).", **_D)
flags.DEFINE_list("insert_after", None, "0-based layers to insert a copy after (default: every layer, doubling "
                  "the depth).", **_D)


def run() -> int:
  from dgemma import checkpoints, grow, loading, tasks
  if not FLAGS.ckpt or not FLAGS.out:
    raise ValueError("--ckpt and --out are required")
  config, params, metadata = loading.load_model(FLAGS.ckpt)
  try:
    insert_after = ([int(i) for i in FLAGS.insert_after] if FLAGS.insert_after is not None
                    else list(range(config.num_layers)))
  except ValueError:
    raise ValueError(f"--insert_after must be comma-separated layer indices, got {','.join(FLAGS.insert_after)}")
  metadata = tasks.export_files(config, metadata, FLAGS.ckpt, FLAGS.out)  # (its tokenizer file, if any)
  grown_config, grown_params = grow.grow_depth(config, params, insert_after)
  checkpoints.save_model(FLAGS.out, grown_config, grown_params,
                         {**metadata, "grown_from": os.path.abspath(FLAGS.ckpt), "inserted_after": insert_after})
  print(f"wrote a {grown_config.num_layers}-layer copy of the {config.num_layers}-layer {FLAGS.ckpt} to {FLAGS.out} "
        f"(train it with --config.init_from={FLAGS.out} --config.model.num_layers={grown_config.num_layers})")
  return 0


def main(argv: list[str]) -> int:
  return cli.run_main(argv, __doc__, run, FLAGS)


if __name__ == "__main__":
  cli.exit(main(sys.argv))
