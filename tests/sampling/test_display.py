"""The step-by-step views: frames from a trajectory, terminal, HTML and GIF output."""

import io

import numpy as np
import pytest

from dgemma.sampling import display

# Two canvases of 3 tokens; the first ran 3 steps, the second 2 (then the row stopped: frozen repeats).
TRAJECTORY = np.array([
    [[5, 6, 7], [5, 8, 7], [5, 8, 9]],
    [[4, 4, 4], [4, 1, 4], [4, 1, 4]],
])
STEPS = np.array([3, 2])
COMMITTED = np.array([[5, 8, 9], [4, 1, 0]])


def test_frames_follow_the_trajectory():
  frames = display.build_frames(TRAJECTORY, STEPS, COMMITTED, lambda t: f"t{t} ")
  assert [f.label for f in frames] == ["canvas 1/2 · step 1/3", "canvas 1/2 · step 2/3", "canvas 1/2 · step 3/3",
                                       "canvas 2/2 · step 1/3", "canvas 2/2 · step 2/3"]
  assert [t for t, _ in frames[2].pieces] == ["t5 ", "t8 ", "t9 "]
  assert [c for _, c in frames[1].pieces] == [False, True, False]
  # Later canvases show the committed ones before them, unchanged.
  assert [t for t, _ in frames[4].pieces] == ["t5 ", "t8 ", "t9 ", "t4 ", "t1 ", "t4 "]
  assert [c for _, c in frames[4].pieces] == [False, False, False, False, True, False]
  assert display.build_frames(TRAJECTORY, np.array([0, 0]), COMMITTED, str) == []


def test_terminal_output_plain_and_animated():
  frames = display.build_frames(TRAJECTORY, STEPS, COMMITTED, lambda t: f"t{t} ")
  plain = io.StringIO()
  display.show_in_terminal(frames, plain, animate=False)
  lines = plain.getvalue().splitlines()
  assert lines[0] == "--- canvas 1/2 · step 1/3" and lines[3] == "t5 [t8] t7 "
  animated = io.StringIO()
  display.show_in_terminal(frames, animated, delay=0.0, animate=True)
  assert animated.getvalue().count("\x1b[H\x1b[2J") == len(frames)
  assert "\x1b[1;33mt8 \x1b[0m" in animated.getvalue()


def test_html_is_self_contained_and_escaped(tmp_path):
  frames = display.build_frames(TRAJECTORY, STEPS, COMMITTED, lambda t: "</script><b>" if t == 9 else f"t{t} ")
  path = tmp_path / "steps.html"
  display.write_html(str(path), frames, title="a <title>")
  page = path.read_text()
  assert page.count("</script>") == 1  # only the real closing tag: token text cannot end the script
  assert "<\\/script><b>" in page and "a &lt;title&gt;" in page
  assert page.count('{"label": ') == len(frames)
  with pytest.raises(ValueError, match="no frames"):
    display.write_html(str(path), [])


def test_gif_needs_pillow(tmp_path):
  frames = display.build_frames(TRAJECTORY, STEPS, COMMITTED, lambda t: f"t{t} ")
  path = tmp_path / "steps.gif"
  try:
    import PIL  # noqa: F401
  except ImportError:
    with pytest.raises(RuntimeError, match="writing a GIF needs Pillow"):
      display.write_gif(str(path), frames)
    return
  display.write_gif(str(path), frames)
  assert path.read_bytes()[:6] in (b"GIF87a", b"GIF89a")
