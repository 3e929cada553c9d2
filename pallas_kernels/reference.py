"""Plain-JAX references of the Pallas kernels, which the model uses as its XLA paths (jax.numpy only: importing
this module pulls in no Pallas).

- `dot_product_attention`: attention on a dense mask (the model's XLA attention); `reference_attention`: the same on
  a structured `AttentionMask`, with the kernel's convention for rows that see no key.
- `experts_sorted`: dropless MoE around a grouped matmul (`lax.ragged_dot` in the model, `moe.gmm` in the kernel's
  `moe.moe_experts`); `gmm_reference` and `moe_dense_reference`: dense references of the grouped matmul and the MoE.

They live here, not in `dgemma.model`, because both sides need them and `pallas_kernels` imports nothing from
`dgemma` (tests/test_import_graph.py).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from pallas_kernels.mask_spec import AttentionMask

_MASKED = -2.3819763e38  # the large negative logit of the reference implementations


def max_last_axis(x: Array) -> Array:
  """max over the last axis as halving elementwise maxima (the same value: max is exact in any order), which XLA
  fuses into small loop kernels; on XLA:CPU each reduction op has a fixed cost that dominates at the sizes of a
  denoising step's softmax."""
  while x.shape[-1] > 1:
    half = x.shape[-1] // 2
    head = jnp.maximum(x[..., :half], x[..., half:2 * half])
    x = head if x.shape[-1] % 2 == 0 else jnp.concatenate([head, x[..., -1:]], axis=-1)
  return x[..., 0]


def dot_product_attention(q_BxTxNxH: Array, k_BxSxKxH: Array, v_BxSxKxH: Array,
                          mask_BxTxS: Bool[Array, "B T S"], bias_BxNxTxS: Array | None = None) -> Array:
  """Plain-XLA attention, the reference every kernel is tested against. Query head n reads KV head n // G.
  `bias_BxNxTxS` (optional) is added to the logits before the mask.

  Heads are moved in front of the tokens first, so that both products are batched matmuls in XLA's canonical
  [batch..., rows, contraction] form, which XLA:CPU runs much faster than einsums over [B, T, N, H].
  """
  b, t, n, h = q_BxTxNxH.shape
  kv_heads = k_BxSxKxH.shape[2]
  g = n // kv_heads
  q_BxKxGTxH = q_BxTxNxH.reshape(b, t, kv_heads, g, h).transpose(0, 2, 3, 1, 4).reshape(b, kv_heads, g * t, h)
  k_BxKxHxS = k_BxSxKxH.transpose(0, 2, 3, 1)
  v_BxKxSxH = v_BxSxKxH.transpose(0, 2, 1, 3)
  logits = jnp.matmul(q_BxKxGTxH, k_BxKxHxS, preferred_element_type=jnp.float32).reshape(b, kv_heads, g, t, -1)
  if bias_BxNxTxS is not None:
    logits = logits + bias_BxNxTxS.reshape(b, kv_heads, g, t, -1).astype(logits.dtype)
  logits = jnp.where(mask_BxTxS[:, None, None], logits, _MASKED)
  # softmax, with the sum over keys as a matmul: XLA:CPU runs that faster than a reduction over the same operand.
  # HIGHEST: a sum, not a TF32 product on GPUs.
  e = jnp.exp(logits - jax.lax.stop_gradient(max_last_axis(logits)[..., None]))
  probs = e / jnp.matmul(e, jnp.ones((e.shape[-1], 1), e.dtype), precision=jax.lax.Precision.HIGHEST)
  probs = probs.astype(v_BxSxKxH.dtype).reshape(b, kv_heads, g * t, -1)
  out = jnp.matmul(probs, v_BxKxSxH).reshape(b, kv_heads, g, t, h)
  return out.transpose(0, 3, 1, 2, 4).reshape(b, t, n, h)


def reference_attention(q_BxTxNxH: Float[Array, "B T N H"], k_BxSxKxH: Float[Array, "B S K H"],
                        v_BxSxKxH: Float[Array, "B S K H"], mask: AttentionMask) -> Float[Array, "B T N H"]:
  """`dot_product_attention` on the materialised mask, with rows that see no key set to 0."""
  dense = mask.dense()
  out = dot_product_attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, dense)
  return jnp.where(dense.any(axis=-1)[:, :, None, None], out, jnp.zeros_like(out))


def gelu_tanh(x: Array) -> Array:
  return jax.nn.gelu(x, approximate=True)


def geglu_fused(gate_up: Array) -> Array:
  """gelu_tanh(gate) ⊙ up for the experts' fused [gate | up] projection."""
  gate, up = jnp.split(gate_up, 2, axis=-1)
  return gelu_tanh(gate) * up


def experts_sorted(x_TxD: Array, weights_TxK: Array, experts_TxK: Array, gate_up_ExDx2F: Array,
                   down_ExFxD: Array, grouped_matmul=jax.lax.ragged_dot) -> Array:
  """Dropless MoE: sort (token, expert) pairs by expert, two grouped matmuls, weighted scatter-add.

  Exact for any routing (no capacity, no dropped tokens). `grouped_matmul(lhs [M, D], rhs [E, D, F],
  group_sizes [E]) -> [M, F]` is `lax.ragged_dot` (XLA) or the Pallas kernel `pallas_kernels.moe.gmm`.
  """
  t, k = experts_TxK.shape
  num_experts = gate_up_ExDx2F.shape[0]
  flat_expert = experts_TxK.reshape(-1)
  order = jnp.argsort(flat_expert, stable=True)
  token_of = order // k
  group_sizes = jnp.bincount(flat_expert, length=num_experts).astype(jnp.int32)
  xs = x_TxD[token_of]
  h = geglu_fused(grouped_matmul(xs, gate_up_ExDx2F, group_sizes))
  y = grouped_matmul(h, down_ExFxD, group_sizes)
  y = y * weights_TxK.reshape(-1)[order][:, None].astype(y.dtype)
  return jnp.zeros_like(x_TxD).at[token_of].add(y)


def gmm_reference(lhs_MxC: Float[Array, "M C"], rhs_ExCxO: Float[Array, "E C O"],
                  group_sizes_E: Int[Array, "E"]) -> Float[Array, "M O"]:
  """Dense per-group reference: every row times every group's matrix, then pick its own group."""
  ends = jnp.cumsum(group_sizes_E)
  row = jnp.arange(lhs_MxC.shape[0])
  group_of_row = jnp.searchsorted(ends, row, side="right")  # == E for rows past the last group
  all_groups = jnp.einsum("mc,eco->meo", lhs_MxC, rhs_ExCxO, preferred_element_type=jnp.float32)
  picked = jnp.take_along_axis(all_groups, jnp.minimum(group_of_row, rhs_ExCxO.shape[0] - 1)[:, None, None],
                               axis=1)[:, 0]
  out = jnp.where((group_of_row < rhs_ExCxO.shape[0])[:, None], picked, 0.0)
  return out.astype(jnp.result_type(lhs_MxC, rhs_ExCxO))


def moe_dense_reference(x_TxD: Array, weights_TxK: Array, experts_TxK: Array, gate_up_ExDx2F: Array,
                        down_ExFxD: Array) -> Array:
  """Every expert on every token, combined with the routing weights (no sorting, no grouped matmul)."""
  h = jnp.einsum("td,edf->etf", x_TxD, gate_up_ExDx2F)
  gate, up = jnp.split(h, 2, axis=-1)
  y_ExTxD = jnp.einsum("etf,efd->etd", gelu_tanh(gate) * up, down_ExFxD)
  combine_TxE = jnp.einsum("tk,tke->te", weights_TxK.astype(y_ExTxD.dtype),
                           jax.nn.one_hot(experts_TxK, gate_up_ExDx2F.shape[0], dtype=y_ExTxD.dtype))
  return jnp.einsum("te,etd->td", combine_TxE, y_ExTxD).astype(x_TxD.dtype)
