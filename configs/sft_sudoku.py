"""Sudoku SFT.

    python train.py --config=configs/sft_sudoku.py --workdir=workdirs/sudoku          # CPU default
    python train.py --config=configs/sft_sudoku.py:size=debug --workdir=/tmp/dbg      # seconds, for tests
    python train.py --config=configs/sft_sudoku.py --config.optimizer.learning_rate=3e-4 ...

The CPU default trains a small dense model from scratch on the compact digit vocabulary: prompt
[BOS, 81 puzzle cells] encoded causally, an 81-cell canvas denoised bidirectionally.
"""

from __future__ import annotations

import ml_collections

from dgemma.data import sudoku_task
from dgemma.training.config_utils import parse_arg

SIZES = {  # width, layers, heads, batch, steps
    "debug": (32, 2, 2, 4, 6),
    "small": (128, 6, 4, 64, 3000),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_arg(arg, size="small")
  if args.size not in SIZES:
    raise ValueError(f"unknown size {args.size!r}; choose from {sorted(SIZES)}")
  width, layers, heads, batch, steps = SIZES[args.size]
  c = ml_collections.ConfigDict()
  c.seed = 42
  c.num_train_steps = steps
  c.batch_size = batch
  c.log_every = 1 if args.size == "debug" else 25
  c.checkpoint_every = 3 if args.size == "debug" else 500
  c.keep_checkpoints = 3
  c.init_from = ""  # an HF DiffusionGemma directory, one of our checkpoints, or a training workdir

  c.model_preset = "small_dense"
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=sudoku_task.DIGIT_VOCAB_SIZE, width=width, num_layers=layers, num_heads=heads,
      canvas_length=81, stop_ids=(sudoku_task.EOS_ID,), remat=False))

  c.data = ml_collections.ConfigDict(dict(
      task="sudoku_digits", prompt_len=sudoku_task.PROMPT_CONTENT_LEN,
      num_train=200 if args.size == "debug" else 20_000, seed=0, min_clues=22, max_clues=36,
      csv="",  # train on a CSV (puzzle,solution or quizzes,solutions) instead of generated puzzles
      cache_dir="~/.cache/dgemma/sudoku", augment=True))

  c.diffusion = ml_collections.ConfigDict(dict(
      schedule="linear", t_eps=1e-4, loss="flat_ce", self_cond_prob=0.5,
      diffusion_loss_weight=1.0, ar_loss_weight=1.0, num_noise_bins=10))

  c.optimizer = ml_collections.ConfigDict(dict(
      name="adam", learning_rate=1e-3, end_learning_rate=1e-4, warmup_steps=100 if steps > 100 else 1,
      decay_steps=steps, b1=0.95, b2=0.99, eps=1e-8, weight_decay=1e-4, grad_clip_norm=1.0,
      master_dtype="float32"))

  c.lora_rank = 0  # > 0: train LoRA adapters of this rank instead of all weights
  return c
