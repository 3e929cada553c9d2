"""Readers: a data path -> random-access records, each a conversation (`chat.Turn`s) or, for plain text,
ready token ids; every record knows where it came from ("FILE:LINE" or "FILE#RECORD") for error messages.

Formats (`format`, 'auto' from the path):
- JSONL (`.jsonl`, `.json`): one JSON object per line, either `{prompt_field: str, response_field: str}` or
  `{messages_field: [{"role": ..., "content": ...}, ...]}` (chat data: the last assistant turn is the response,
  everything before it the prompt). Parsed when read, so a malformed line stops the run at once with one line
  naming the file and line number, or (on_malformed='skip') is dropped and counted.
- ArrayRecord (`.array_record`, `.arrayrecord`): grain's own format, for data that does not fit in memory;
  each record is the UTF-8 JSON of one such object. Read lazily: a malformed record is found when it is read.
- Plain text (any other file, or a directory: its files, recursively, in sorted order): each file is one
  document (or several, split at `document_separator`); documents are tokenized and cut into windows of a
  prompt of `prefix_tokens` tokens (after BOS) and the continuation that follows (up to `continuation_tokens`).
"""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Sequence
from typing import Any

from dgemma.data.tokenizer import Tokenizer
from dgemma.tasks.text import chat
from dgemma.tasks.text.chat import Turn

FORMATS = ("auto", "jsonl", "array_record", "text")
MALFORMED = ("error", "skip")


class MalformedRecord(ValueError):
  """One line: where (FILE:LINE) and what is wrong."""


@dataclasses.dataclass(frozen=True)
class Fields:
  prompt: str = "prompt"
  response: str = "response"
  messages: str = "messages"


@dataclasses.dataclass(frozen=True)
class Tokens:
  """A plain-text window, tokenized: prompt (with BOS) and continuation."""
  prompt: tuple[int, ...]
  response: tuple[int, ...]


def detect_format(path: str) -> str:
  if os.path.isdir(path):
    return "text"
  if path.endswith((".jsonl", ".json")):
    return "jsonl"
  if path.endswith((".array_record", ".arrayrecord")):
    return "array_record"
  return "text"


def parse_object(obj: Any, fields: Fields) -> tuple[Turn, ...]:
  """A decoded JSON object -> its turns; MalformedRecord (without the place) if it has neither form."""
  if not isinstance(obj, dict):
    raise MalformedRecord(f"expected a JSON object, got {type(obj).__name__}")
  if fields.messages in obj:
    messages = obj[fields.messages]
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages):
      raise MalformedRecord(f"{fields.messages!r} must be a list of {{\"role\": str, \"content\": str}} objects")
    turns = tuple(Turn(m["role"], m["content"]) for m in messages)
    if not turns or turns[-1].role not in ("assistant", "model"):
      raise MalformedRecord(f"the last of the {fields.messages!r} must be an assistant turn (the response)")
    try:
      chat.check(turns, need_response=True)
    except chat.ChatError as e:
      raise MalformedRecord(str(e)) from None
    return turns
  missing = [f for f in (fields.prompt, fields.response) if not isinstance(obj.get(f), str)]
  if missing:
    raise MalformedRecord(f"no string field {', '.join(repr(m) for m in missing)} (and no {fields.messages!r} list);"
                          f" keys: {', '.join(sorted(map(str, obj))) or 'none'}")
  return (Turn("user", obj[fields.prompt]), Turn("assistant", obj[fields.response]))


def parse_json(data: bytes | str, fields: Fields) -> tuple[Turn, ...]:
  try:
    obj = json.loads(data)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise MalformedRecord(f"not valid JSON ({e})") from None
  return parse_object(obj, fields)


@dataclasses.dataclass
class Records:
  """Random-access records: `len(records)`, `records[i]` -> (turns or Tokens, where)."""
  items: Sequence[Any]
  where: Any  # i -> "FILE:LINE"
  skipped: int = 0  # malformed lines dropped (on_malformed='skip') / documents too short for a window
  lazy: Any = None  # ArrayRecord: i -> raw bytes

  def __len__(self) -> int:
    return len(self.items) if self.lazy is None else len(self.lazy)

  def item(self, i: int, fields: Fields) -> tuple[Turn, ...] | Tokens:
    """Record i (an ArrayRecord one parsed now); MalformedRecord naming its place."""
    if self.lazy is None:
      return self.items[i]
    try:
      return parse_json(self.lazy[i], fields)
    except MalformedRecord as e:
      raise MalformedRecord(f"{self.where(i)}: {e}") from None


def read_jsonl(paths: Sequence[str], fields: Fields, on_malformed: str) -> Records:
  items, places, skipped = [], [], 0
  for path in paths:
    with open(path, "rb") as f:
      for number, raw in enumerate(f, 1):
        if not raw.strip():
          continue  # blank lines (a trailing newline) are no records
        try:
          try:
            line = raw.decode("utf-8")
          except UnicodeDecodeError as e:
            raise MalformedRecord(f"not UTF-8 ({e.reason} at byte {e.start})") from None
          items.append(parse_json(line, fields))
          places.append(f"{path}:{number}")
        except MalformedRecord as e:
          if on_malformed == "error":
            raise MalformedRecord(f"{path}:{number}: {e}") from None
          skipped += 1
  return Records(items, places.__getitem__, skipped)


class _ArrayRecordWhere:
  def __init__(self, paths: Sequence[str], counts: Sequence[int]):
    self._paths, self._starts = list(paths), [0]
    for n in counts:
      self._starts.append(self._starts[-1] + n)

  def __call__(self, i: int) -> str:
    f = max(k for k in range(len(self._paths)) if self._starts[k] <= i)
    return f"{self._paths[f]}#{i - self._starts[f]}"


def read_array_record(paths: Sequence[str]) -> Records:
  import grain
  from array_record.python.array_record_module import ArrayRecordReader

  counts = []
  for path in paths:
    reader = ArrayRecordReader(path)
    counts.append(reader.num_records())
    reader.close()
  source = grain.sources.ArrayRecordDataSource(list(paths))
  return Records([], _ArrayRecordWhere(paths, counts), lazy=source)


def read_text(paths: Sequence[str], tokenizer: Tokenizer, prefix_tokens: int, continuation_tokens: int,
              separator: str = "") -> Records:
  """Documents -> windows of BOS + `prefix_tokens` prompt tokens and up to `continuation_tokens` after them
  (windows do not overlap; a last window with no continuation token is dropped and counted)."""
  items, places, skipped = [], [], 0
  for path in paths:
    text = _file_text(path)
    docs = text.split(separator) if separator else [text]
    for d, ids in enumerate(tokenizer.encode_batch(docs, add_bos=False)):
      step = prefix_tokens + continuation_tokens
      for start in range(0, max(len(ids), 1), step):
        window = ids[start:start + step]
        if len(window) <= prefix_tokens:
          skipped += 1
          continue
        items.append(Tokens(tuple([tokenizer.bos_id] + window[:prefix_tokens]), tuple(window[prefix_tokens:])))
        places.append(f"{path} ({f'document {d + 1}, ' if separator else ''}token {start})")
  return Records(items, places.__getitem__, skipped)


def _file_text(path: str) -> str:
  with open(path, encoding="utf-8", errors="replace") as f:
    return f.read()


def list_files(path: str) -> list[str]:
  if os.path.isdir(path):
    files = sorted(os.path.join(root, name) for root, _, names in os.walk(path) for name in names
                   if not name.startswith("."))
    if not files:
      raise ValueError(f"data directory {path} holds no files")
    return files
  if not os.path.exists(path):
    raise FileNotFoundError(f"data file {path} does not exist")
  return [path]


def _files_and_format(path: str, fmt: str) -> tuple[str, list[str], str]:
  """(the expanded path, its files, the format: `fmt`, or detected from the path for "auto")."""
  if fmt not in FORMATS:
    raise ValueError(f"unknown data format {fmt!r}; choose from {', '.join(FORMATS)}")
  path = os.path.expanduser(path)
  files = list_files(path)
  return path, files, detect_format(path) if fmt == "auto" else fmt


def read(path: str, fmt: str, tokenizer: Tokenizer, fields: Fields, on_malformed: str, prefix_tokens: int,
         continuation_tokens: int, separator: str = "") -> Records:
  """The records of a file or directory (see the module docstring)."""
  if on_malformed not in MALFORMED:
    raise ValueError(f"on_malformed must be one of {', '.join(MALFORMED)}, got {on_malformed!r}")
  path, files, fmt = _files_and_format(path, fmt)
  if fmt == "jsonl":
    records = read_jsonl(files, fields, on_malformed)
  elif fmt == "array_record":
    records = read_array_record(files)
  else:
    records = read_text(files, tokenizer, prefix_tokens, continuation_tokens, separator)
  if not len(records):
    raise ValueError(f"{path} holds no usable records ({records.skipped} skipped)")
  return records


def read_texts(path: str, fmt: str, fields: Fields) -> list[str]:
  """The raw text of the data, to learn a tokenizer from (scripts/make_tokenizer.py): every turn's content of every
  record (JSONL, ArrayRecord; a malformed one stops with its place), or every file's whole text (plain text)."""
  _, files, fmt = _files_and_format(path, fmt)
  if fmt == "text":
    return [_file_text(name) for name in files]
  records = read_jsonl(files, fields, "error") if fmt == "jsonl" else read_array_record(files)
  return [turn.content for i in range(len(records)) for turn in records.item(i, fields)]
