"""Canvas splitting and padding against a brute-force construction, position by position; prompt rows."""

import itertools

import numpy as np
import pytest

from dgemma.tasks.text import canvases

EOS, PAD, STOP = 1, 0, 9


def brute_force(response, c, n):
  """Position j of canvas k = j // c: the response's j-th token while there is one; else EOS if canvas k is
  needed (it holds response tokens, or the response's end, which needs one EOS unless the response ends with a
  stop id or was cut); else PAD. The mask is True on every needed canvas."""
  kept = response[:c * n]
  cut = len(response) > c * n
  needs_eos = not cut and not (kept and kept[-1] == STOP)
  needed = [k for k in range(n) if k * c < len(kept) or (needs_eos and k * c <= len(kept))] or [0]
  canvas, mask = [], []
  for j in range(c * n):
    k = j // c
    canvas.append(kept[j] if j < len(kept) else (EOS if k in needed else PAD))
    mask.append(k in needed)
  return canvas, mask, cut


@pytest.mark.parametrize("c, n", [(1, 1), (1, 3), (3, 1), (4, 2), (5, 3)])
def test_canvas_rows_match_brute_force(c, n):
  rng = np.random.default_rng(c * 10 + n)
  for length in range(0, c * n + 3):
    for end in (None, STOP):
      response = [int(x) for x in rng.integers(10, 20, length)]
      if end is not None and response:
        response[-1] = end
      canvas, mask, cut = canvases.canvas_rows(response, c, n, EOS, PAD, stop_ids=(STOP, EOS))
      want_canvas, want_mask, want_cut = brute_force(response, c, n)
      assert canvas.tolist() == want_canvas and mask.tolist() == want_mask and cut == want_cut, (response, c, n)
      assert canvas.dtype == np.int32 and mask.dtype == bool


def test_canvas_examples():
  def rows(response):
    canvas, mask, cut = canvases.canvas_rows(response, 3, 3, EOS, PAD, (STOP,))
    return [canvas.tolist(), mask.astype(int).tolist(), cut]

  assert rows([7, 8]) == [[7, 8, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0, 0], False]
  assert rows([7, 8, 8]) == [[7, 8, 8, 1, 1, 1, 0, 0, 0], [1] * 6 + [0] * 3, False]  # its EOS: a second canvas
  assert rows([7, 8, STOP]) == [[7, 8, STOP, 0, 0, 0, 0, 0, 0], [1] * 3 + [0] * 6, False]  # ends with a stop
  assert rows(list(range(10, 20))) == [list(range(10, 19)), [1] * 9, True]  # cut, counted


def test_prompt_rows_left_padded_and_truncated_from_the_left_keeping_bos():
  for length, p in itertools.product(range(1, 9), range(2, 6)):
    ids = [2] + list(range(10, 10 + length - 1))
    row, cut = canvases.prompt_row(ids, p, PAD)
    want = ids if length <= p else [2] + ids[length - (p - 1):]
    assert row.tolist() == [PAD] * (p - len(want)) + want and cut == (length > p)
  with pytest.raises(canvases.PromptTooLong, match="the prompt has 5 tokens, more than prompt_len=4"):
    canvases.prompt_row([2, 3, 4, 5, 6], 4, PAD, "error")
