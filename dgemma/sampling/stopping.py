"""When to stop: the per-row adaptive stop of a canvas's denoising loop (HF's
StableAndConfidentStoppingCriteria) and the end-of-sequence handling of a finished canvas (HF's
`_finalize_canvas`), spec §5.1 g and §5.3.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


def init_history(stability_threshold: int, batch: int, canvas_length: int) -> Int[Array, "S B C"]:
  """The argmax canvases of the last `stability_threshold` steps, initialised to -1 (matches no token), so
  the earliest possible stop is the (threshold + 1)-th step."""
  return jnp.full((stability_threshold, batch, canvas_length), -1, jnp.int32)


def stable_and_confident(history_SxBxC: Int[Array, "S B C"], argmax_BxC: Int[Array, "B C"],
                         entropy_BxC: Float[Array, "B C"], confidence_threshold: float
                         ) -> tuple[Bool[Array, "B"], Int[Array, "S B C"]]:
  """(stop per row, updated history).

  stable: the argmax canvas equals each of the previous S argmax canvases (always true for S = 0).
  confident: the mean per-position entropy of the tempered logits is below the threshold (strictly).
  """
  stable = jnp.all(history_SxBxC == argmax_BxC[None], axis=(0, 2))
  confident = jnp.mean(entropy_BxC, axis=-1) < confidence_threshold
  if history_SxBxC.shape[0]:  # drop the oldest canvas, append this one
    history_SxBxC = jnp.concatenate([history_SxBxC[1:], argmax_BxC[None].astype(jnp.int32)], axis=0)
  return stable & confident, history_SxBxC


def truncate_at_stop(canvas_BxC: Int[Array, "B C"], finished_before_B: Bool[Array, "B"],
                     stop_ids: tuple[int, ...], pad_id: int) -> tuple[Int[Array, "B C"], Bool[Array, "B"]]:
  """(committed canvas, finished after this canvas).

  Rows finished in an earlier canvas get an all-pad canvas. In the others, everything after the first stop
  token becomes pad (the stop token itself is kept), and a row with a stop token is finished.
  """
  canvas = jnp.where(finished_before_B[:, None], pad_id, canvas_BxC)
  is_stop = jnp.isin(canvas, jnp.asarray(stop_ids, canvas.dtype)) if stop_ids else jnp.zeros_like(canvas, bool)
  seen = jnp.cumsum(is_stop, axis=-1)
  after_first = (seen > 1) | ((seen == 1) & ~is_stop)
  canvas = jnp.where(after_first, pad_id, canvas)
  return canvas, finished_before_B | jnp.any(is_stop, axis=-1)
