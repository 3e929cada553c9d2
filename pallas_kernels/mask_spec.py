"""A structured description of the model's attention masks, so kernels can skip hidden blocks.

A dense [B, T, S] boolean mask tells a kernel nothing about which key blocks are empty until it has read
them. Every mask the model uses (spec §2.1, §2.2, §4.3; `dgemma.model.masks`) has the same shape instead:

    keys are [ranged keys (S0 slots) ‖ tail keys (num_tail slots)]
    query i of row b sees ranged slot s  iff  key_valid[b, s]  and  lo[b, i] <= s < hi[b, i]
    query i of row b sees every tail key

- causal prefill / incremental append: the keys are the whole (updated) cache, no tail,
  lo = q_pos - W + 1 on local layers (0 on global ones), hi = q_pos + 1;
- denoiser: the keys are [cache ‖ canvas], the canvas is the tail, lo = end - (W - 1) (0 on global layers)
  and hi = end for every canvas query;
- training denoiser (§4.3): the denoiser mask with a per-row end = P + s·C over a cache holding the prompt
  and every clean canvas, valid = [prompt != PAD ‖ canvas_mask] — the same structure, nothing new.

This module only depends on jax.numpy, so the model can build masks without importing Pallas.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int


@dataclasses.dataclass(frozen=True)
class AttentionMask:
  """Structured mask over keys [S0 ranged slots ‖ num_tail always-visible slots] (see module docstring)."""

  key_valid: Bool[Array, "B S0"]  # ranged slot holds a real token
  lo: Int[Array, "B T"]  # first ranged slot query i may see (may be negative: clipped)
  hi: Int[Array, "B T"]  # one past the last ranged slot query i may see
  num_tail: int = 0  # static: trailing keys visible to every query (the denoiser's canvas)

  @property
  def num_ranged(self) -> int:
    return self.key_valid.shape[1]

  @property
  def num_keys(self) -> int:
    return self.num_ranged + self.num_tail

  @property
  def num_queries(self) -> int:
    return self.lo.shape[1]

  @classmethod
  def causal(cls, q_pos_BxT: Int[Array, "B T"], key_valid_BxS: Bool[Array, "B S"],
             window: int | None) -> "AttentionMask":
    """`masks.encoder_mask`: valid & s <= q & (q - s < W if local). The keys are the whole cache."""
    q = jnp.asarray(q_pos_BxT, jnp.int32)
    lo = jnp.zeros_like(q) if window is None else q - (window - 1)
    return cls(key_valid=jnp.asarray(key_valid_BxS, bool), lo=lo, hi=q + 1, num_tail=0)

  @classmethod
  def denoiser(cls, end_B: Int[Array, "B"], key_valid_BxS: Bool[Array, "B S"], canvas_len: int,
               window: int | None) -> "AttentionMask":
    """`masks.denoiser_mask` over [cache ‖ canvas]: valid cache slots in [end - (W-1), end), whole canvas.

    Also the training denoiser mask (spec §4.3): pass the per-row end = P + s·C (`KVCache.with_end`).
    """
    end = jnp.broadcast_to(jnp.asarray(end_B, jnp.int32)[:, None], (end_B.shape[0], canvas_len))
    lo = jnp.zeros_like(end) if window is None else end - (window - 1)
    return cls(key_valid=jnp.asarray(key_valid_BxS, bool), lo=lo, hi=end, num_tail=canvas_len)

  def dense(self) -> Bool[Array, "B T S"]:
    """The same mask as a dense boolean array [B, T, S0 + num_tail] (for the XLA path and the tests)."""
    b, s0 = self.key_valid.shape
    s = jnp.arange(s0)[None, None, :]
    ranged = self.key_valid[:, None, :] & (s >= self.lo[:, :, None]) & (s < self.hi[:, :, None])
    tail = jnp.ones((b, self.num_queries, self.num_tail), bool)
    return jnp.concatenate([ranged, tail], axis=2)


jax.tree_util.register_dataclass(AttentionMask, data_fields=["key_valid", "lo", "hi"], meta_fields=["num_tail"])
