"""sample.py's JSONL prompts: one JSON object per line, `{"prompt": str}` or `{"messages": [{"role", "content"},
...]}` ending in a user turn (an optional first system message, then user/assistant alternating, as chat.check
wants); other keys are ignored. Blank lines are skipped. A malformed line is one ValueError naming FILE:LINE."""

from __future__ import annotations

import dataclasses
import json

from dgemma.tasks.text import chat
from dgemma.tasks.text.chat import Turn


@dataclasses.dataclass(frozen=True)
class Prompt:
  where: str  # "FILE:LINE"
  text: str | None  # {"prompt": ...}
  messages: tuple[Turn, ...] | None  # {"messages": [...]}

  @property
  def turns(self) -> tuple[Turn, ...]:
    return self.messages if self.messages is not None else (Turn("user", self.text),)

  def as_json(self) -> dict:
    """How the output line names its prompt: {"prompt": ...} or {"messages": [...]}, as it was given."""
    if self.messages is None:
      return {"prompt": self.text}
    return {"messages": [{"role": t.role, "content": t.content} for t in self.messages]}


def _parse(line: str) -> tuple[str | None, tuple[Turn, ...] | None]:
  try:
    obj = json.loads(line)
  except json.JSONDecodeError as e:
    raise ValueError(f"not valid JSON ({e})") from None
  if not isinstance(obj, dict):
    raise ValueError(f"expected a JSON object, got {type(obj).__name__}")
  if "messages" in obj:
    messages = obj["messages"]
    if not isinstance(messages, list) or not all(
        isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
        for m in messages):
      raise ValueError('"messages" must be a list of {"role": str, "content": str} objects')
    turns = tuple(Turn(m["role"], m["content"]) for m in messages)
    chat.check(turns, need_response=False)  # (a ChatError is a ValueError)
    return None, turns
  if not isinstance(obj.get("prompt"), str):
    raise ValueError(f'no string field "prompt" (and no "messages" list); keys: {", ".join(sorted(obj)) or "none"}')
  return obj["prompt"], None


def read(path: str) -> list[Prompt]:
  prompts = []
  with open(path, "rb") as f:
    for number, raw in enumerate(f, 1):
      if not raw.strip():
        continue
      where = f"{path}:{number}"
      try:
        try:
          line = raw.decode("utf-8")
        except UnicodeDecodeError as e:
          raise ValueError(f"not UTF-8 ({e.reason} at byte {e.start})") from None
        text, messages = _parse(line)
      except ValueError as e:
        raise ValueError(f"{where}: {e}") from None
      prompts.append(Prompt(where, text, messages))
  if not prompts:
    raise ValueError(f"prompts file {path} has no prompts")
  return prompts
