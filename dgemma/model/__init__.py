"""The model's public, functional API: params are an explicit pytree, config is static.

    params = init_params(config, jax.random.key(0))
    cache = init_cache(config, batch, max_len)
    logits, cache = encode(params, config, tokens, cache)              # prefill / append
    logits = denoise(params, config, canvas, cache, self_conditioning_logits=None)

A model with position features (config.num_position_features > 0) also takes its [L, F] feature table, an array
argument like the params: `encode(..., position_features=table)` (see dgemma/model/position_features.py).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from dgemma.config import ModelConfig
from dgemma.model import position_features as position_features_lib
from dgemma.model.cache import KVCache, init_cache
from dgemma.model.transformer import DiffusionGemma

__all__ = ["DiffusionGemma", "KVCache", "init_cache", "init_params", "param_shapes", "encode", "denoise",
           "embedding_table_transposed"]


def _init_inputs(config: ModelConfig):
  c = min(config.canvas_length, 4)
  tokens = jnp.zeros((1, c), jnp.int32)
  # (The parameters do not depend on the feature table's values or length: a one-row table of zeros does.)
  features = jnp.zeros((1, config.num_position_features), jnp.int32) if config.num_position_features else None
  return tokens, init_cache(config, 1, 2 * c), tokens, features


def init_params(config: ModelConfig, rng: jax.Array) -> dict:
  """Randomly initialised parameters (normal(0.02) weights, unit norm scales)."""
  return jax.jit(lambda r: DiffusionGemma(config).init(r, *_init_inputs(config))["params"])(rng)


def param_shapes(config: ModelConfig) -> dict:
  """The parameter tree as jax.ShapeDtypeStruct leaves, without allocating anything."""
  return jax.eval_shape(lambda: DiffusionGemma(config).init(jax.random.key(0), *_init_inputs(config))["params"])


def _check_room(cache: KVCache, num_new: int, what: str) -> None:
  """A one-line error instead of a silently clamped write when the cache is too short."""
  if num_new > cache.capacity:
    raise ValueError(f"{what} of {num_new} tokens does not fit a cache of capacity {cache.capacity}")
  if not isinstance(cache.end, jax.core.Tracer):
    needed = int(jnp.max(cache.end)) + num_new
    if needed > cache.capacity:
      raise ValueError(f"{what} needs {needed} cache slots but the cache holds {cache.capacity}; "
                       "build it with a larger max_len")


@functools.partial(jax.jit, static_argnames=("config", "compute_logits"))
def _encode(params, config, tokens, cache, token_valid, compute_logits, features):
  return DiffusionGemma(config).apply({"params": params}, tokens, cache, token_valid, compute_logits, features,
                                      method=DiffusionGemma.encode)


def encode(params: dict, config: ModelConfig, tokens: Int[Array, "B T"], cache: KVCache,
           token_valid: Bool[Array, "B T"] | None = None, *, compute_logits: bool = True,
           position_features: Int[Array, "L F"] | None = None) -> tuple[Float[Array, "B T V"] | None, KVCache]:
  """Causal pass over `tokens` written at each row's `cache.end`; returns (next-token logits, new cache).

  `token_valid` marks real tokens (False for right padding); padded slots are never attended to.
  With compute_logits=False the (large) vocabulary projection is skipped and None is returned.
  `position_features`: the model's feature table, when config.num_position_features > 0.
  """
  _check_room(cache, tokens.shape[1], "encoding")
  features = position_features_lib.check(config, position_features)
  return _encode(params, config, tokens, cache, token_valid, compute_logits, features)


@functools.partial(jax.jit, static_argnames=("config",))
def _denoise(params, config, canvas, cache, sc_logits, sc_mask, sc_probs, sc_table, features):
  return DiffusionGemma(config).apply({"params": params}, canvas, cache, sc_logits, sc_mask, sc_probs, sc_table,
                                      features, method=DiffusionGemma.denoise)


@functools.partial(jax.jit, static_argnames=("config",))
def embedding_table_transposed(params: dict, config: ModelConfig) -> Array:
  """The embedding table transposed, [D, V], for `denoise(self_conditioning_table=...)`."""
  return DiffusionGemma(config).apply({"params": params}, method=DiffusionGemma.embedding_table_transposed)


def denoise(params: dict, config: ModelConfig, canvas: Int[Array, "B C"], cache: KVCache,
            self_conditioning_logits: Float[Array, "B C V"] | None = None,
            self_conditioning_mask: Bool[Array, "B"] | None = None,
            self_conditioning_probs: Float[Array, "B C V"] | None = None,
            self_conditioning_table: Array | None = None, *,
            position_features: Int[Array, "L F"] | None = None) -> Float[Array, "B C V"]:
  """Bidirectional denoiser logits for `canvas`, reading (never writing) `cache`.

  Canvas positions continue at each row's `cache.end`. `self_conditioning_logits=None` is the first-step
  "no signal" (zero soft embedding); `self_conditioning_mask[b]=False` zeroes the signal of row b.
  `self_conditioning_probs`: softmax(logits) in place of the logits, when the caller has it.
  `self_conditioning_table`: `embedding_table_transposed`, built once by a caller that loops, for the product of the
  self-conditioning probabilities with the embedding.
  `position_features`: as in `encode`.
  """
  features = position_features_lib.check(config, position_features)
  return _denoise(params, config, canvas, cache, self_conditioning_logits, self_conditioning_mask,
                  self_conditioning_probs, self_conditioning_table, features)
