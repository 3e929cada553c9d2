"""One denoising step's token decisions: statistics of the tempered distribution, candidate sampling,
entropy-bounded acceptance and renoising (spec §5.1 c-e).

The vocabulary-wide passes are the sampler's whole cost beyond the network, so `analyse` does them once
for arg-max, entropy and sampling together: the vocabulary is split into blocks of about sqrt(V) entries,
full-width work is the block maxima, one exp pass, one e * z pass and two matrix-vector products, and the rest
(first arg-max, inverse CDF) runs on per-block summaries and a single block.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from dgemma.cpu.token_stats import TokenStats, block_size  # the contract the CPU kernel shares
from dgemma.model.layers import max_last_axis


def _blocks(x_BxCxV: Array) -> Array:
  v = x_BxCxV.shape[-1]
  k = block_size(v)
  return x_BxCxV.reshape(*x_BxCxV.shape[:-1], v // k, k)


def _first_true(mask: Bool[Array, "... N"]) -> Int[Array, "..."]:
  """Index of the first True along the last axis (N if none)."""
  n = mask.shape[-1]
  return jnp.min(jnp.where(mask, jnp.arange(n, dtype=jnp.int32), n), axis=-1)


def _take_block(blocks: Array, index: Int[Array, "..."]) -> Array:
  """blocks[..., index, :] for a per-position block index."""
  return jnp.take_along_axis(blocks, index[..., None, None], axis=-2)[..., 0, :]


def analyse(logits_BxCxV: Float[Array, "B C V"], uniform_BxC: Float[Array, "B C"] | None = None,
            with_probs: bool = False, temperature: float | Array = 1.0) -> TokenStats:
  """Arg-max, entropy, (given one uniform in [0, 1) per position) a sample and (`with_probs`) the softmax of
  the tempered logits `logits / temperature`, sharing one exp pass.

  The temperature (> 0; a scalar or broadcastable to [B, C, 1]) is applied inside that pass, as
  exp((logits - max) / temperature): the tempered logits are never written out, which saves two
  vocabulary-wide passes per denoising step. The arg-max is the raw logits' (the same tokens: dividing by a
  positive temperature keeps the order).

  Sampling is by inverse CDF in two levels: the block from the cumulative block masses, then the token
  inside that block. Only positive-probability tokens can come out: when rounding puts the target at or
  past the end, the clamps keep the choice on the last block / token that has mass.
  """
  logits = logits_BxCxV.astype(jnp.float32)
  blocks = _blocks(logits)
  nb, k = blocks.shape[-2:]
  block_max = jnp.max(blocks, axis=-1)
  top = max_last_axis(block_max)
  top_blk = _first_true(block_max == top[..., None])
  # (Clamped: a row whose top is NaN matches nowhere; its entropy is NaN, and its arg-max stays a token id.)
  argmax = jnp.minimum(top_blk * k + _first_true(_take_block(blocks, top_blk) == top[..., None]), nb * k - 1)

  # Clamped like torch's Categorical, so that a -inf logit adds 0 * finite (not NaN) to the entropy.
  # (Times 1 / temperature: within one rounding of HF's division.)
  inv_t = 1.0 / jnp.asarray(temperature, jnp.float32)
  inv_t = inv_t.reshape(inv_t.shape[:-1] + (1, 1)) if inv_t.ndim else inv_t  # [B, C or 1, 1] -> [B, C or 1, 1, 1]
  z = jnp.maximum((blocks - top[..., None, None]) * inv_t, jnp.finfo(jnp.float32).min)
  e = jnp.exp(z)  # unnormalised probabilities, [.., nb, k]
  # H = log Z - E_p[z]. Both vocabulary-wide sums are products with a vector of ones: XLA:CPU runs reductions
  # that share an operand slower than one matrix-vector product each, and a batched dot of e and z (through
  # YNNPACK) slower than writing e * z and summing it so.
  # (HIGHEST: these are sums, which GPUs would otherwise take as TF32 products, ~3 digits.)
  ones = jnp.ones((k,), e.dtype)
  block_mass = jnp.einsum("...nk,k->...n", e, ones, precision=jax.lax.Precision.HIGHEST)
  total = jnp.sum(block_mass, axis=-1)
  weighted = jnp.sum(jnp.einsum("...nk,k->...n", e * z, ones, precision=jax.lax.Precision.HIGHEST), axis=-1)
  entropy = jnp.log(total) - weighted / total
  probs = (e / total[..., None, None]).reshape(logits_BxCxV.shape) if with_probs else None
  if uniform_BxC is None:
    return TokenStats(argmax=argmax, entropy=entropy, sample=None, probs=probs)

  block_cdf = jnp.cumsum(block_mass, axis=-1)
  target = uniform_BxC * block_cdf[..., -1]
  # (At least 0: a broken row, NaN or all -inf, has no block with mass; its entropy is NaN, its draw still a token.)
  last_block = jnp.maximum(nb - 1 - _first_true(jnp.flip(block_mass > 0, axis=-1)), 0)
  blk = jnp.minimum(jnp.sum(block_cdf <= target[..., None], axis=-1), last_block)
  before = jnp.where(blk > 0, jnp.take_along_axis(block_cdf, jnp.maximum(blk - 1, 0)[..., None], -1)[..., 0], 0.0)
  inner = _take_block(e, blk)
  inner_cdf = before[..., None] + jnp.cumsum(inner, axis=-1)
  last_nonzero = jnp.maximum(k - 1 - _first_true(jnp.flip(inner > 0, axis=-1)), 0)
  within = jnp.minimum(jnp.sum(inner_cdf <= target[..., None], axis=-1), last_nonzero)
  return TokenStats(argmax=argmax, entropy=entropy, sample=(blk * k + within).astype(jnp.int32), probs=probs)


def argmax(logits_BxCxV: Float[Array, "B C V"]) -> Int[Array, "B C"]:
  """First arg-max over the vocabulary."""
  return analyse(logits_BxCxV).argmax


def entropy(logits_BxCxV: Float[Array, "B C V"]) -> Float[Array, "B C"]:
  """Entropy of softmax(logits) per position, in nats (float32)."""
  return analyse(logits_BxCxV).entropy


def sample_categorical(logits_BxCxV: Float[Array, "B C V"], uniform_BxC: Float[Array, "B C"]) -> Int[Array, "B C"]:
  """One token per position from softmax(logits), with one uniform in [0, 1) per position."""
  return analyse(logits_BxCxV, uniform_BxC).sample


def entropy_bounded_accept(entropy_BxC: Float[Array, "B C"], bound: float) -> Bool[Array, "B C"]:
  """Accept the lowest-entropy positions while the entropy summed over the lower ones stays <= bound.

  Sorted ascending, position j is accepted iff sum_{m<j} H_(m) <= bound (HF's `accept_canvas`); the
  lowest-entropy position is therefore always accepted. Ties sort by position, as a stable sort.

  Computed without sorting: position m comes before j iff H_m < H_j, or H_m == H_j and m < j, and the sum of
  the entropies before each j is one [C, C] by [C] matrix-vector product, which XLA:CPU runs far faster than the
  two sorts (the order and its inverse).
  """
  h = entropy_BxC
  position = jnp.arange(h.shape[-1])
  h_m, h_j = h[..., None, :], h[..., :, None]
  before_BxCxC = (h_m < h_j) | ((h_m == h_j) & (position[None, :] < position[:, None]))  # [b, j, m]
  # (HIGHEST: a sum of float32 entropies, not a TF32 product on GPUs.)
  lower_BxC = jnp.einsum("...jm,...m->...j", before_BxCxC.astype(h.dtype), h, precision=jax.lax.Precision.HIGHEST)
  return lower_BxC <= bound


def renoise(accept_BxC: Bool[Array, "B C"], candidates_BxC: Int[Array, "B C"],
            noise_BxC: Int[Array, "B C"]) -> Int[Array, "B C"]:
  """Accepted positions take the sampled candidate; every other position a fresh uniform token."""
  return jnp.where(accept_BxC, candidates_BxC, noise_BxC)
