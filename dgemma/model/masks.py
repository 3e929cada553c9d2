"""Every attention mask of the model, in one place.

A mask is a boolean array [B, T, S_keys] (True = may attend). The XLA attention uses it directly; the
Pallas kernels take the same structured inputs (positions, valid slots, window) and are tested against
these functions.

Keys of slot s sit at position s. Window W: a local-layer query at position q sees keys with q - W < s <= q
(W tokens including itself) in the causal encoder.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


def encoder_mask(q_pos_BxT: Int[Array, "B T"], key_valid_BxS: Bool[Array, "B S"],
                 window: int | None) -> Bool[Array, "B T S"]:
  """Causal prefill / append: a query sees valid earlier slots (and itself), within the window if local."""
  s = jnp.arange(key_valid_BxS.shape[1])[None, None, :]
  q = q_pos_BxT[:, :, None]
  mask = key_valid_BxS[:, None, :] & (s <= q)
  if window is not None:
    mask &= q - s < window
  return mask


def denoiser_mask(end_B: Int[Array, "B"], key_valid_BxS: Bool[Array, "B S"], canvas_len: int,
                  window: int | None) -> Bool[Array, "B C S+C"]:
  """Canvas queries over [cache ‖ canvas]: bidirectional inside the canvas, read-only over the cache.

  Cache slot s is visible iff it is valid and s < end. Local layers see only the last W-1 cache slots
  (s >= end - (W-1)), the same for every canvas query: this is Hugging Face's sliding-window cache, which
  keeps W-1 tokens. The canvas itself is always fully visible.
  """
  b, cap = key_valid_BxS.shape
  s = jnp.arange(cap)[None, :]
  end = end_B[:, None]
  cache_vis = key_valid_BxS & (s < end)
  if window is not None:
    cache_vis &= s >= end - (window - 1)
  canvas_vis = jnp.ones((b, canvas_len), bool)
  row = jnp.concatenate([cache_vis, canvas_vis], axis=1)  # identical for every canvas query
  return jnp.broadcast_to(row[:, None, :], (b, canvas_len, cap + canvas_len))


def shared_features(position_features_LxF: Int[Array, "L F"], q_pos_BxT: Int[Array, "B T"],
                    k_pos_BxS: Int[Array, "B S"]) -> Float[Array, "F B T S"]:
  """For `ModelConfig.relation_bias`: 1.0 where feature f of the query's position equals feature f of the
  key's (e.g. on a grid: same segment / row / column / box), else 0.0. Positions past the table use its last row (as
  the position embedding does)."""
  ids_LxF = jnp.asarray(position_features_LxF, jnp.int32)
  last = ids_LxF.shape[0] - 1
  q_BxTxF = ids_LxF[jnp.clip(q_pos_BxT, 0, last)]
  k_BxSxF = ids_LxF[jnp.clip(k_pos_BxS, 0, last)]
  same_BxTxSxF = q_BxTxF[:, :, None, :] == k_BxSxF[:, None, :, :]
  return jnp.moveaxis(same_BxTxSxF, -1, 0).astype(jnp.float32)
