"""Generate with a DiffusionGemma checkpoint: text for language models, the task's answer for task models.

  python sample.py --ckpt=PATH --prompt="Why is the sky blue?"
  python sample.py --ckpt=PATH --prompt_ids=2,105,4368 --steps=32 --t_max=0.6
  python sample.py --ckpt=TASK_CKPT --prompt=530070000600195000098000060800060003400803001700020006060000280000419005000080079
  python sample.py --ckpt=TASK_CKPT --prompt=... --steps=8 --samples=16   # answer: the first draw the task accepts
  python sample.py --ckpt=PATH --prompts_file=prompts.txt --show_steps --show_steps_html=steps.html
  python sample.py --ckpt=PATH --prompt="Why is the sky blue?" --stream   # watch the canvas converge live
  python sample.py --ckpt=PATH --prompts_file=in.jsonl --output=out.jsonl --batch_size=8
  python sample.py --ckpt=AR_TEXT_CKPT --prompt="Why is the sky blue?"   # objective=ar: greedy, causal

PATH is one of our checkpoints (dgemma.json), an HF DiffusionGemma directory or a training workdir. Text goes
through the checkpoint's tokenizer (its chat template for instruction models, see --chat); a checkpoint trained
on a task (dgemma/tasks, named in its metadata) takes the task's prompts and shows its answers. Every sampler knob
has a flag; the defaults are the released model's. A prompts file named *.jsonl holds one JSON object per line
({"prompt": ...} or {"messages": [...]}) and gives one JSON line per prompt (prompt, completion, tokens, steps),
to --output or, without it, to stdout (the summary then goes to stderr); --output works with any prompts.
A text checkpoint trained with objective=ar (its denoiser never trained) is decoded autoregressively, greedy
through the causal encoder, as its training samples are (--decode).
"""

from __future__ import annotations

import os
import sys
import time

from absl import flags

from dgemma import cli
from dgemma.config import MOE_IMPLS
from dgemma.cpu import huge_pages
from dgemma.sampling import flags as sampler_flags

FLAGS = flags.FlagValues()  # private: this module can be imported next to other scripts
_D = dict(flag_values=FLAGS)
flags.DEFINE_string("ckpt", None, "Checkpoint: our format, an HF directory, or a training workdir.", **_D)
flags.DEFINE_string("prompt", None, "A text prompt, or an input in the task's format for task models.", **_D)
flags.DEFINE_string("prompt_ids", None, "Token ids instead of text, comma-separated; ';' separates prompts.",
                    **_D)
flags.DEFINE_string("prompts_file", None, "A file with one prompt (or task input) per line; *.jsonl: one JSON "
                    "object per line, {\"prompt\": ...} or {\"messages\": [...]}.", **_D)
flags.DEFINE_string("output", None, "Write one JSON line per prompt here (prompt, completion, tokens, steps).", **_D)
flags.DEFINE_integer("batch_size", 0, "Prompts (rows) per batch, one compiled program for all batches; 0: all "
                     "in one batch. A prompt's sample does not depend on it.", **_D)
flags.DEFINE_enum("chat", "auto", ["auto", "on", "off"],
                  "Wrap text prompts in the chat template: a text checkpoint's recorded one (Gemma 3 or 4), else "
                  "the tokenizer's (auto: when there is one; on: an error without one; off: plain BOS + prompt).",
                  **_D)
flags.DEFINE_bool("stream", False, "Show the canvas converging live while it is sampled (on stderr; a host "
                  "callback compiled into the sampling loop only with this flag).", **_D)
# One flag per sampler knob (--steps, --t_max, ...; dgemma/sampling/flags.py), unset by default: a knob left unset
# takes the checkpoint's recorded default, else SamplerConfig's (in brackets). --show_steps* ask for the trajectory.
_KNOBS = sampler_flags.define(FLAGS, skip=("return_trajectory",))
# What autoregressive decoding reads of them: the length (and, for a model without a task, the stop ids).
_AR_KNOBS = ("max_new_tokens", "stop_ids")
flags.DEFINE_enum("decode", "auto", ["auto", "diffusion", "autoregressive"],
                  "How a language model generates. diffusion: the block-diffusion sampler. autoregressive: greedy, "
                  "one token per pass of the causal encoder, up to --max_new_tokens (default: a text checkpoint's "
                  "capacity, max_canvases x canvas_length) or a stop id; the encoder of every checkpoint is causal, "
                  "so a diffusion checkpoint takes it too (as good as the next-token loss it trained with, "
                  "ar_loss_weight). auto: autoregressive for a text checkpoint trained with objective=ar "
                  "(diffusion_loss_weight 0), else diffusion. Autoregressive refuses the diffusion-only flags "
                  "(sampler knobs, --samples>1, --stream, --show_*); its JSON lines' \"steps\" is the number of "
                  "tokens it generated, the stop token included (one forward pass each).", **_D)
flags.DEFINE_integer("samples", 1, "Task models: draw each prompt this many times (in one batch) and answer with "
                     "the first draw that passes the task's own check.", **_D)
flags.DEFINE_integer("seed", 0, "Random seed.", **_D)
flags.DEFINE_enum("moe_impl", None, list(MOE_IMPLS),
                  "How to compute the MoE experts (default: the checkpoint's choice). 'dense' runs every "
                  "expert: faster on CPU for models with few experts.", **_D)
flags.DEFINE_enum("matmul_dtype", None, ["bfloat16"],
                  "'bfloat16': hold the weights and activations in float32 and multiply bf16 operands with float32 "
                  "accumulation (for a bf16 checkpoint, its exact weights). On CPUs with AMX (Intel Sapphire "
                  "Rapids and later) about twice as fast as float32 or bfloat16 through XLA:CPU.", **_D)
flags.DEFINE_integer("max_cache_len", 32768, "Largest KV cache (prompt + generated tokens) to allow.", **_D)
flags.DEFINE_bool("show_steps", False, "Show the canvas converging step by step in the terminal.", **_D)
flags.DEFINE_string("show_steps_html", None, "Also write the step-by-step animation to this HTML file.", **_D)
flags.DEFINE_string("show_steps_gif", None, "Also write it as a GIF (needs Pillow).", **_D)
flags.DEFINE_float("show_steps_delay", 0.08, "Seconds per frame of the animations.", **_D)
flags.DEFINE_integer("show_row", 0, "Which prompt of a batch the step-by-step views show.", **_D)
flags.DEFINE_string("coordinator_address", None,
                    "Multi-process runs: host:port of process 0 (default: from the cluster environment).", **_D)
flags.DEFINE_integer("num_processes", None, "Multi-process runs: the number of processes.", **_D)
flags.DEFINE_integer("process_id", None, "Multi-process runs: this process's index.", **_D)


class TextTokenizer:
  """The checkpoint's tokenizer for text prompts.

  transformers' AutoTokenizer where the checkpoint has a tokenizer_config.json (that is where HF keeps the
  chat template); otherwise the project's tokenizer (`dgemma.data.tokenizer`: tokenizer.json, SentencePiece or
  GGUF) with BOS first and, as chat template, Gemma 4's or Gemma 3's by the turn markers the vocabulary has
  (dgemma/tasks/text/chat.py). A prompt is text (one user turn) or a conversation (`chat.Turn`s).
  """

  def __init__(self, path: str):
    from dgemma.data.tokenizer import load_tokenizer
    from dgemma.tasks.text import chat
    self.hf = self.base = self._pieces = None
    self.template = "none"
    if os.path.exists(os.path.join(path, "tokenizer_config.json")):
      try:
        from transformers import AutoTokenizer
        self.hf = AutoTokenizer.from_pretrained(path)
      except ImportError:
        pass
    if self.hf is None:
      self.base = load_tokenizer(path)
      self.template = chat.resolve("auto", self.base)
      if self.base.path.endswith(".json"):  # token strings for the step-by-step display
        import tokenizers
        self._pieces = tokenizers.Tokenizer.from_file(self.base.path)
    vocab = self.hf.get_vocab() if self.hf is not None else (self._pieces.get_vocab() if self._pieces else {})
    self._marker = next((m for m in ("▁", "Ġ") if any(k.startswith(m) for k in vocab)), None)

  @property
  def chat_template(self) -> bool:
    if self.hf is not None:
      return bool(getattr(self.hf, "chat_template", None))
    return self.template != "none"

  def encode(self, prompt, chat: bool) -> list[int]:
    from dgemma.tasks.text import chat as chat_lib
    turns = prompt if isinstance(prompt, tuple) else (chat_lib.Turn("user", prompt),)
    chat_lib.check(turns, need_response=False)
    if self.hf is not None:
      if chat:
        ids = self.hf.apply_chat_template([{"role": t.role, "content": t.content} for t in turns],
                                          add_generation_prompt=True, tokenize=True)
        return list(ids["input_ids"] if hasattr(ids, "keys") else ids)
      if len(turns) != 1:
        raise ValueError("a conversation of several turns needs the chat template (not --chat=off)")
      return list(self.hf(turns[0].content)["input_ids"])
    return chat_lib.encode_prompt(self.template if chat else "none", turns, self.base)

  def decode(self, ids: list[int]) -> str:
    if self.hf is not None:
      return self.hf.decode(ids, skip_special_tokens=True)
    return self.base.decode(ids, skip_special=True)

  def piece(self, token: int) -> str:
    """One token as display text (word-piece markers turned back into spaces)."""
    if self.hf is None and self._pieces is None:
      return self.base.decode([int(token)])
    text = (self.hf.convert_ids_to_tokens(int(token)) if self.hf is not None
            else self._pieces.id_to_token(int(token))) or f"<{token}>"
    if len(text) == 6 and text.startswith("<0x") and text.endswith(">"):  # byte fallback
      byte = int(text[3:5], 16)
      return chr(byte) if byte == 10 or 32 <= byte < 127 else "·"
    if self._marker is None:
      return text + " "
    return text.replace(self._marker, " ").replace("Ċ", "\n")


def _tokenizer_for(path: str) -> TextTokenizer | None:
  import glob

  from dgemma.data.tokenizer import TOKENIZER_FILE_NAMES
  if path.endswith(".gguf") and os.path.isfile(path):  # a GGUF file carries its own vocabulary
    return TextTokenizer(path)
  if not os.path.isdir(path):
    return None
  if not any(glob.glob(os.path.join(glob.escape(path), name)) for name in TOKENIZER_FILE_NAMES):
    return None
  return TextTokenizer(path)


def _int_list(text: str, what: str) -> list[int]:
  try:
    values = [int(x) for x in text.replace(" ", "").split(",") if x]
  except ValueError:
    raise ValueError(f"{what} must be comma-separated integers, got {text!r}") from None
  if not values:
    raise ValueError(f"{what} is empty")
  return values


def _jsonl_prompts() -> bool:
  return FLAGS.prompts_file is not None and FLAGS.prompts_file.endswith(".jsonl")


def _prompts() -> tuple[list, list[str]]:
  """(prompts, where each comes from: "" for a flag, "FILE: line N: " for a line of --prompts_file). A prompt is
  a string, or for a *.jsonl file a `prompt_file.Prompt`."""
  given = [n for n in ("prompt", "prompt_ids", "prompts_file") if FLAGS[n].value is not None]
  if len(given) != 1:
    raise ValueError("give exactly one of --prompt, --prompt_ids or --prompts_file")
  if FLAGS.prompt is not None:
    return [FLAGS.prompt], [""]
  if FLAGS.prompt_ids is not None:
    prompts = [p for p in FLAGS.prompt_ids.split(";") if p.strip()]
    if not prompts:
      raise ValueError("--prompt_ids has no prompts")
    return prompts, [f"--prompt_ids prompt {i}: " for i in range(1, len(prompts) + 1)]
  if not os.path.isfile(FLAGS.prompts_file):
    raise ValueError(f"prompts file {FLAGS.prompts_file} does not exist")
  if _jsonl_prompts():
    from dgemma.tasks.text import prompt_file
    records = prompt_file.read(FLAGS.prompts_file)
    return records, [f"{r.where}: " for r in records]
  try:
    with open(FLAGS.prompts_file, encoding="utf-8") as f:
      numbered = [(n, line.rstrip("\n")) for n, line in enumerate(f, 1) if line.strip()]
  except UnicodeDecodeError as e:
    raise ValueError(f"prompts file {FLAGS.prompts_file} is not UTF-8 text ({e.reason} at byte {e.start})") from None
  if not numbered:
    raise ValueError(f"prompts file {FLAGS.prompts_file} has no prompts")
  return [line for _, line in numbered], [f"{FLAGS.prompts_file}: line {n}: " for n, _ in numbered]


def _parsed(task, prompt, where: str):
  """The task's input for one prompt (a conversation: the turns, for a text checkpoint); a refusal names the
  prompt's line of --prompts_file."""
  import numpy as np
  if getattr(prompt, "messages", None) is not None:
    if task.name != "text":
      raise ValueError(f"{where}\"messages\" needs a language model, not a {task.title} checkpoint")
    conversation = np.empty((), object)
    conversation[()] = prompt.messages
    return conversation
  try:
    return task.parse_prompt(getattr(prompt, "text", prompt))
  except ValueError as e:
    raise ValueError(f"{where}{e}") from None


def _encoded(encode, item, where: str):
  try:
    return encode(item)
  except ValueError as e:
    raise ValueError(f"{where}{e}") from None


def _sampler_config(metadata: dict | None = None):
  """The sampler knobs: the flags, else the checkpoint's recorded defaults, else SamplerConfig's."""
  return sampler_flags.sampler_config(
      FLAGS, metadata, return_trajectory=bool(FLAGS.show_steps or FLAGS.show_steps_html or FLAGS.show_steps_gif))


def _load(path: str):
  from dgemma.loading import load_model
  if not os.path.exists(path):
    raise ValueError(f"checkpoint {path} does not exist")
  try:
    return load_model(path)
  except Exception as e:  # a corrupt checkpoint can fail in many ways; the user needs one line either way
    message = str(e).splitlines()[0] if str(e) else type(e).__name__
    raise ValueError(f"cannot load checkpoint {path}: {message}") from None


def _autoregressive(task, metadata: dict) -> bool:
  """--decode: whether to decode causally. auto asks the checkpoint (dgemma/tasks/text/decoding.py, the decision
  scripts/eval_text.py and training make); only a language model (text task, or no task) decodes causally."""
  from dgemma.tasks.text import decoding
  language_model = task is None or task.name == "text"
  if FLAGS.decode == "autoregressive" and not language_model:
    raise ValueError(f"--decode=autoregressive is for language models; a {task.title} checkpoint is decoded by "
                     "its task's sampler")
  if FLAGS.decode != "auto":
    return FLAGS.decode == "autoregressive"
  return language_model and decoding.mode(decoding.trained_diffusion(metadata)) == "ar"


def _check_autoregressive_flags() -> None:
  """One line naming the diffusion-only flags given, if any: autoregressive decoding would ignore them."""
  names = ["stream", "show_steps", "show_steps_html", "show_steps_gif", "show_steps_delay", "show_row"]
  names += [sampler_flags.flag_name(k) for k in _KNOBS if k not in _AR_KNOBS]
  given = [f"--{n}" for n in names if FLAGS[n].present and FLAGS[n].value is not None
           and FLAGS[n].value is not False]  # --nostream and the like ask for nothing
  if FLAGS.samples != 1:
    given.append("--samples")
  if not given:
    return
  if FLAGS.decode == "autoregressive":
    raise ValueError(f"{', '.join(given)} only apply to the diffusion sampler, not to --decode=autoregressive")
  raise ValueError(f"{', '.join(given)} only apply to the diffusion sampler, and {FLAGS.ckpt} (trained with "
                   "objective=ar) is decoded autoregressively; --decode=diffusion to use the sampler anyway")


def _pad_batch(rows: list[list[int]], pad_id: int):
  import numpy as np
  length = max(len(r) for r in rows)
  tokens = np.full((len(rows), length), pad_id, np.int32)
  valid = np.zeros((len(rows), length), bool)
  for i, r in enumerate(rows):
    tokens[i, :len(r)] = r
    valid[i, :len(r)] = True
  return tokens, valid


def run() -> int:
  import jax
  import numpy as np

  from dgemma import sharding, tasks
  from dgemma.sampling import batches, display, streaming
  from dgemma.sampling.autoregressive import ARConfig, compile_autoregressive
  from dgemma.sampling.generate import compile_generate

  if not FLAGS.ckpt:
    raise ValueError("--ckpt is required")
  # Several processes (cluster launcher or flags): join JAX's multi-controller runtime before touching devices.
  sharding.maybe_initialize_distributed(FLAGS.coordinator_address, FLAGS.num_processes, FLAGS.process_id)
  lead = jax.process_index() == 0
  prompts, sources = _prompts()
  jsonl_to_stdout = _jsonl_prompts() and not FLAGS.output  # then stdout is the JSON lines, the rest stderr
  say = (lambda *a, **k: print(*a, **k, file=sys.stderr if jsonl_to_stdout else sys.stdout)) if lead else \
      (lambda *a, **k: None)  # only process 0 talks
  for flag in ("show_steps_html", "show_steps_gif", "output"):  # checked now: a bad path would fail only after the run
    if FLAGS[flag].value:
      cli.check_output_path(FLAGS[flag].value, f"--{flag}")
  if FLAGS.show_steps_gif:
    try:
      import PIL  # noqa: F401
    except ImportError:
      raise ValueError("--show_steps_gif needs Pillow (pip install pillow); --show_steps_html needs nothing") \
          from None
  config, params, metadata = _load(FLAGS.ckpt)
  sampler = _sampler_config(metadata)
  if FLAGS.moe_impl is not None:  # how the experts are computed, not what: any checkpoint takes any choice
    config = config.replace(moe_impl=FLAGS.moe_impl)
  if FLAGS.matmul_dtype:  # bf16 -> float32 is exact, so the matmuls see the checkpoint's own bf16 weights
    import jax.numpy as jnp
    params = jax.tree.map(lambda x: x.astype(jnp.float32), params)
    config = config.replace(param_dtype="float32", matmul_dtype=FLAGS.matmul_dtype)
  tokenizer = None
  draws = FLAGS.samples  # batch rows per prompt
  if draws < 1:
    raise ValueError(f"--samples must be >= 1, got {draws}")
  task = tasks.for_checkpoint(config, metadata, FLAGS.ckpt)  # None: a language model
  autoregressive = _autoregressive(task, metadata)
  if autoregressive:
    _check_autoregressive_flags()
  if task is not None:
    if FLAGS.prompt_ids is not None:
      raise ValueError(f"{task.title} checkpoints take their inputs via --prompt or --prompts_file")
    fixed = [f"--{n}" for n in task.fixed_sampler_flags if FLAGS[n].present]
    if fixed:
      raise ValueError(f"{', '.join(fixed)} cannot be set for a {task.title} checkpoint: the task sets them")
    if FLAGS.chat != "auto":
      if not hasattr(task, "with_chat"):
        raise ValueError(f"--chat is for language models; a {task.title} checkpoint takes the task's inputs")
      task = task.with_chat(FLAGS.chat, FLAGS.ckpt)
    inputs = np.stack([_parsed(task, p, where) for p, where in zip(prompts, sources)])
    config, sampler = task.config, task.sampler(sampler)
    encoded = [_encoded(task.encode, inputs[i:i + 1], where) for i, where in enumerate(sources)]
    tokens = np.repeat(np.concatenate([t for t, _ in encoded]), draws, axis=0)
    valid = np.repeat(np.concatenate([v for _, v in encoded]), draws, axis=0)
  else:
    if draws > 1:
      raise ValueError("--samples > 1 needs a task checkpoint: the choice between draws is the task's check of "
                       "an answer")
    if FLAGS.prompt_ids is not None:
      rows = [_int_list(p, f"--prompt_ids prompt {i}" if len(prompts) > 1 else "--prompt_ids")
              for i, p in enumerate(prompts, 1)]
    else:
      tokenizer = _tokenizer_for(FLAGS.ckpt)
      if tokenizer is None:
        raise ValueError(f"checkpoint {FLAGS.ckpt} has no tokenizer (tokenizer.json or a SentencePiece .model); pass --prompt_ids=1,2,3")
      chat = FLAGS.chat == "on" or (FLAGS.chat == "auto" and tokenizer.chat_template)
      if chat and not tokenizer.chat_template:
        raise ValueError(f"--chat=on but the tokenizer of {FLAGS.ckpt} has no chat template")
      rows = [_encoded(lambda p: tokenizer.encode(getattr(p, "messages", None) or getattr(p, "text", p), chat),
                       p, where) for p, where in zip(prompts, sources)]
    tokens, valid = _pad_batch(rows, config.pad_id)
  if not 0 <= FLAGS.show_row < len(prompts):
    raise ValueError(f"--show_row={FLAGS.show_row} but there are {len(prompts)} prompts")

  key = jax.random.key(cli.check_seed(FLAGS.seed))
  keys = batches.row_keys(key, tokens.shape[0])  # row r: fold_in(key, r), whatever the batch size
  spans = batches.spans(tokens.shape[0], FLAGS.batch_size)
  size = spans[0][1] - spans[0][0]
  resolved = sampler.resolve(config)
  c = resolved.canvas_length
  if autoregressive:
    # As the training samples decode: greedy, up to the canvases' capacity (fewer by --max_new_tokens).
    ar = ARConfig(max_new_tokens=resolved.max_new_tokens if task is None or FLAGS.max_new_tokens is not None
                  else c * task.max_canvases, temperature=0.0, stop_ids=resolved.stop_ids)
    if tokens.shape[1] + ar.max_new_tokens > FLAGS.max_cache_len:
      raise ValueError(f"prompt ({tokens.shape[1]} tokens) + {ar.max_new_tokens} new tokens exceed "
                       f"--max_cache_len={FLAGS.max_cache_len}")
    reason = "--decode=autoregressive" if FLAGS.decode == "autoregressive" else "trained with objective=ar"
    say(f"decoding autoregressively ({reason}): greedy, one token per encoder pass, up to {ar.max_new_tokens} "
        "new tokens")
  watched = FLAGS.show_row * draws  # the row --stream and the step-by-step views show
  live = None
  if FLAGS.stream and lead:
    token_text = (task.token_text if task is not None else tokenizer.piece if tokenizer is not None
                  else (lambda t: f"{t} "))
    live = streaming.LiveCanvas(token_text, resolved.num_canvases(c), resolved.max_denoising_steps)
  # The weights live on a mesh over all devices of all processes, sharded by the default rules.
  mesh = sharding.make_mesh()
  params = sharding.put(params, sharding.tree_shardings(params, mesh))
  features = metadata.get("position_features")
  if autoregressive:
    sample, compile_s = compile_autoregressive(params, config, tokens[:size], valid[:size], keys[:size], ar,
                                               position_features=features)
  else:
    sample, compile_s = compile_generate(params, config, tokens[:size], valid[:size], keys[:size], sampler,
                                         max_cache_len=FLAGS.max_cache_len, position_features=features,
                                         on_step=live)
  start = time.perf_counter()
  out = batches.run(sample, tokens, valid, keys, FLAGS.batch_size, to_host=sharding.to_host,
                    before_batch=live and (lambda a, b: live.reset(watched - a if a <= watched < b else None)))
  seconds = time.perf_counter() - start

  generated = np.asarray(out.tokens)
  # Diffusion: denoising steps per canvas [R, canvases]; autoregressive: tokens generated per row [R, 1].
  steps = np.asarray(out.forward_passes)[:, None] if autoregressive else np.asarray(out.steps_per_canvas)
  answer_rows = np.arange(len(prompts)) * draws  # the batch row answering each prompt
  records = []  # the JSON lines
  for row in range(len(prompts)):
    say(f"=== prompt {row + 1}/{len(prompts)}")
    if task is not None:
      draw_rows = slice(row * draws, (row + 1) * draws)
      answers = task.decode(generated[draw_rows])
      first_valid = task.first_valid(inputs[row], answers)
      chosen = 0 if first_valid is None else first_valid
      answer_rows[row] += chosen
      completion = task.show(inputs[row], answers[chosen])
      say(completion)
      if draws > 1:
        draw_steps = steps[draw_rows, 0]
        if first_valid is None:
          say(f"none of {draws} draws obeys the rules; showing the first ({int(draw_steps.sum())} steps in all)")
        else:
          say(f"draw {chosen + 1} of {draws} is the first that obeys the rules; one draw after another that is "
              f"{int(draw_steps[:chosen + 1].sum())} steps (all {draws}: {int(draw_steps.sum())})")
    else:
      completion = None
    ids = generated[answer_rows[row]].tolist()
    stops = [i for i, t in enumerate(ids) if t in resolved.stop_ids]
    ids = [t for t in (ids[:stops[0]] if stops else ids) if t != config.pad_id]  # what the completion is
    if task is None:
      completion = tokenizer.decode(ids) if tokenizer is not None else ",".join(str(t) for t in ids)
      say(completion)
    if autoregressive:
      run_steps = int(steps[answer_rows[row], 0])
      say(f"tokens generated: {run_steps}")
    else:
      run_steps = [int(s) for s in steps[answer_rows[row]] if s]
      say(f"steps per canvas: {run_steps}")
    given = prompts[row]
    records.append({**(given.as_json() if hasattr(given, "as_json") else
                       {"prompt_ids": rows[row]} if FLAGS.prompt_ids is not None else {"prompt": given}),
                    "completion": completion, "tokens": ids, "steps": run_steps})

  num_tokens = int((generated != config.pad_id).sum())
  canvases_run = int((steps > 0).any(axis=0).sum())
  passes = steps.sum(axis=1)
  if autoregressive:
    say(f"--- {len(prompts)} prompt(s) · autoregressive, greedy · up to {ar.max_new_tokens} new tokens · "
        f"encoder passes per row {passes.tolist()}")
  else:
    say(f"--- {len(prompts)} prompt(s){f' x {draws} draws' if draws > 1 else ''} · canvas {c} · "
          f"{canvases_run}/{steps.shape[1]} canvas(es) · "
          f"mean steps per canvas {steps[steps > 0].mean():.1f} (max {resolved.max_denoising_steps}; "
          f"t {resolved.t_max} -> {resolved.t_min}) · "
          f"tokens per forward pass {float(np.mean(np.asarray(out.tokens_per_forward))):.2f} · "
          f"denoiser passes per {'draw' if draws > 1 else 'row'} {passes.tolist()}")
  say(f"--- time {seconds:.2f} s (+ compile {compile_s:.1f} s) · {num_tokens} tokens · "
        f"{num_tokens / max(seconds, 1e-9):.1f} tokens/s"
        + (f" · {len(spans)} batches of {size}" if len(spans) > 1 else ""))
  if lead and (FLAGS.output or jsonl_to_stdout):
    _write_jsonl(FLAGS.output, records)
    if FLAGS.output:
      say(f"wrote {FLAGS.output} ({len(records)} lines)")

  if not autoregressive and out.trajectory is not None and lead:  # views and files: process 0 only
    row = int(answer_rows[FLAGS.show_row])  # for --samples: the answering draw
    if task is not None:
      frames = task.frames(np.asarray(out.trajectory)[row, 0], steps[row, 0])
    else:
      token_text = tokenizer.piece if tokenizer is not None else (lambda t: f"{t} ")
      frames = display.build_frames(np.asarray(out.trajectory)[row], steps[row],
                                    generated[row].reshape(-1, c), token_text)
    if FLAGS.show_steps:
      display.show_in_terminal(frames, delay=FLAGS.show_steps_delay)
    if FLAGS.show_steps_html:
      display.write_html(FLAGS.show_steps_html, frames, delay=max(FLAGS.show_steps_delay, 0.02))
      say(f"wrote {FLAGS.show_steps_html} ({len(frames)} frames)")
    if FLAGS.show_steps_gif:
      display.write_gif(FLAGS.show_steps_gif, frames, delay=max(FLAGS.show_steps_delay, 0.02))
      say(f"wrote {FLAGS.show_steps_gif} ({len(frames)} frames)")
  return 0


def _write_jsonl(path: str | None, records: list[dict]) -> None:
  """One JSON object per line, to `path` or (None) stdout."""
  import json
  lines = "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records)
  if path is None:
    sys.stdout.write(lines)
    sys.stdout.flush()
    return
  with open(path, "w", encoding="utf-8") as f:
    f.write(lines)


def main(argv: list[str]) -> int:
  """Runs with command-line `argv`; bad input prints one `error:` line and returns a non-zero code."""
  return cli.run_main(argv, __doc__, run, FLAGS)


if __name__ == "__main__":
  huge_pages.restart_with_huge_pages()  # faster XLA:CPU buffers (dgemma/cpu/huge_pages.py)
  cli.exit(main(sys.argv))
