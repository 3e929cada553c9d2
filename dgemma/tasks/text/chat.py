"""Chat templates at the token level: conversations -> (prompt ids, response ids) with the vocabulary's own
turn-marker ids, never the markers' text split into plain pieces.

- "gemma3": Gemma 3's official template: `<bos><start_of_turn>user\n{content}<end_of_turn>\n<start_of_turn>model\n`;
  assistant turns are role "model"; contents are stripped (`| trim`); a system message (as given) and a blank
  line are prepended to the first user turn's. The response ends with `<end_of_turn>`.
- "gemma4": the turn format of spec §8: `<bos><|turn>user\n{content}<turn|>\n<|turn>model\n`; a system message
  is its own `<|turn>system\n...<turn|>\n` turn. The response ends with `<turn|>`. (The official Jinja
  template was not seen: contents are used as given.)
- "none": BOS + the prompt text; the response as is. Only one user turn and one assistant turn.

The text between two markers is encoded as one string, as a tokenizer that matches the markers whole splits a
rendered conversation there anyway; so the ids equal transformers' `apply_chat_template` on the whole string.
"""

from __future__ import annotations

import dataclasses

from dgemma.data.tokenizer import Tokenizer

TEMPLATES = ("auto", "none", "gemma3", "gemma4")
_MARKERS = {"gemma3": ("<start_of_turn>", "<end_of_turn>"), "gemma4": ("<|turn>", "<turn|>")}
_ASSISTANT = ("assistant", "model")


class ChatError(ValueError):
  """A conversation the template cannot render (the caller adds the file and line)."""


def resolve(template: str, tokenizer: Tokenizer) -> str:
  """'auto' -> the template whose markers the vocabulary has (gemma4 first), else 'none'; any other name is
  checked: its markers must be single tokens of the vocabulary."""
  if template not in TEMPLATES:
    raise ValueError(f"unknown chat template {template!r}; choose from {', '.join(TEMPLATES)}")
  if template == "auto":
    return next((t for t in ("gemma4", "gemma3") if all(map(tokenizer.has_token, _MARKERS[t]))), "none")
  missing = [m for m in _MARKERS.get(template, ()) if not tokenizer.has_token(m)]
  if missing:
    raise ValueError(f"chat template {template!r} needs the tokens {', '.join(missing)}, which the vocabulary of "
                     f"{tokenizer.path} lacks")
  return template


def end_of_turn_id(template: str, tokenizer: Tokenizer) -> int | None:
  """The id that ends a response (a stop id of the model), None for 'none'."""
  return tokenizer.id_of(_MARKERS[template][1]) if template in _MARKERS else None


@dataclasses.dataclass(frozen=True)
class Turn:
  role: str
  content: str


def check(turns: tuple[Turn, ...], need_response: bool) -> None:
  """ChatError unless the roles are known and in order (an optional first system message, then user/assistant
  alternating from user) and the conversation ends as asked (an assistant turn, or a user turn for a prompt)."""
  if not turns:
    raise ChatError("the conversation is empty")
  for i, turn in enumerate(turns):
    if turn.role not in ("system", "user") + _ASSISTANT:
      raise ChatError(f"unknown role {turn.role!r} (roles: system, user, assistant)")
    if turn.role == "system" and i:
      raise ChatError("only the first message may be a system message")
  body = [t for t in turns if t.role != "system"]
  for i, turn in enumerate(body):
    if (turn.role == "user") != (i % 2 == 0):
      raise ChatError("roles must alternate user/assistant, starting with user")
  if need_response and (len(body) < 2 or body[-1].role not in _ASSISTANT):
    raise ChatError("the last message must be an assistant turn after a user turn")
  if not need_response and body[-1].role != "user":
    raise ChatError("a prompt must end with a user turn")


def _segments(template: str, turns: tuple[Turn, ...], generation_prompt: bool) -> list:
  """The rendered conversation as marker names and text runs, in order."""
  start, end = _MARKERS[template]
  out: list = []
  prefix = ""
  if turns[0].role == "system":
    if template == "gemma3":
      prefix = turns[0].content + "\n\n"  # (not trimmed, as in the official template)
    else:
      out += [(start,), "system\n" + turns[0].content, (end,), "\n"]
    turns = turns[1:]
  for i, turn in enumerate(turns):
    role = "model" if turn.role in _ASSISTANT else turn.role
    content = turn.content.strip() if template == "gemma3" else turn.content
    out += [(start,), role + "\n" + (prefix if i == 0 else "") + content, (end,), "\n"]
  if generation_prompt:
    out += [(start,), "model\n"]
  return out


def _encode(segments: list, tokenizer: Tokenizer) -> list[int]:
  ids: list[int] = []
  for seg in segments:
    if isinstance(seg, tuple):  # a marker: its own id
      ids.append(tokenizer.id_of(seg[0]))
    elif seg:
      ids += tokenizer.encode(seg, add_bos=False)
  return ids


def encode_prompt(template: str, turns: tuple[Turn, ...], tokenizer: Tokenizer) -> list[int]:
  """BOS + the conversation (ending with a user turn) + the generation prompt."""
  check(turns, need_response=False)
  if template == "none":
    if len(turns) != 1:
      raise ChatError("chat_template='none' takes one user turn (a system message or several turns need a template)")
    return tokenizer.encode(turns[0].content, add_bos=True)
  return [tokenizer.bos_id] + _encode(_segments(template, turns, generation_prompt=True), tokenizer)


def encode_example(template: str, turns: tuple[Turn, ...], tokenizer: Tokenizer) -> tuple[list[int], list[int]]:
  """(prompt ids, response ids): everything before the last assistant turn as the prompt (with the generation
  prompt), that turn's content as the response, ended by the template's end-of-turn marker."""
  check(turns, need_response=True)
  prompt = encode_prompt(template, turns[:-1], tokenizer)
  content = turns[-1].content
  if template == "none":
    return prompt, tokenizer.encode(content, add_bos=False)
  content = content.strip() if template == "gemma3" else content
  return prompt, _encode([content, (_MARKERS[template][1],)], tokenizer)
