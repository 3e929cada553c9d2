"""Any text as a task ("text"): prompt/response or chat JSONL, plain text, ArrayRecord (docs/text.md).

Inputs are prompts as strings ([B] object arrays), answers the generated text. The task is bound to a tokenizer
("bytes", the fixed byte vocabulary of `byte_tokenizer`, or a tokenizer file/directory, e.g. a GGUF checkpoint)
and a chat template (`chat`); both are recorded in the checkpoint's metadata, so sampling renders prompts
exactly as training did. Metadata: {"name", "prompt_len", "tokenizer", "chat_template", "max_canvases",
"prompt_overflow"}; an exported model holds its tokenizer file and names it relative to its directory
(`tokenizer_files`, `export_files`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any

import ml_collections
import numpy as np

from dgemma.config import ModelConfig
from dgemma.data.tokenizer import Tokenizer, load_tokenizer
from dgemma.sampling import display
from dgemma.tasks.base import TaskBase
from dgemma.tasks.text import byte_tokenizer, canvases, chat, pipeline, readers, tokenizer_files

STDLIB_CODE = "data/stdlib_code/train.jsonl"  # configs/text.py's default data, built by scripts/make_text_data.py
STDLIB_TOKENIZER = "data/stdlib_code/tokenizer.json"  # ... and its default vocabulary, learned there from STDLIB_CODE


def tokenizer_from(spec: str) -> Tokenizer:
  """'bytes' -> the byte tokenizer; anything else is a tokenizer file or a checkpoint directory."""
  if spec == byte_tokenizer.NAME:
    return byte_tokenizer.byte_tokenizer()
  if not spec or not os.path.exists(spec):
    raise ValueError(f"tokenizer {spec!r} does not exist (data.tokenizer: 'bytes', a tokenizer file or a "
                     "checkpoint directory)")
  return load_tokenizer(spec)


@dataclasses.dataclass(frozen=True)
class TextTask(TaskBase):
  tokenizer: Tokenizer | None = None
  tokenizer_spec: str = byte_tokenizer.NAME
  chat_template: str = "none"
  max_canvases: int = 1
  prompt_overflow: str = "truncate"
  name = "text"
  fixed_sampler_flags = ("canvas_length", "stop_ids")  # --max_new_tokens may ask for fewer canvases

  def __post_init__(self):
    self.layout  # noqa: B018  (validates the lengths and the overflow mode now, not at the first batch)

  @property
  def metadata(self) -> dict[str, Any]:
    return {**super().metadata, "tokenizer": self.tokenizer_spec, "chat_template": self.chat_template,
            "max_canvases": self.max_canvases, "prompt_overflow": self.prompt_overflow}

  def export_files(self, directory: str) -> dict[str, Any]:
    """A copy of the tokenizer in the model directory, recorded by its relative name (tokenizer_files.py); the
    path it came from is kept as "tokenizer_source"."""
    name = tokenizer_files.save(self.tokenizer, directory)
    if name == byte_tokenizer.NAME:
      return self.metadata
    return {**self.metadata, "tokenizer": name, "tokenizer_source": self.tokenizer_spec}

  @property
  def layout(self) -> pipeline.Layout:
    return pipeline.Layout(self.prompt_len, self.config.canvas_length, self.max_canvases, self.config.pad_id,
                           self.config.eos_id, self.config.stop_ids, self.prompt_overflow)

  @classmethod
  def from_metadata(cls, config: ModelConfig, metadata: dict, ckpt_path: str | None = None) -> "TextTask":
    spec = tokenizer_files.resolve(metadata.get("tokenizer") or ckpt_path or "", ckpt_path)
    tokenizer = tokenizer_from(spec)
    if tokenizer.vocab_size > config.vocab_size:
      raise ValueError(f"tokenizer {spec} (vocab {tokenizer.vocab_size}) does not fit the model (vocab "
                       f"{config.vocab_size})")
    template = chat.resolve(metadata.get("chat_template", "auto"), tokenizer)
    end = chat.end_of_turn_id(template, tokenizer)
    config = config.replace(pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id, bos_id=tokenizer.bos_id,
                            stop_ids=(tokenizer.eos_id,) + (() if end is None else (end,)))
    return cls(int(metadata.get("prompt_len", 256)), config, tokenizer, spec, template,
               int(metadata.get("max_canvases", 1)), metadata.get("prompt_overflow", "truncate"))

  @classmethod
  def from_config(cls, c: ml_collections.ConfigDict, config: ModelConfig) -> "TextTask":
    """c.data.tokenizer, else the init_from checkpoint's tokenizer (the one it records, or its own file), else
    'bytes'."""
    d = c.data
    init_from = os.path.expanduser(c.get("init_from") or "")
    spec = (d.get("tokenizer") or (init_from and tokenizer_files.recorded_by(init_from)) or init_from
            or byte_tokenizer.NAME)
    spec = spec if spec == byte_tokenizer.NAME else os.path.abspath(os.path.expanduser(spec))
    tokenizer = tokenizer_from(spec)
    if tokenizer.pad_id != config.pad_id:
      raise ValueError(f"tokenizer {spec} has pad id {tokenizer.pad_id}, the model {config.pad_id}")
    return cls.from_metadata(config, {"name": cls.name, "prompt_len": d.prompt_len, "tokenizer": spec,
                                      "chat_template": d.chat_template, "max_canvases": d.max_canvases,
                                      "prompt_overflow": d.prompt_overflow})

  # --- Training -------------------------------------------------------------------------------------
  def encoder(self, c: ml_collections.ConfigDict) -> pipeline.Encoder:
    """The records of c.data.path, ready to be encoded (reads, and for plain text tokenizes, the data)."""
    d = c.data
    if not d.path:
      raise ValueError("data.path is empty: python train.py --config=configs/text.py:data=PATH.jsonl "
                       "(JSONL, a text file or directory, or ArrayRecord; docs/text.md)")
    if d.path == STDLIB_CODE and not os.path.exists(d.path):
      raise FileNotFoundError(f"data file {d.path} does not exist: build it with python scripts/make_text_data.py "
                              "(or pass data=PATH)")
    fields = readers.Fields(d.prompt_field, d.response_field, d.messages_field)
    records = readers.read(d.path, d.format, self.tokenizer, fields, d.on_malformed, d.prefix_tokens,
                           self.max_canvases * self.config.canvas_length, d.document_separator)
    print(f"text data: {len(records)} records from {d.path}"
          + (f" ({records.skipped} malformed or too short, skipped)" if records.skipped else ""), file=sys.stderr)
    return pipeline.Encoder(records, self.tokenizer, self.chat_template, self.layout, fields, d.on_malformed)

  def train_dataset(self, c, batch_size, shard_index, shard_count, noise_rank):
    if noise_rank:
      raise ValueError(f"{self.name} batches carry no noise order")
    return pipeline.make_dataset(self.encoder(c), batch_size, c.seed, shard_index, shard_count)

  def make_evaluator(self, c, metadata):
    """Every eval.every steps, the held-out likelihood of eval.data (read as data.path is): the ELBO in bits per
    token on eval.num_t stratified noise levels, or an objective=ar run's exact NLL (likelihood.py); and the
    model's completions of the first eval.num_samples held-out prompts as texts (samples.py)."""
    e = c.get("eval") or {}
    if not e.get("every", 0):
      return None
    if not e.get("data"):
      raise ValueError("eval.every > 0 needs eval.data: a held-out file read as data.path is (docs/text.md)")
    num_samples = e.get("num_samples", 3)
    if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 0:
      raise ValueError(f"eval.num_samples must be an integer >= 0 (0: no samples), got {num_samples!r}")
    from dgemma.tasks.text import likelihood, samples  # (jax and the model: only when an evaluation is configured)
    held_out = ml_collections.ConfigDict(c.to_dict())
    held_out.data.path = os.path.abspath(os.path.expanduser(e.data))
    encoder = self.encoder(held_out)
    rows = list(likelihood.batches(encoder, int(e.get("batch_size", 16)), int(e.get("limit", 64))))
    settings = likelihood.settings_from(c.diffusion.to_dict(), num_t=int(e.get("num_t", 16)), seed=int(c.seed),
                                        self_cond_passes=int(e.get("self_cond_passes", 0)))
    scorer = likelihood.Scorer(self.config, metadata.get("position_features"))
    sample = (samples.make_sampler(self, samples.held_out(encoder, self, num_samples), metadata,
                                   settings.mode == "ar", int(c.seed)) if num_samples else (lambda params: {}))
    return lambda params: {**likelihood.scalars(likelihood.evaluate(scorer, params, rows, settings)),
                           **sample(params)}

  def describe(self, scores):
    if "eval/ar_nll_bits_per_token" in scores:
      return f"held-out AR NLL {scores['eval/ar_nll_bits_per_token']:.4f} bits/token"
    return (f"held-out ELBO {scores['eval/elbo_bits_per_token']:.4f} ± {scores['eval/elbo_stderr']:.4f} "
            "bits/token")

  # --- Sampling -------------------------------------------------------------------------------------
  def parse_prompt(self, text: str) -> np.ndarray:
    return np.array(text, dtype=object)

  def with_chat(self, mode: str, ckpt_path: str = "the checkpoint") -> "TextTask":
    """sample.py --chat: "auto"/"on" render prompts with the template the model was trained with ("on" refuses
    a model trained without one), "off" as BOS + the prompt."""
    if mode == "on" and self.chat_template == "none":
      raise ValueError(f"--chat=on but {ckpt_path} has no chat template (trained with chat_template 'none')")
    return dataclasses.replace(self, chat_template="none") if mode == "off" else self

  def encode(self, inputs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """[B] prompts -> token rows through the chat template, as in training. A prompt is a string (one user turn)
    or a conversation (a tuple of `chat.Turn`s ending with a user turn)."""
    rows = []
    for item in np.ravel(inputs):
      turns = item if isinstance(item, tuple) else (chat.Turn("user", str(item)),)
      ids = chat.encode_prompt(self.chat_template, turns, self.tokenizer)
      overflow = "truncate" if self.prompt_overflow == "truncate" else "error"
      rows.append((canvases.prompt_row(ids, self.prompt_len, self.config.pad_id, overflow)[0], len(ids)))
    tokens = np.stack([r for r, _ in rows])
    kept = np.minimum(np.array([n for _, n in rows]), self.prompt_len)  # left-padded: the last `kept` slots
    valid = np.arange(self.prompt_len)[None, :] >= self.prompt_len - kept[:, None]
    return tokens, valid

  def decode(self, tokens_BxT: np.ndarray) -> np.ndarray:
    """[B, T] generated tokens -> [B] texts: up to the first stop id, PAD dropped."""
    out = []
    for row in np.asarray(tokens_BxT):
      ids = [int(t) for t in row]
      stop = next((i for i, t in enumerate(ids) if t in self.config.stop_ids), len(ids))
      out.append(self.tokenizer.decode([t for t in ids[:stop] if t != self.config.pad_id], skip_special=True))
    return np.array(out, dtype=object)

  def sampler(self, sampler_config):
    """Canvases of the model's length, as many as training allowed (or fewer, by --max_new_tokens)."""
    capacity = self.config.canvas_length * self.max_canvases
    asked = sampler_config.max_new_tokens
    return dataclasses.replace(sampler_config, canvas_length=self.config.canvas_length,
                               max_new_tokens=min(asked, capacity), stop_ids=self.config.stop_ids)

  def show(self, inputs: np.ndarray, answer: np.ndarray) -> str:
    return str(answer)

  def token_text(self, token: int) -> str:
    return self.tokenizer.decode([token])

  def frames(self, trajectory_SxC: np.ndarray, steps: int) -> list:
    trajectory_SxC = np.asarray(trajectory_SxC)
    return display.build_frames(trajectory_SxC[None], np.array([steps]), trajectory_SxC[max(steps - 1, 0)][None],
                                self.token_text)
