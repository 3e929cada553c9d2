"""Write an untrained (randomly initialised) model of a training config, e.g. the "base" row of a results table.

    python scripts/init_model.py --config=configs/sft_sudoku.py --out=workdirs/sudoku_untrained
"""

from __future__ import annotations

import os
import sys

import jax
from absl import app, flags
from ml_collections import config_flags

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from dgemma import checkpoints, model, tasks  # noqa: E402
from dgemma.training.config_utils import model_config, sampling_metadata  # noqa: E402

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file.")
_OUT = flags.DEFINE_string("out", None, "Output directory (our inference checkpoint).", required=True)


def main(argv):
  del argv
  c = _CONFIG.value
  if c is None:
    raise app.UsageError("--config is required, e.g. --config=configs/sft_sudoku.py")
  config = model_config(c.model_preset, c.model.to_dict())
  params = model.init_params(config, jax.random.key(c.seed))
  task = {"task": tasks.for_config(c, config).export_files(_OUT.value)}  # (with its tokenizer file, if any)
  task.update(sampling_metadata(c))  # as train.py records it: the untrained row of a table is sampled alike
  checkpoints.save_model(_OUT.value, config, params, task)
  print(f"wrote an untrained {config.num_layers}-layer model to {_OUT.value}")


if __name__ == "__main__":
  app.run(main)
