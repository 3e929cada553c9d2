"""The official Sudoku SFT recipe on a real DiffusionGemma checkpoint, in the official text format.

COMMAND:
    python train.py --config=configs/sudoku/official.py:init=/ckpt/diffusiongemma-26B-A4B-it           # LoRA r8
    python train.py --config=configs/sudoku/official.py:init=/ckpt/diffusiongemma-26B-A4B-it,lora=0    # full FT

The model and the tokenizer come from the checkpoint; prompt 256 tokens, canvas 256 (spec §6). The objective is
configs/sft_sudoku.py's with `official=true`; below, every section this recipe sets differently.
"""

from __future__ import annotations

import ml_collections

from configs import sft_sudoku
from dgemma.training.config_utils import parse_arg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_arg(arg, init="", lora=8, size="small")
  if not args.init:
    raise ValueError("configs/sudoku/official.py needs init=DIR (a DiffusionGemma checkpoint)")
  full = args.lora == 0
  c = sft_sudoku.get_config(f"size={args.size},official=true")
  c.init_from = args.init
  c.task.name = "sudoku_text"
  c.data.prompt_len = 256
  c.model = ml_collections.ConfigDict(dict(remat=True, stop_ids=(1, 106, 50)))  # the rest from the checkpoint
  c.batch_size = 8 if full else 2
  c.num_train_steps, c.checkpoint_every, c.keep_checkpoints, c.log_every = 2000, 1000, 5, 10
  c.lora_rank = args.lora
  c.optimizer.update(dict(name="factored_rms" if full else "adam", learning_rate=1.5e-4,
                          end_learning_rate=1.5e-5, warmup_steps=1000 if full else 100, decay_steps=2000))
  c.optimizer.lr_multipliers = ml_collections.ConfigDict()  # real checkpoints have no relation bias
  c.eval.every = 0  # evaluate the saved model with scripts/eval_sudoku.py
  c.sampler = ml_collections.ConfigDict()  # the checkpoint keeps its own sampler defaults
  return c
