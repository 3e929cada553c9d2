"""One example's token rows: the prompt left-padded to `prompt_len`, the response split into canvases.

Left padding puts every prompt's last token in the slot just before the first canvas, so the transition from
prompt to response is a real token pair in every row: an `objective=ar` twin trains on it (its loss masks pairs
with a PAD) and decodes the first response token from the same slot. Pads are masked keys; positions are slot
indices, and attention depends only on position differences (RoPE), so where the pads sit changes nothing else.

Layout (spec §4.2, as the official CanvasChunker): the response tokens fill canvases of `canvas_len` in order,
the rest of the last one is EOS, the canvases after it are PAD; `canvas_mask` is True on every token of every
canvas that holds response tokens or EOS fill (the fill is part of the target), False on the PAD canvases. One
difference: a response that does not end with a stop id always gets at least one EOS (a response filling its
last canvas exactly gets a canvas of EOS after it), so the model learns where text ends. A response longer
than `max_canvases` canvases is cut there (then there is no EOS: the text goes on).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

OVERFLOW = ("truncate", "error", "skip")  # what a prompt longer than prompt_len gets


class PromptTooLong(ValueError):
  pass


def prompt_row(ids: Sequence[int], prompt_len: int, pad_id: int, overflow: str = "truncate"
               ) -> tuple[np.ndarray, bool]:
  """([prompt_len] int32 left-padded with PAD, whether it was cut). A prompt longer than `prompt_len` keeps
  its first token (BOS) and its last prompt_len - 1 tokens (truncated from the left: the end of a prompt, next
  to the response, matters most); with overflow != 'truncate' it raises PromptTooLong."""
  ids = list(ids)
  cut = len(ids) > prompt_len
  if cut:
    if overflow != "truncate":
      raise PromptTooLong(f"the prompt has {len(ids)} tokens, more than prompt_len={prompt_len}")
    ids = ids[:1] + ids[len(ids) - (prompt_len - 1):]
  row = np.full(prompt_len, pad_id, np.int32)
  row[prompt_len - len(ids):] = ids
  return row, cut


def canvas_rows(response: Sequence[int], canvas_len: int, max_canvases: int, eos_id: int, pad_id: int,
                stop_ids: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray, bool]:
  """([N*C] int32 canvas, [N*C] bool canvas_mask, whether the response was cut), N = max_canvases."""
  capacity = canvas_len * max_canvases
  response = list(response)
  cut = len(response) > capacity
  response = response[:capacity]
  ends = bool(response) and response[-1] in set(stop_ids)
  used = -(-(len(response) + (0 if ends or cut else 1)) // canvas_len)  # canvases holding text or its EOS
  used = max(1, min(used, max_canvases))
  canvas = np.full(capacity, pad_id, np.int32)
  canvas[:used * canvas_len] = eos_id
  canvas[:len(response)] = response
  mask = np.zeros(capacity, bool)
  mask[:used * canvas_len] = True
  return canvas, mask, cut
