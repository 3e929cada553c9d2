"""Watching the canvas converge while it is sampled (sample.py --stream).

`generate(..., on_step=...)` calls a host function after every denoising step from inside the compiled loop
(jax.debug.callback). `LiveCanvas` is such a function: it keeps one batch row's response so far (the canvases
it has finished, then the argmax canvas of the current step) and redraws it at each step, as the step-by-step
views of display.py do after the run. The callback is compiled in only when given, so a run without --stream
runs the very program it ran before; with it, each step copies the [B, C] argmax canvas to the host and waits
for the redraw (its cost: docs/sampling.md).
"""

from __future__ import annotations

import sys
from typing import Callable, TextIO

import numpy as np

from dgemma.sampling import display


class LiveCanvas:
  """on_step for `generate`: redraws row `row` of the batch after every step it runs.

  `token_text(id)` is one token as display text; `stream` defaults to sys.stderr (so that results on stdout stay
  clean); on a terminal each step rewrites the screen, elsewhere each step is printed plainly in turn. Set `row`
  to None to draw nothing (e.g. while a batch without the watched prompt runs). `frames` counts the redraws.
  """

  def __init__(self, token_text: Callable[[int], str], num_canvases: int, max_steps: int, row: int | None = 0,
               stream: TextIO | None = None, animate: bool | None = None):
    self.token_text = token_text
    self.num_canvases, self.max_steps = num_canvases, max_steps
    self.row = row
    self.stream = stream
    self.animate = animate
    self.frames = 0
    self._texts: dict[int, str] = {}
    self._finished: dict[int, list[int]] = {}  # canvas index -> its last argmax canvas
    self._previous: list[int] | None = None

  def reset(self, row: int | None) -> None:
    """Watch `row` of the next batch, from its first canvas."""
    self.row, self._finished, self._previous = row, {}, None

  def _text(self, token: int) -> str:
    if token not in self._texts:  # (tokenizers are slow per call)
      self._texts[token] = self.token_text(token)
    return self._texts[token]

  def __call__(self, canvas_index, step, argmax_BxC, ran_B) -> None:
    if self.row is None or not bool(np.asarray(ran_B)[self.row]):
      return  # (a row that has stopped waits for the others: nothing to redraw)
    index, step = int(canvas_index), int(step)
    canvas = [int(t) for t in np.asarray(argmax_BxC)[self.row]]
    self._finished[index] = canvas
    ids = [t for i in sorted(self._finished) if i < index for t in self._finished[i]] + canvas
    previous = self._previous
    changed = [previous is None or j >= len(previous) or previous[j] != t for j, t in enumerate(ids)]
    self._previous = ids
    frame = display.Frame(label=f"canvas {index + 1}/{self.num_canvases} · step {step + 1}/{self.max_steps}",
                          pieces=[(self._text(t), c) for t, c in zip(ids, changed)])
    stream = sys.stderr if self.stream is None else self.stream
    display.show_in_terminal([frame], stream, animate=self.animate)
    self.frames += 1
