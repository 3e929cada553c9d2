"""Multi-head attention with GQA, QK-norm, V-norm, (proportional) RoPE and attention scale 1.0
(Gemma 3: queries scaled by `config.query_scale`, no V-norm).

Two ways to read keys, chosen by the caller:
- encode (`write_at` given): the new K/V are written into the layer cache at per-row slot `write_at`, and the
  queries attend over the whole updated cache (causal mask);
- denoise (`write_at` None): the cache is read-only; the canvas K/V are concatenated after it.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from dgemma.config import ModelConfig
from dgemma.model.layers import RMSNorm, apply_rope, init_normal, param_dtype, rope_inv_freq, token_matmul
from pallas_kernels.reference import dot_product_attention  # the XLA path, also the kernel's reference


def write_rows(cache_BxSx: Array, new_BxTx: Array, start_B: Int[Array, "B"]) -> Array:
  """Writes new_BxTx into cache_BxSx at slot start_B[b] of each row."""
  def one(c, x, i):
    return jax.lax.dynamic_update_slice_in_dim(c, x.astype(c.dtype), i, axis=0)
  return jax.vmap(one)(cache_BxSx, new_BxTx, start_B)


class Attention(nn.Module):
  config: ModelConfig
  kind: str  # LOCAL or GLOBAL

  @nn.compact
  def __call__(self, x_BxTxD: Array, positions_BxT: Int[Array, "B T"], mask: Bool[Array, "B T S"],
               layer_kv: tuple[Array, Array], write_at: Int[Array, "B"] | None,
               shared_FxBxTxS: Array | None = None):
    """`mask` is dense [B, T, S] for the XLA attention, a `pallas_kernels.mask_spec.AttentionMask` (the same
    mask, structured so hidden key blocks can be skipped) when this layer's kind and mode take "pallas"
    (config.attention_for).
    `shared_FxBxTxS`: which position features each (query, key) pair shares (`masks.shared_features`), when
    config.relation_bias."""
    cfg, kind = self.config, self.kind
    dt = param_dtype(cfg)
    d, n, kv, h = cfg.width, cfg.num_heads, cfg.num_kv_heads(kind), cfg.head_dim(kind)
    q_proj = self.param("q_proj", init_normal, (d, n, h), dt)
    k_proj = self.param("k_proj", init_normal, (d, kv, h), dt)
    v_proj = self.param("v_proj", init_normal, (d, kv, h), dt) if cfg.has_v_proj(kind) else None
    o_proj = self.param("o_proj", init_normal, (n, h, d), dt)
    inv_freq = rope_inv_freq(h, *cfg.rope(kind))

    mm = cfg.matmul_dtype
    # One matmul for q, k and v (the weights are concatenated once; XLA hoists that out of sampling loops).
    projections = [q_proj, k_proj] + ([] if v_proj is None else [v_proj])
    qkv = token_matmul(x_BxTxD, jnp.concatenate([w.reshape(d, -1) for w in projections], axis=1),
                       operand_dtype=mm)
    q, k_raw, v_raw = jnp.split(qkv, [n * h, (n + kv) * h], axis=-1)  # v_raw is empty without v_proj
    q, k_raw = q.reshape(q.shape[:-1] + (n, h)), k_raw.reshape(k_raw.shape[:-1] + (kv, h))
    v_raw = k_raw if v_proj is None else v_raw.reshape(v_raw.shape[:-1] + (kv, h))
    q = apply_rope(RMSNorm(cfg.rms_norm_eps, dtype=dt, name="q_norm")(q), positions_BxT, inv_freq)
    if cfg.query_scale != 1.0:  # Gemma 3; scaling q rather than the logits keeps every attention kernel as is
      q = q * jnp.asarray(cfg.query_scale, q.dtype)
    k = apply_rope(RMSNorm(cfg.rms_norm_eps, dtype=dt, name="k_norm")(k_raw), positions_BxT, inv_freq)
    v = RMSNorm(cfg.rms_norm_eps, with_scale=False, name="v_norm")(v_raw) if cfg.value_norm else v_raw  # no RoPE

    cache_k, cache_v = layer_kv
    if write_at is not None:
      keys, values = write_rows(cache_k, k, write_at), write_rows(cache_v, v, write_at)
      new_kv = (keys, values)
    else:
      keys = jnp.concatenate([cache_k, k.astype(cache_k.dtype)], axis=1)
      values = jnp.concatenate([cache_v, v.astype(cache_v.dtype)], axis=1)
      new_kv = None

    bias = None
    if cfg.relation_bias:
      # Additive over the shared features, written as elementwise sums that XLA fuses: on CPU a bias per
      # combination of them (2^F, a one-hot contraction or a gather) or an einsum over F made the whole training
      # step markedly slower.
      weights_FxN = self.param("relation_bias", nn.initializers.zeros, (cfg.num_position_features, n), dt)
      bias = sum(weights_FxN[f].astype(jnp.float32)[None, :, None, None] * shared_FxBxTxS[f][:, None]
                 for f in range(shared_FxBxTxS.shape[0]))
    if cfg.attention_for(kind, "denoise" if write_at is None else "encode") == "pallas":
      from pallas_kernels import attention as attention_kernels  # optional GPU path
      out = attention_kernels.attention(q, keys, values, mask)
    else:
      out = dot_product_attention(q, keys, values, mask, bias)
    return token_matmul(out, o_proj, contract_dims=2, operand_dtype=mm), new_kv
