"""Autoregressive decoding with the same backbone: the causal encoder and its KV cache, one token per forward
pass, the whole decode in one jitted `lax.while_loop`. A baseline for latency and accuracy comparisons
(the model is trained with an AR loss on its encoder, spec §4.4).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from dgemma.config import ModelConfig
from dgemma.model import position_features as position_features_lib
from dgemma.model.cache import KVCache, init_cache
from dgemma.model.transformer import DiffusionGemma
from dgemma.sampling import acceptance
from dgemma.sampling.randomness import check_rng, row_keys


@dataclasses.dataclass(frozen=True)
class ARConfig:
  """`temperature=0` is greedy; `stop_ids=None` takes the model's, `()` never stops early."""

  max_new_tokens: int = 256
  temperature: float = 0.0
  stop_ids: tuple[int, ...] | None = None

  def __post_init__(self):
    if self.stop_ids is not None:
      object.__setattr__(self, "stop_ids", tuple(int(t) for t in self.stop_ids))
    if isinstance(self.max_new_tokens, bool) or not isinstance(self.max_new_tokens, (int, np.integer)) \
        or self.max_new_tokens < 1:
      raise ValueError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
    if not self.temperature >= 0:
      raise ValueError(f"temperature must be >= 0, got {self.temperature!r}")


@flax.struct.dataclass
class AROutput:
  tokens: Int[Array, "B T"]  # pad after a row's first stop token
  forward_passes: Int[Array, "B"]  # passes that produced a token for the row (prefill included)
  tokens_per_forward: Float[Array, "B"]  # non-pad tokens / forward passes (at most 1)


@flax.struct.dataclass
class _State:
  t: Int[Array, ""]
  cache: KVCache
  logits: Float[Array, "B V"]
  tokens: Int[Array, "B T"]
  done: Bool[Array, "B"]
  passes: Int[Array, "B"]


@functools.partial(jax.jit, static_argnames=("config", "ar", "cache_len"))
def _decode(params, prompt_BxP, valid_BxP, rng, position_features, *, config: ModelConfig, ar: ARConfig,
            cache_len: int):
  model = DiffusionGemma(config)
  variables = {"params": params}
  b, p = prompt_BxP.shape
  keys_B = row_keys(rng, b)
  n = ar.max_new_tokens
  stop_ids = jnp.asarray(ar.stop_ids, jnp.int32)

  logits, cache = model.apply(variables, prompt_BxP, init_cache(config, b, cache_len), valid_BxP, True,
                              position_features, method=DiffusionGemma.encode)
  # Padded prompts (right or left): the next-token logits of a row sit at its last real prompt token.
  last = p - 1 - jnp.argmax(jnp.flip(valid_BxP, axis=1), axis=1)
  first_logits = jnp.take_along_axis(logits, last[:, None, None], axis=1)[:, 0]

  def pick(logits_BxV, t):
    if ar.temperature == 0:
      return acceptance.argmax(logits_BxV[:, None])[:, 0]
    keys = jax.vmap(jax.random.fold_in)(keys_B, jnp.broadcast_to(t, (b,)))
    uniform = jax.vmap(lambda k: jax.random.uniform(k, (1,)))(keys)
    return acceptance.sample_categorical(logits_BxV[:, None] / ar.temperature, uniform)[:, 0]

  def cond(st: _State):
    return (st.t < n) & ~jnp.all(st.done)

  def body(st: _State) -> _State:
    token = jnp.where(st.done, config.pad_id, pick(st.logits, st.t))
    passes = st.passes + (~st.done).astype(jnp.int32)
    done = st.done | (jnp.isin(token, stop_ids) if ar.stop_ids else False)
    more = (st.t + 1 < n) & ~jnp.all(done)

    def step(args):
      cache, _ = args
      logits, cache = model.apply(variables, token[:, None], cache, None, True, position_features,
                                  method=DiffusionGemma.encode)
      return cache, logits[:, 0]

    cache, logits = jax.lax.cond(more, step, lambda args: args, (st.cache, st.logits))
    tokens = jax.lax.dynamic_update_slice(st.tokens, token[:, None], (0, st.t))
    return _State(t=st.t + 1, cache=cache, logits=logits, tokens=tokens, done=done, passes=passes)

  init = _State(t=jnp.int32(0), cache=cache, logits=first_logits,
                tokens=jnp.full((b, n), config.pad_id, jnp.int32), done=jnp.zeros((b,), bool),
                passes=jnp.zeros((b,), jnp.int32))
  final = jax.lax.while_loop(cond, body, init)
  tpf = jnp.sum(final.tokens != config.pad_id, axis=1) / jnp.maximum(final.passes, 1)
  return AROutput(tokens=final.tokens, forward_passes=final.passes, tokens_per_forward=tpf)


def _prepare(config: ModelConfig, ar_config: ARConfig, prompt_tokens, prompt_valid, rng,
             position_features=None) -> tuple[tuple, dict]:
  ar = ar_config if ar_config.stop_ids is not None else dataclasses.replace(ar_config, stop_ids=config.stop_ids)
  prompt = np.asarray(prompt_tokens)
  if prompt.ndim != 2 or 0 in prompt.shape:
    raise ValueError(f"prompt_tokens must have shape [batch, length] with both > 0, got {prompt.shape}")
  if prompt.min() < 0 or prompt.max() >= config.vocab_size:
    raise ValueError(f"prompt_tokens has token ids outside [0, {config.vocab_size})")
  b, p = prompt.shape
  valid = np.ones((b, p), bool) if prompt_valid is None else np.asarray(prompt_valid, bool)
  if valid.shape != (b, p):
    raise ValueError(f"prompt_valid has shape {valid.shape}, expected {(b, p)}")
  check_rng(rng, b)
  features = position_features_lib.check(config, position_features)
  args = (jnp.asarray(prompt, jnp.int32), jnp.asarray(valid), rng, features)
  return args, dict(config=config, ar=ar, cache_len=p + ar.max_new_tokens)


def generate_autoregressive(params: dict, config: ModelConfig, prompt_tokens: Int[Array, "B P"],
                            prompt_valid: Bool[Array, "B P"] | None, rng: jax.Array,
                            ar_config: ARConfig = ARConfig(), *,
                            position_features: Int[Array, "L F"] | None = None) -> AROutput:
  """Decodes up to `max_new_tokens` tokens after padded prompts, one encoder pass per token.
  `position_features`: the model's feature table, when config.num_position_features > 0."""
  args, static = _prepare(config, ar_config, prompt_tokens, prompt_valid, rng, position_features)
  return _decode(params, *args, **static)


def compile_autoregressive(params: dict, config: ModelConfig, prompt_tokens: Int[Array, "B P"],
                           prompt_valid: Bool[Array, "B P"] | None, rng: jax.Array,
                           ar_config: ARConfig = ARConfig(), *,
                           position_features: Int[Array, "L F"] | None = None
                           ) -> tuple[Callable[..., AROutput], float]:
  """Ahead-of-time compilation: (run(prompt_tokens, prompt_valid, rng), compile seconds)."""
  args, static = _prepare(config, ar_config, prompt_tokens, prompt_valid, rng, position_features)
  start = time.perf_counter()
  compiled = _decode.lower(params, *args, **static).compile()
  seconds = time.perf_counter() - start

  def run(prompt_tokens, prompt_valid, rng) -> AROutput:
    new_args, new_static = _prepare(config, ar_config, prompt_tokens, prompt_valid, rng, position_features)
    if new_static != static:
      raise ValueError("inputs differ in shape from the ones this decoder was compiled for")
    return compiled(params, *new_args)

  return run, seconds
