"""Training metrics: averaged over each logging window, written to TensorBoard and printed as one line.

The diffusion loss per noise level arrives as per-step (sum, count) per bin of t; summing both over the
window gives the mean loss of each noise level, logged as `loss_by_t/0.0-0.1`, ... . `write` also takes texts
(an evaluation's generated samples): TensorBoard shows them verbatim in its Text tab, and train.log gets them.
"""

from __future__ import annotations

import math
import time

import numpy as np
from absl import logging

_TEXT_SUFFIX = "/text_summary"  # what tensorboardX appends to a text's tag


def bin_tags(num_bins: int) -> list[str]:
  """`loss_by_t/<low>-<high>` per bin of t, with as few decimals as keep every edge exact or distinct (0.1 for 10
  bins, 0.25 for 4, 0.05 for 20), so that no two bins share a tag."""
  def edges(decimals):
    return [f"{k / num_bins:.{decimals}f}" for k in range(num_bins + 1)]
  decimals = next((d for d in range(1, 7) if all(float(e) == k / num_bins for k, e in enumerate(edges(d)))),
                  max(1, math.ceil(math.log10(num_bins)) + 1))
  e = edges(decimals)
  return [f"loss_by_t/{e[k]}-{e[k + 1]}" for k in range(num_bins)]


class MetricsLogger:
  def __init__(self, logdir: str | None, total_steps: int, tokens_per_example: int, batch_size: int,
               echo: bool = True):
    self.echo = echo  # print the progress line (only process 0 does in multi-process runs)
    if logdir:
      # Imported here: tensorboardX imports torch when it is installed, which a command that fails on its
      # arguments, or never logs, should not wait for.
      from tensorboardX import SummaryWriter
      self.writer = SummaryWriter(logdir)
    else:
      self.writer = None
    self.total_steps = total_steps
    self.tokens_per_example = tokens_per_example
    self.batch_size = batch_size
    self._reset(time.time(), None)

  def _reset(self, now: float, step: int | None) -> None:
    self._sums: dict[str, float] = {}
    self._bin_sum = self._bin_count = None
    self._n = 0
    self._window_start = now
    self._window_first_step = step

  def add(self, step: int, metrics: dict) -> None:
    """Adds one step's metrics (already on the host)."""
    if self._window_first_step is None:
      self._window_first_step = step
    for k, v in metrics.items():
      if k == "loss_by_t_sum":
        self._bin_sum = np.asarray(v) + (0 if self._bin_sum is None else self._bin_sum)
      elif k == "loss_by_t_count":
        self._bin_count = np.asarray(v) + (0 if self._bin_count is None else self._bin_count)
      else:
        self._sums[k] = self._sums.get(k, 0.0) + float(v)
    self._n += 1

  def flush(self, step: int, extra: dict | None = None) -> dict:
    """Writes the window's averages at `step` (the number of updates done) and prints a progress line."""
    if not self._n:
      return {}
    now = time.time()
    elapsed = max(now - self._window_start, 1e-9)
    scalars = {k: v / self._n for k, v in self._sums.items()}
    examples_per_s = self._n * self.batch_size / elapsed
    scalars["examples_per_second"] = examples_per_s
    scalars["tokens_per_second"] = examples_per_s * self.tokens_per_example
    scalars.update(extra or {})
    if self._bin_sum is not None:
      for tag, s, c in zip(bin_tags(len(self._bin_sum)), self._bin_sum, self._bin_count):
        if c > 0:
          scalars[tag] = float(s / c)
    if self.writer:
      for k, v in scalars.items():
        self.writer.add_scalar(k, v, step)
      self.writer.flush()
    eta = (self.total_steps - step) * elapsed / self._n
    parts = [f"step {step}/{self.total_steps}", f"loss {scalars.get('loss', math.nan):.4f}"]
    for key, label in (("diffusion_loss", "diff"), ("ar_loss", "ar"), ("diffusion_accuracy", "acc")):
      if key in scalars:
        parts.append(f"{label} {scalars[key]:.4f}")
    parts += [f"{examples_per_s:.1f} ex/s", f"ETA {_duration(eta)}"]
    if self.echo:
      print(" | ".join(parts), flush=True)
    self._reset(now, None)
    return scalars

  def exclude(self, seconds: float) -> None:
    """Leaves `seconds` of other work (an evaluation) out of the window's examples/s."""
    self._window_start += seconds

  def write(self, step: int, values: dict[str, float | str]) -> None:
    """Writes scalars, and texts (str values) verbatim, at `step`; only where this logger has a writer (process 0),
    which also logs the texts (train.log)."""
    if self.writer:
      for k, v in values.items():
        if isinstance(v, str):
          self.writer.add_text(k, verbatim(v), step)
          logging.info("%s at step %d:\n%s", k, step, v)
        else:
          self.writer.add_scalar(k, v, step)
      self.writer.flush()

  def close(self) -> None:
    if self.writer:
      self.writer.close()


def _duration(seconds: float) -> str:
  seconds = int(max(seconds, 0))
  h, rem = divmod(seconds, 3600)
  m, s = divmod(rem, 60)
  return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s"


def verbatim(text: str) -> str:
  """Text as TensorBoard's Text tab (Markdown) shows it unchanged: an indented code block, whitespace kept."""
  return "\n".join("    " + line for line in text.split("\n"))


def _summary_values(logdir: str):
  """(step, Summary.Value) of every value in a TensorBoard log directory's event files, in file order.

  Event files are TFRecord streams (length, crc, payload, crc) of `Event` protos.
  """
  import glob
  import struct

  from tensorboardX.proto import event_pb2

  for path in sorted(glob.glob(f"{logdir}/events.out.tfevents.*")):
    with open(path, "rb") as f:
      data = f.read()
    pos = 0
    while pos + 12 <= len(data):
      (length,) = struct.unpack("<Q", data[pos:pos + 8])
      payload = data[pos + 12:pos + 12 + length]
      pos += 12 + length + 4
      event = event_pb2.Event.FromString(payload)
      for value in event.summary.value:
        yield event.step, value


def read_scalars(logdir: str) -> dict[str, list[tuple[int, float]]]:
  """All scalars in a TensorBoard log directory: {tag: [(step, value), ...]} (for plots and tests)."""
  out: dict[str, list[tuple[int, float]]] = {}
  for step, value in _summary_values(logdir):
    if value.WhichOneof("value") == "simple_value":
      out.setdefault(value.tag, []).append((step, value.simple_value))
  return out


def read_texts(logdir: str) -> dict[str, list[tuple[int, str]]]:
  """All texts in a TensorBoard log directory as `MetricsLogger.write` was given them: {tag: [(step, text), ...]}."""
  out: dict[str, list[tuple[int, str]]] = {}
  for step, value in _summary_values(logdir):
    # (by the tag: a writer may keep the text plugin's metadata on the tag's first value only)
    if value.tag.endswith(_TEXT_SUFFIX) and value.WhichOneof("value") == "tensor" and value.tensor.string_val:
      shown = value.tensor.string_val[0].decode("utf-8")
      text = "\n".join(line[4:] if line.startswith("    ") else line for line in shown.split("\n"))
      out.setdefault(value.tag.removesuffix(_TEXT_SUFFIX), []).append((step, text))
  return out
