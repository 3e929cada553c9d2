"""The grain pipeline of the text task: records -> shuffled, sharded, resumable batches.

Record indices `shard_index::shard_count` belong to this process (disjoint shards that cover the data); they are
reshuffled every epoch from the seed; each record is tokenized when read (`Encoder`), so ArrayRecord data never
has to fit in memory. The iterator's get_state()/set_state() resume it exactly: the state is grain's position in
the index stream, and everything after it is a pure function of the record.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Sequence

import grain
import numpy as np
from absl import logging

from dgemma.data.tokenizer import Tokenizer
from dgemma.tasks.text import canvases, chat, readers


@dataclasses.dataclass(frozen=True)
class Layout:
  """How an example becomes rows: the model's canvas length, the limits and the special ids."""
  prompt_len: int
  canvas_len: int
  max_canvases: int
  pad_id: int
  eos_id: int
  stop_ids: tuple[int, ...]
  prompt_overflow: str = "truncate"  # canvases.OVERFLOW

  def __post_init__(self):
    for name in ("prompt_len", "canvas_len", "max_canvases"):
      if isinstance(getattr(self, name), bool) or not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
        raise ValueError(f"{name} must be a positive integer, got {getattr(self, name)!r}")
    if self.prompt_len < 2:
      raise ValueError(f"prompt_len must be >= 2 (BOS and one token), got {self.prompt_len}")
    if self.prompt_overflow not in canvases.OVERFLOW:
      raise ValueError(f"prompt_overflow must be one of {', '.join(canvases.OVERFLOW)}, got {self.prompt_overflow!r}")


class _Counter:
  """Thread-safe counts of truncated / skipped examples, logged at 1, 2, 4, 8, ... (a log, not a flood)."""

  def __init__(self):
    self._lock, self.counts = threading.Lock(), {}

  def add(self, what: str, where: str) -> None:
    with self._lock:
      n = self.counts[what] = self.counts.get(what, 0) + 1
    if n & (n - 1) == 0:
      logging.warning("text data: %d %s so far (latest: %s)", n, what, where)


class Encoder:
  """Record index -> one example {"prompt": [P], "canvas": [N*C], "canvas_mask": [N*C], "prompt_truncated": (),
  "response_truncated": ()}, or None for a record that is skipped."""

  def __init__(self, records: readers.Records, tokenizer: Tokenizer, template: str, layout: Layout,
               fields: readers.Fields, on_malformed: str):
    self.records, self.tokenizer, self.template, self.layout = records, tokenizer, template, layout
    self.fields, self.on_malformed, self.counter = fields, on_malformed, _Counter()

  def tokens(self, i: int) -> tuple[list[int], list[int]]:
    """(prompt ids with BOS, response ids) of record i; MalformedRecord naming the record's place."""
    item = self.records.item(i, self.fields)
    if isinstance(item, readers.Tokens):
      return list(item.prompt), list(item.response)
    try:
      return chat.encode_example(self.template, item, self.tokenizer)
    except chat.ChatError as e:
      raise readers.MalformedRecord(f"{self.records.where(i)}: {e}") from None

  def __call__(self, i: int) -> dict[str, np.ndarray] | None:
    i = int(i)
    lay = self.layout
    try:
      prompt, response = self.tokens(i)
      prompt_row, prompt_cut = canvases.prompt_row(prompt, lay.prompt_len, lay.pad_id, lay.prompt_overflow)
    except readers.MalformedRecord:
      if self.on_malformed == "error":
        raise
      self.counter.add("malformed records skipped", self.records.where(i))
      return None
    except canvases.PromptTooLong as e:
      if lay.prompt_overflow == "error":
        raise ValueError(f"{self.records.where(i)}: {e} (data.prompt_overflow='truncate' cuts it from the left, "
                         "'skip' drops it)") from None
      self.counter.add("prompts too long skipped", self.records.where(i))
      return None
    canvas, mask, response_cut = canvases.canvas_rows(response, lay.canvas_len, lay.max_canvases, lay.eos_id,
                                                      lay.pad_id, lay.stop_ids)
    if prompt_cut:
      self.counter.add("prompts truncated from the left", self.records.where(i))
    if response_cut:
      self.counter.add(f"responses cut at {lay.max_canvases} canvases", self.records.where(i))
    return {"prompt": prompt_row, "canvas": canvas, "canvas_mask": mask,
            "prompt_truncated": np.bool_(prompt_cut), "response_truncated": np.bool_(response_cut)}


def shard_indices(num_records: int, shard_index: int, shard_count: int) -> grain.MapDataset:
  if not 0 <= shard_index < shard_count:
    raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}")
  ds = grain.MapDataset.range(num_records).slice(slice(shard_index, None, shard_count))
  if len(ds) == 0:
    raise ValueError(f"shard {shard_index}/{shard_count} of {num_records} records is empty")
  return ds


def make_dataset(encoder: Encoder, batch_size: int, seed: int, shard_index: int = 0, shard_count: int = 1,
                 num_threads: int = 2, repeat: bool = True) -> grain.IterDataset:
  """Batches of `batch_size` examples (see Encoder) from this process's shard, shuffled per epoch from `seed`;
  infinite unless `repeat=False` (one pass, the last partial batch dropped)."""
  if batch_size < 1:
    raise ValueError(f"batch_size must be >= 1, got {batch_size}")
  ds = shard_indices(len(encoder.records), shard_index, shard_count)
  shuffle_seed = int(np.random.SeedSequence(seed).generate_state(1, dtype=np.uint32)[0])  # grain wants < 2**32
  ds = ds.shuffle(seed=shuffle_seed)
  if repeat:
    ds = ds.repeat()  # each epoch reshuffled
  ds = ds.map(encoder).to_iter_dataset(grain.ReadOptions(num_threads=num_threads, prefetch_buffer_size=16))
  ds = ds.filter(lambda example: example is not None)
  return ds.batch(batch_size, drop_remainder=True, batch_fn=_stack)


def _stack(examples: Sequence[dict]) -> dict[str, np.ndarray]:
  return {k: np.stack([e[k] for e in examples]) for k in examples[0]}
