"""Sudoku SFT from scratch: the CPU default. Results and the runs behind each choice: docs/sudoku.md.

COMMAND:
    python train.py --config=configs/sft_sudoku.py                          # small model, ~an hour on 2 cores
    python train.py --config=configs/sft_sudoku.py:size=debug --workdir=/tmp/dbg    # seconds, for tests
    python train.py --config=configs/sft_sudoku.py:size=large               # the headline attempt (GPU)
    python train.py --config=configs/sft_sudoku.py:objective=ar             # autoregressive baseline
    python train.py --config=configs/sft_sudoku.py:official=true            # the official objective
    python train.py --config=configs/sft_sudoku.py:positions=absolute       # plain learned positions

Other recipes: configs/sudoku/official.py (a real DiffusionGemma checkpoint, LoRA or full fine-tuning),
configs/sudoku/gemma3_270m.py (pretrained Gemma 3 270M, diffusionized on load).
"""

from __future__ import annotations

import ml_collections

from dgemma import sharding
from dgemma.tasks.sudoku import digits
from dgemma.training.config_utils import parse_arg

SIZES = {  # width, layers, heads, batch, steps
    "debug": (32, 2, 2, 4, 6),
    "small": (128, 6, 4, 48, 2200),
    "large": (256, 8, 8, 64, 10000),
}


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_arg(arg, size="small", official=False, positions="cells", objective="diffusion")
  if args.size not in SIZES:
    raise ValueError(f"unknown size {args.size!r}; choose from {sorted(SIZES)}")
  if args.objective not in ("diffusion", "ar"):
    raise ValueError(f"unknown objective {args.objective!r}; choose 'diffusion' or 'ar'")
  if args.positions not in ("cells", "absolute"):
    raise ValueError(f"unknown positions {args.positions!r}; choose 'cells' or 'absolute'")
  width, layers, heads, batch, steps = SIZES[args.size]
  debug = args.size == "debug"
  c = ml_collections.ConfigDict()
  c.seed = 42
  c.num_train_steps = steps
  c.batch_size = batch
  c.log_every = 1 if debug else 25
  c.checkpoint_every = 3 if debug else 500
  c.keep_checkpoints = 3
  c.allow_changes = ""  # keys that may change on resume, e.g. "optimizer.learning_rate" (docs/training.md)
  c.init_from = ""  # an HF DiffusionGemma directory, one of our checkpoints, or a training workdir

  c.task = ml_collections.ConfigDict(dict(name="sudoku_digits"))  # dgemma/tasks registry key

  c.model_preset = "small_dense"
  cells = args.positions == "cells"
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=digits.DIGIT_VOCAB_SIZE, width=width, num_layers=layers, num_heads=heads, mlp_hidden=4 * width,
      canvas_length=81, stop_ids=(digits.EOS_ID,), remat=False,
      matmul_dtype="",  # "bfloat16": bf16 operands, f32 accumulation in the projections
      global_k_eq_v=False,  # separate value projections in the global layers
      global_rope_fraction=1.0,  # RoPE on every frequency pair
      # cells: segment + row + column + box embeddings and a learned bias per shared feature; absolute: one per position
      **(dict(learned_positions=digits.CELL_POSITION_ROWS, num_position_features=4, relation_bias=True) if cells
         else dict(learned_positions=digits.PROMPT_CONTENT_LEN + 81))))
  # The model's [positions, 4] feature table (an array input of the model, recorded in its checkpoint)
  c.position_features = digits.cell_position_features() if cells else ()

  c.data = ml_collections.ConfigDict(dict(
      prompt_len=digits.PROMPT_CONTENT_LEN,
      num_train=200 if debug else 20_000, seed=0, min_clues=22, max_clues=36,
      csv="",  # train on a CSV (puzzle,solution or quizzes,solutions) instead of generated puzzles
      skip_bad_rows=False,  # a CSV row that breaks the rules: False refuses the file, True skips the row
      cache_dir="~/.cache/dgemma/sudoku", augment=True,
      search_repeat=1,  # > 1: each puzzle that needs search appears that many times per epoch
      tokenizer=""))  # sudoku_text only: a tokenizer file/directory (default: the init_from directory)

  official = args.official
  c.diffusion = ml_collections.ConfigDict(dict(
      schedule="linear", t_eps=1e-4, loss="flat_ce", num_noise_bins=10, diffusion_loss_weight=1.0,
      t_tilt=0.0 if official else 1.0,  # noise levels drawn with density ~ t^t_tilt (0: uniform, official)
      t_tilt_steps=0 if official else 1000,  # the tilt rises linearly from 0 over these steps
      noise_draws=1,  # > 1: each example denoised at that many noise levels against one prompt encoding
      self_cond_prob=0.5,  # self-conditioning on half the examples, as the official recipe
      ar_loss_weight=1.0 if official else 0.0,  # the official AR loss
      self_cond_passes=1 if official else 2,  # no-gradient passes before the scored one (official: 1)
      ar_targets="all",  # "canvas": the AR loss only on the canvas
      ordered_noise_prob=0.0,  # share of examples corrupted in the order a solver deduces the cells
      loss_chunk_tokens=0,  # > 0: the losses from the hidden states, this many tokens at a time (a memory knob)
      cache_gradient=True))  # False: the denoiser's loss does not train the encoder pass (a stop-gradient)
  if args.objective == "ar":  # same backbone and data, causal, left to right
    c.diffusion.update(dict(diffusion_loss_weight=0.0, ar_loss_weight=1.0, ar_targets="canvas",
                            self_cond_prob=0.0))

  # Held-out puzzle accuracy (generated from eval.seed) every `every` steps, logged as eval/*; 0: off.
  c.eval = ml_collections.ConfigDict(dict(every={"debug": 0, "small": 550}.get(args.size, 1000), num_puzzles=128,
                                          seed=777, max_steps=48))

  # The model's own sampling defaults, recorded in its checkpoint (sample.py and the evaluations use them).
  c.sampler = ml_collections.ConfigDict(dict(t_max=1.5, t_min=1.2, confidence_threshold=0.05, restart_after=16))

  c.optimizer = ml_collections.ConfigDict(dict(
      name="adam",  # "adam", "factored_rms" or "muon" (Muon on the weight matrices, Adam on the rest)
      muon_lr_multiplier=1.0,
      learning_rate=3e-3, end_learning_rate=3e-4, warmup_steps=100 if steps > 100 else 1,
      decay_steps=steps, b1=0.95, b2=0.99, eps=1e-8, weight_decay=1e-4, grad_clip_norm=1.0,
      master_dtype="float32",
      ema_decays=(),  # e.g. (0.995, 0.999): moving averages, evaluated and exported as model_ema<decay>/
      # update multipliers by parameter name: the relation bias must travel far from 0
      lr_multipliers=ml_collections.ConfigDict(dict(relation_bias=10.0) if cells else {})))
  c.lora_rank = 0  # > 0: train LoRA adapters of this rank instead of all weights

  # Scale-out (dgemma/sharding.py): mesh sizes multiply to the device count, -1 takes the rest.
  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))
  c.sharding_rules = sharding.DEFAULT_RULES  # parameters' logical axes -> mesh axes
  return c
