"""The small building blocks: RMSNorm, RoPE, the GeGLU feed-forward, the MoE branch and the embedder.

Numerics follow Hugging Face's DiffusionGemma (our reference): norms and softmaxes in float32, everything
else in the parameter dtype.
"""

from __future__ import annotations

import functools
import math

import flax.linen as nn
import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from dgemma.config import ModelConfig
# (shared with the Pallas kernels, whose references they are; max_last_axis is re-exported for the sampler)
from pallas_kernels.reference import experts_sorted, geglu_fused, gelu_tanh, max_last_axis

init_normal = nn.initializers.normal(stddev=0.02)


def param_dtype(config: ModelConfig) -> jnp.dtype:
  return jnp.dtype(config.param_dtype)


def rms_norm(x: Array, scale: Array | None, eps: float) -> Array:
  """x / rms(x) (· scale), computed in float32 and cast back. The scale is plain `w`, not `1 + w`."""
  x32 = x.astype(jnp.float32)
  y = x32 * jax.lax.rsqrt(jnp.mean(x32 * x32, axis=-1, keepdims=True) + eps)
  if scale is not None:
    y = y * scale.astype(jnp.float32)
  return y.astype(x.dtype)


class RMSNorm(nn.Module):
  """RMSNorm over the last axis; `with_scale=False` is the parameter-free variant (V-norm, router, SC)."""
  eps: float = 1e-6
  with_scale: bool = True
  dtype: jnp.dtype = jnp.float32

  @nn.compact
  def __call__(self, x: Array) -> Array:
    scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.dtype) if self.with_scale else None
    return rms_norm(x, scale, self.eps)


def rope_inv_freq(head_dim: int, theta: float, fraction: float) -> jnp.ndarray:
  """Inverse frequencies for rotate-half RoPE, length head_dim // 2.

  "Proportional" RoPE: the first int(fraction·head_dim/2) pairs rotate with theta^(-2j/head_dim) (the
  exponent's denominator is the full head dim); the remaining pairs get frequency 0 (identity).
  With fraction 1 this is standard RoPE.
  """
  rotated = int(fraction * head_dim // 2)
  j = jnp.arange(rotated, dtype=jnp.float32)
  freqs = 1.0 / (theta ** (2.0 * j / head_dim))
  return jnp.concatenate([freqs, jnp.zeros((head_dim // 2 - rotated,), jnp.float32)])


def apply_rope(x_BxTxNxH: Array, positions_BxT: Int[Array, "B T"], inv_freq: jnp.ndarray) -> Array:
  """Rotate-half RoPE: pairs (j, j + H/2) rotate by positions·f_j."""
  angles = positions_BxT[..., None].astype(jnp.float32) * inv_freq  # [B, T, H/2]
  angles = jnp.concatenate([angles, angles], axis=-1)[:, :, None, :]  # [B, T, 1, H]
  cos, sin = jnp.cos(angles).astype(x_BxTxNxH.dtype), jnp.sin(angles).astype(x_BxTxNxH.dtype)
  half = x_BxTxNxH.shape[-1] // 2
  rotated = jnp.concatenate([-x_BxTxNxH[..., half:], x_BxTxNxH[..., :half]], axis=-1)
  return x_BxTxNxH * cos + rotated * sin


def _dot(a: Array, b: Array, a_dim: int, b_dim: int, dtype=None) -> Array:
  """a @ b contracting a's axis `a_dim` with b's axis `b_dim` (2-D operands), without a transposed copy."""
  return jax.lax.dot_general(a, b, (((a_dim,), (b_dim,)), ((), ())), preferred_element_type=dtype)


def _bf16_dot(a: Array, b: Array, a_dim: int, b_dim: int) -> Array:
  return _dot(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16), a_dim, b_dim, jnp.float32)


def mixed_matmul(x_MxK: Array, w: Array, w_is_NxK: bool = False) -> Array:
  """x @ w with bfloat16 operands and float32 accumulation, returned in x's dtype; w is [K, N], or [N, K] with
  `w_is_NxK` (x @ w.T, for the tied unembedding: a transposed weight is not hoisted out of a sampling loop, so
  XLA:CPU would copy it on every step).

  A custom VJP so that the backward's two matmuls are bfloat16 x bfloat16 as well: differentiated as is, the
  float32 cotangent would promote them back to float32. Gradients come back in the inputs' dtypes.
  """
  return _mixed_matmul(x_MxK, w, jnp.dtype(x_MxK.dtype), jnp.dtype(w.dtype), w_is_NxK)


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4))
def _mixed_matmul(x_MxK, w, x_dtype, w_dtype, w_is_NxK):
  del w_dtype
  return _bf16_dot(x_MxK, w, 1, 1 if w_is_NxK else 0).astype(x_dtype)


def _mixed_matmul_fwd(x_MxK, w, x_dtype, w_dtype, w_is_NxK):
  # bfloat16 residuals: what the backward multiplies anyway, at half the memory.
  return (_mixed_matmul(x_MxK, w, x_dtype, w_dtype, w_is_NxK),
          (x_MxK.astype(jnp.bfloat16), w.astype(jnp.bfloat16)))


def _mixed_matmul_bwd(x_dtype, w_dtype, w_is_NxK, residuals, g_MxN):
  x_MxK, w = residuals
  dx = _bf16_dot(g_MxN, w, 1, 0 if w_is_NxK else 1)  # g @ w.T
  dw = _bf16_dot(g_MxN, x_MxK, 0, 0) if w_is_NxK else _bf16_dot(x_MxK, g_MxN, 0, 0)  # (x.T @ g), stored as w is
  return dx.astype(x_dtype), dw.astype(w_dtype)


_mixed_matmul.defvjp(_mixed_matmul_fwd, _mixed_matmul_bwd)


def unembed_matmul(x: Array, table_VxD: Array, operand_dtype: str = "") -> Array:
  """x[..., D] @ table.T -> [..., V] as one 2-D matmul contracting the table's last axis in place."""
  x_MxD = x.reshape(-1, x.shape[-1])
  if operand_dtype == "bfloat16":
    y = mixed_matmul(x_MxD, table_VxD, w_is_NxK=True)
  else:
    y = _dot(x_MxD, table_VxD, 1, 1)
  return y.reshape(x.shape[:-1] + table_VxD.shape[:1])


def token_matmul(x: Array, w: Array, contract_dims: int = 1, operand_dtype: str = "") -> Array:
  """x[..., K1..Kc] @ w[K1..Kc, ...] as one 2-D matmul over the flattened tokens.

  Same function as the einsum; on XLA:CPU the 2-D form keeps the backward's weight gradient a plain matmul,
  where [B, T, ...] operands made XLA materialise transposed copies. `operand_dtype="bfloat16"`: `mixed_matmul`
  (ModelConfig.matmul_dtype).
  """
  k_shape = x.shape[x.ndim - contract_dims:]
  if w.shape[:contract_dims] != k_shape:
    raise ValueError(f"token_matmul: contracted dims {k_shape} != weight dims {w.shape[:contract_dims]}")
  k = math.prod(k_shape)
  x_MxK, w_KxN = x.reshape(-1, k), w.reshape(k, -1)
  y = mixed_matmul(x_MxK, w_KxN) if operand_dtype == "bfloat16" else x_MxK @ w_KxN
  return y.reshape(x.shape[:x.ndim - contract_dims] + w.shape[contract_dims:])


class GeGLU(nn.Module):
  """down(gelu_tanh(x·gate) ⊙ (x·up)), no biases. Used by the dense branch and self-conditioning."""
  hidden: int
  dtype: jnp.dtype = jnp.float32
  matmul_dtype: str = ""  # ModelConfig.matmul_dtype

  @nn.compact
  def __call__(self, x_BxTxD: Array) -> Array:
    d = x_BxTxD.shape[-1]
    gate = self.param("gate", init_normal, (d, self.hidden), self.dtype)
    up = self.param("up", init_normal, (d, self.hidden), self.dtype)
    down = self.param("down", init_normal, (self.hidden, d), self.dtype)
    mm = lambda x, w: token_matmul(x, w, operand_dtype=self.matmul_dtype)
    # One matmul for gate and up: the concatenated weight is loop-invariant, so XLA builds it once per sampling
    # call, and the step runs one dot where it ran two.
    gu = mm(x_BxTxD, jnp.concatenate([gate, up], axis=1))
    h = gelu_tanh(gu[..., :self.hidden]) * gu[..., self.hidden:]
    return mm(h, down)


def route(x_TxD: Array, router_w_DxE: Array, router_scale_D: Array, per_expert_scale_E: Array,
          top_k: int, eps: float) -> tuple[Array, Array]:
  """Router on the un-normalised residual: softmax (fp32), top-k, renormalise, per-expert scale."""
  d = x_TxD.shape[-1]
  r = rms_norm(x_TxD, None, eps) * router_scale_D * jnp.asarray(d ** -0.5, x_TxD.dtype)
  probs = jax.nn.softmax((r @ router_w_DxE).astype(jnp.float32), axis=-1)
  weights_TxK, experts_TxK = jax.lax.top_k(probs, top_k)
  weights_TxK = weights_TxK / jnp.sum(weights_TxK, axis=-1, keepdims=True)
  weights_TxK = weights_TxK * per_expert_scale_E[experts_TxK].astype(jnp.float32)
  return weights_TxK, experts_TxK


experts_ragged_dot = experts_sorted  # the XLA path: lax.ragged_dot as the grouped matmul


def experts_dense(x_TxD: Array, weights_TxK: Array, experts_TxK: Array, gate_up_ExDx2F: Array,
                  down_ExFxD: Array, operand_dtype: str = "") -> Array:
  """The same function as `experts_sorted` with plain matmuls: every token through every expert's gate/up
  projection and one down projection over all experts, where the unchosen experts' activations are zeros.

  E/k times the matmul FLOPs, but on CPU, with the few tokens of a denoising step, cheaper than ragged_dot's sort
  and per-group dispatch. The GeGLU runs on the k chosen (token, expert) pairs only, whose routing-weighted
  activations are scattered into the zero [T, E, F], sparing an elementwise pass over every expert. The same values
  as weighting every expert's activations (0 where unchosen), within float32 rounding of the GeGLU. The routing weight scales the hidden activations before the down projection (linear, so
  equal to `experts_sorted` up to rounding).
  """
  t, num_experts = x_TxD.shape[0], gate_up_ExDx2F.shape[0]
  if operand_dtype == "bfloat16":  # ModelConfig.matmul_dtype: bf16 operands, f32 accumulation
    einsum = lambda spec, a, b: jnp.einsum(spec, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                                           preferred_element_type=jnp.float32).astype(x_TxD.dtype)
  else:
    einsum = jnp.einsum
  gate_up_TxEx2F = einsum("td,edf->tef", x_TxD, gate_up_ExDx2F)
  chosen_TxKx2F = jnp.take_along_axis(gate_up_TxEx2F, experts_TxK[:, :, None], axis=1)
  h_TxKxF = geglu_fused(chosen_TxKx2F) * weights_TxK[:, :, None].astype(x_TxD.dtype)
  # (top-k experts are distinct, so each (token, expert) cell is written at most once)
  h_TxExF = jnp.zeros((t, num_experts, h_TxKxF.shape[-1]), h_TxKxF.dtype).at[
      jnp.arange(t)[:, None], experts_TxK].set(h_TxKxF, unique_indices=True)
  return einsum("tef,efd->td", h_TxExF, down_ExFxD)


def experts_gather(x_TxD: Array, weights_TxK: Array, experts_TxK: Array, gate_up_ExDx2F: Array,
                   down_ExFxD: Array, operand_dtype: str = "") -> Array:
  """The same function as `experts_sorted`, reading only the routed experts: the weight stacks are indexed by the
  T·k routed ids, then per-pair matrix-vector products. For decoding (T·k much smaller than E): the
  grouped-matmul paths read every expert's weights (lax.ragged_dot lowers to a masked product over all groups), so
  an AR step at batch 1 would read E/k times the expert bytes it needs. The gathered copies are T·k slices."""
  if operand_dtype == "bfloat16":  # ModelConfig.matmul_dtype: bf16 operands, f32 accumulation
    einsum = lambda spec, a, b: jnp.einsum(spec, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                                           preferred_element_type=jnp.float32).astype(x_TxD.dtype)
  else:
    einsum = jnp.einsum
  gate_up_TxKxDx2F = jnp.take(gate_up_ExDx2F, experts_TxK, axis=0)
  down_TxKxFxD = jnp.take(down_ExFxD, experts_TxK, axis=0)
  h_TxKxF = geglu_fused(einsum("td,tkdf->tkf", x_TxD, gate_up_TxKxDx2F))
  h_TxKxF = h_TxKxF * weights_TxK[:, :, None].astype(h_TxKxF.dtype)
  return einsum("tkf,tkfd->td", h_TxKxF, down_TxKxFxD)


def use_gather(num_tokens: int, top_k: int, num_experts: int) -> bool:
  """Whether the MoE takes `experts_gather` whatever ModelConfig.moe_impl says: when the routed (token, expert)
  pairs are at most half the experts (AR decoding: batch·k), reading only those beats any path over all experts."""
  return 2 * num_tokens * top_k <= num_experts


class MoE(nn.Module):
  """The mixture-of-experts branch (spec §1.8). Expert input is pre-normed; routing uses the raw residual."""
  config: ModelConfig

  @nn.compact
  def __call__(self, expert_in_BxTxD: Array, router_in_BxTxD: Array) -> Array:
    cfg = self.config
    dt = param_dtype(cfg)
    d, e, f = cfg.width, cfg.num_experts, cfg.expert_hidden
    router_w = self.param("router", init_normal, (d, e), dt)
    router_scale = self.param("router_scale", nn.initializers.ones, (d,), dt)
    per_expert_scale = self.param("per_expert_scale", nn.initializers.ones, (e,), dt)
    gate_up = self.param("gate_up", init_normal, (e, d, 2 * f), dt)  # [gate | up] along the last axis
    down = self.param("down", init_normal, (e, f, d), dt)
    shape = expert_in_BxTxD.shape
    x_TxD = expert_in_BxTxD.reshape(-1, d)
    weights, experts = route(router_in_BxTxD.reshape(-1, d), router_w, router_scale, per_expert_scale,
                             cfg.top_k_experts, cfg.rms_norm_eps)
    if use_gather(x_TxD.shape[0], cfg.top_k_experts, e):
      y = experts_gather(x_TxD, weights, experts, gate_up, down, cfg.matmul_dtype)
    elif cfg.moe_impl == "pallas":
      from pallas_kernels import moe as moe_kernels  # imported lazily: optional GPU path
      y = moe_kernels.moe_experts(x_TxD, weights, experts, gate_up, down)
    elif cfg.moe_impl == "dense":
      y = experts_dense(x_TxD, weights, experts, gate_up, down, cfg.matmul_dtype)
    else:
      y = experts_ragged_dot(x_TxD, weights, experts, gate_up, down)
    return y.reshape(shape)


class Embedder(nn.Module):
  """Tied input/output embedding. Input scale sqrt(D) is cast to the parameter dtype (53.0 in bf16)."""
  config: ModelConfig

  def setup(self):
    cfg = self.config
    self.embedding = self.param("embedding", init_normal, (cfg.vocab_size, cfg.width), param_dtype(cfg))
    if cfg.learned_positions:
      self.positions = self.param("positions", init_normal, (cfg.learned_positions, cfg.width), param_dtype(cfg))

  def scale(self) -> Array:
    return jnp.asarray(math.sqrt(self.config.width), jnp.float32).astype(self.embedding.dtype)

  def encode(self, tokens_BxT: Int[Array, "B T"], positions_BxT: Int[Array, "B T"],
             position_features_LxF: Int[Array, "L F"] | None = None) -> Array:
    """Token embedding plus the learned position rows: row p at position p, or with `position_features_LxF`
    (config.num_position_features) the sum of the rows that position's features name."""
    x = jnp.take(self.embedding, tokens_BxT, axis=0) * self.scale()
    if position_features_LxF is not None:
      # One summed row per position first ([L, D], tiny), then one gather per token: the same sums, without
      # a [B, T, F, D] intermediate and its scatter-add in the backward pass.
      table_LxD = jnp.sum(jnp.take(self.positions, position_features_LxF, axis=0), axis=-2)
      x = x + jnp.take(table_LxD, positions_BxT, axis=0, mode="clip")
    elif self.config.learned_positions:
      x = x + jnp.take(self.positions, positions_BxT, axis=0, mode="clip")
    return x

  def encode_soft(self, logits_BxTxV: Float[Array, "B T V"], table_DxV: Array | None = None) -> Array:
    """Soft embedding of logits: softmax(ℓ) @ E · sqrt(D) (self-conditioning input). `table_DxV`: as in
    `encode_probs`."""
    return self.encode_probs(jax.nn.softmax(logits_BxTxV.astype(jnp.float32), axis=-1), table_DxV)

  def encode_probs(self, probs_BxTxV: Float[Array, "B T V"], table_DxV: Array | None = None) -> Array:
    """probs @ E · sqrt(D): `encode_soft` for a caller that has the softmax already (the sampler).

    `table_DxV`: E transposed, from a caller that runs this in a loop and built it once (`transposed_table`).
    Both operands then run along the vocabulary in memory, which XLA:CPU multiplies faster, and a transpose taken
    here would be copied on every step.
    """
    probs = probs_BxTxV.astype(self.embedding.dtype)
    if table_DxV is not None:
      if table_DxV.shape != self.embedding.shape[::-1]:
        raise ValueError(f"the transposed embedding table must have shape {self.embedding.shape[::-1]}, got "
                         f"{table_DxV.shape}")
      y = unembed_matmul(probs, table_DxV, self.config.matmul_dtype)
    else:
      y = token_matmul(probs, self.embedding, operand_dtype=self.config.matmul_dtype)
    return y * self.scale()

  def transposed_table(self) -> Array:
    """E.T ([D, V]) for `encode_probs`, in the dtype its product reads (bf16 with bf16 matmuls)."""
    table = self.embedding.T
    return table.astype(jnp.bfloat16) if self.config.matmul_dtype == "bfloat16" else table

  def decode(self, x_BxTxD: Array) -> Float[Array, "B T V"]:
    """Tied unembedding, cast to float32, then the final softcap."""
    logits = unembed_matmul(x_BxTxD, self.embedding, self.config.matmul_dtype).astype(jnp.float32)
    cap = self.config.final_softcap
    return logits if cap is None else cap * jnp.tanh(logits / cap)
