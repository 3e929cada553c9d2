"""Step-by-step pictures of a canvas converging: terminal animation, a self-contained HTML player, and a GIF
(only where Pillow is installed).

A frame is the response so far: the committed canvases, then the argmax canvas of the current step. Tokens
that changed since the previous frame are marked, so the noise visibly settles into text.
"""

from __future__ import annotations

import dataclasses
import html
import json
import sys
import time
from typing import Callable, Sequence, TextIO

import numpy as np


@dataclasses.dataclass
class Frame:
  label: str  # e.g. "canvas 1/2 · step 3/48"
  pieces: list[tuple[str, bool]]  # (text, changed since the previous frame)


def build_frames(trajectory_NxSxC: np.ndarray, steps_N: np.ndarray, committed_NxC: np.ndarray,
                 token_text: Callable[[int], str]) -> list[Frame]:
  """Frames for one batch row: every executed step of every executed canvas.

  `trajectory_NxSxC` is `GenerateOutput.trajectory[row]`, `steps_N` its `steps_per_canvas[row]` and
  `committed_NxC` the row's committed canvases (`tokens[row]` reshaped to [N, C]).
  """
  trajectory_NxSxC = np.asarray(trajectory_NxSxC)
  num_canvases, max_steps, _ = trajectory_NxSxC.shape
  texts: dict[int, str] = {}  # each token's text is computed once (tokenizers are slow per call)

  def text_of(token: int) -> str:
    if token not in texts:
      texts[token] = token_text(token)
    return texts[token]

  frames: list[Frame] = []
  previous: list[int] | None = None
  prefix: list[int] = []
  for i in range(num_canvases):
    ran = int(steps_N[i])  # a row's own steps come first; later entries are frozen repeats or -1
    if ran == 0:
      break
    for k in range(ran):
      ids = prefix + [int(t) for t in trajectory_NxSxC[i, k]]
      changed = [previous is None or j >= len(previous) or previous[j] != t for j, t in enumerate(ids)]
      frames.append(Frame(label=f"canvas {i + 1}/{num_canvases} · step {k + 1}/{max_steps}",
                          pieces=[(text_of(t), c) for t, c in zip(ids, changed)]))
      previous = ids
    prefix = prefix + [int(t) for t in committed_NxC[i]]
  return frames


def _ansi(frame: Frame) -> str:
  # Changed tokens in bold yellow: the parts of the canvas that are still moving.
  return "".join(f"\x1b[1;33m{t}\x1b[0m" if c and t.strip() else t for t, c in frame.pieces)


def _bracket(text: str) -> str:
  core = text.strip()
  start = text.index(core)
  return f"{text[:start]}[{core}]{text[start + len(core):]}"


def show_in_terminal(frames: Sequence[Frame], stream: TextIO | None = None, delay: float = 0.08,
                     animate: bool | None = None) -> None:
  """Plays the frames on `stream` (default: the current sys.stdout). On a terminal each frame redraws the
  screen; elsewhere every frame is printed plainly in turn (changed tokens are then wrapped in [brackets])."""
  stream = sys.stdout if stream is None else stream
  if animate is None:
    animate = hasattr(stream, "isatty") and stream.isatty()
  for n, frame in enumerate(frames):
    if animate:
      stream.write("\x1b[H\x1b[2J" + f"\x1b[2m{frame.label}\x1b[0m\n" + _ansi(frame) + "\n")
      stream.flush()
      if n + 1 < len(frames):
        time.sleep(delay)
    else:
      text = "".join(_bracket(t) if c and t.strip() else t for t, c in frame.pieces)
      stream.write(f"--- {frame.label}\n{text}\n")
  stream.flush()


_HTML = """<!doctype html>
<html><head><meta charset="utf-8"><title>{title}</title>
<style>
 body {{ font-family: ui-monospace, monospace; background: #111; color: #ddd; margin: 2em; }}
 #canvas {{ white-space: pre-wrap; line-height: 1.5; font-size: 15px; max-width: 70em; }}
 .chg {{ color: #111; background: #e6b422; border-radius: 2px; }}
 #label {{ color: #888; margin: 1em 0; }}
 button {{ font: inherit; }}
</style></head>
<body>
<h3>{title}</h3>
<div><button id="play">pause</button> <input id="slider" type="range" min="0" value="0" style="width:30em">
<span id="label"></span></div>
<div id="canvas"></div>
<script>
const frames = {frames};
const canvas = document.getElementById("canvas"), label = document.getElementById("label");
const slider = document.getElementById("slider"), play = document.getElementById("play");
slider.max = frames.length - 1;
let i = 0, playing = true;
function draw(n) {{
  const f = frames[n];
  canvas.replaceChildren();
  for (const [text, changed] of f.pieces) {{
    const span = document.createElement("span");
    span.textContent = text;
    if (changed && text.trim()) span.className = "chg";
    canvas.appendChild(span);
  }}
  label.textContent = f.label + "  (" + (n + 1) + "/" + frames.length + ")";
  slider.value = n;
}}
slider.oninput = () => {{ i = +slider.value; draw(i); }};
play.onclick = () => {{ playing = !playing; play.textContent = playing ? "pause" : "play"; }};
setInterval(() => {{ if (playing && i < frames.length - 1) {{ i += 1; draw(i); }} }}, {delay_ms});
draw(0);
</script></body></html>
"""


def write_html(path: str, frames: Sequence[Frame], title: str = "DiffusionGemma denoising",
               delay: float = 0.15) -> None:
  """A self-contained page that plays the frames (with a slider to scrub through the steps)."""
  if not frames:
    raise ValueError("no frames to write")
  data = [{"label": f.label, "pieces": [[t, bool(c)] for t, c in f.pieces]} for f in frames]
  # "</" is escaped so that no token text can close the script element.
  payload = json.dumps(data, ensure_ascii=False).replace("</", "<\\/")
  with open(path, "w", encoding="utf-8") as f:
    f.write(_HTML.format(title=html.escape(title), frames=payload, delay_ms=int(delay * 1000)))


def write_gif(path: str, frames: Sequence[Frame], delay: float = 0.15, width_chars: int = 80) -> None:
  """An animated GIF of the frames; needs Pillow."""
  try:
    from PIL import Image, ImageDraw, ImageFont
  except ImportError:
    raise RuntimeError("writing a GIF needs Pillow (pip install pillow); --show_steps_html writes the same "
                       "animation as HTML without it") from None
  if not frames:
    raise ValueError("no frames to write")
  font = ImageFont.load_default()
  char_w, line_h = 7, 14

  def lines_of(frame: Frame) -> list[list[tuple[str, bool]]]:
    lines: list[list[tuple[str, bool]]] = [[]]
    col = 0
    for text, changed in frame.pieces:
      for part_idx, part in enumerate(text.split("\n")):
        if part_idx:
          lines.append([])
          col = 0
        while part:
          room = width_chars - col
          if room <= 0:
            lines.append([])
            col, room = 0, width_chars
          lines[-1].append((part[:room], changed))
          col += len(part[:room])
          part = part[room:]
    return lines

  laid_out = [lines_of(f) for f in frames]
  height = (max(len(ls) for ls in laid_out) + 2) * line_h
  images = []
  for frame, lines in zip(frames, laid_out):
    image = Image.new("RGB", (width_chars * char_w + 20, height), (17, 17, 17))
    draw = ImageDraw.Draw(image)
    draw.text((10, 4), frame.label, fill=(136, 136, 136), font=font)
    for row, line in enumerate(lines):
      x = 10
      for text, changed in line:
        y = 4 + (row + 1) * line_h
        if changed and text.strip():
          draw.rectangle([x, y, x + char_w * len(text), y + line_h - 2], fill=(230, 180, 34))
        draw.text((x, y), text, fill=(17, 17, 17) if changed and text.strip() else (221, 221, 221), font=font)
        x += char_w * len(text)
    images.append(image)
  images[0].save(path, save_all=True, append_images=images[1:], duration=int(delay * 1000), loop=0)
