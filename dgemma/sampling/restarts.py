"""Restarts (`SamplerConfig.restart_after` = k > 0; not in the references): a row that has not stopped after k
steps of its current attempt starts a new one: a fresh random canvas, no self-conditioning signal, an empty stop
history, the temperature schedule started again over min(k, steps left). `max_denoising_steps` caps all attempts
together. The stop rule is the model's own judgement, so this is test-time compute without any checker.

Attempt j of a row draws exactly what a plain run (restart_after=0, max_denoising_steps=k) draws with that row's
key folded with RESTART_SALT + j (attempt 0: the row's own key).

The step loop (dgemma/sampling/generate.py) carries an `Attempts` only when restarts are on, and calls `first`
before a canvas's first step, `position` at the start of each step and `advance` at its end.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from dgemma.sampling import schedules
from dgemma.sampling.config import SamplerConfig
from dgemma.sampling.randomness import per_row, split_per_row, uniform_tokens

RESTART_SALT = 1_000_003  # attempt j >= 1 of a row draws from fold_in(row key, RESTART_SALT + j)


@flax.struct.dataclass
class Attempts:
  """Each row's current attempt at the canvas."""
  index: Int[Array, "B"]  # j: the row's attempts before this one
  step: Int[Array, "B"]  # steps taken in this attempt
  length: Int[Array, "B"]  # steps this attempt may take
  keys: Array  # [B, key] its step keys as raw key data, so that rows can swap them with jnp.where


def first(sampler: SamplerConfig, step_keys_B: jax.Array) -> Attempts:
  """Attempt 0 of every row: the canvas's own step keys, min(k, budget) steps."""
  b = step_keys_B.shape[0]
  length = min(sampler.restart_after, sampler.max_denoising_steps)
  return Attempts(index=jnp.zeros((b,), jnp.int32), step=jnp.zeros((b,), jnp.int32),
                  length=jnp.full((b,), length, jnp.int32), keys=jax.random.key_data(step_keys_B))


def position(sampler: SamplerConfig, attempts: Attempts, key_impl
             ) -> tuple[Int[Array, "B"], jax.Array, Float[Array, "B 1 1"]]:
  """Where each row is in its attempt: (its step there, its step keys, its temperature). A finished row's step
  keeps counting; at least 1 step left keeps its discarded temperature > 0."""
  s, a = sampler, attempts
  temp = schedules.temperature(s.schedule, s.t_max, s.t_min, jnp.maximum(a.length - a.step, 1), a.length)
  temp = jnp.broadcast_to(temp, a.step.shape)[:, None, None]  # (the constant schedule gives a scalar)
  return a.step, jax.random.wrap_key_data(a.keys, impl=key_impl), temp


def attempt_keys(row_keys_B: jax.Array, attempt_B: Int[Array, "B"], canvas_index: Int[Array, ""]
                 ) -> tuple[jax.Array, jax.Array]:
  """(initial-canvas keys, step keys) of each row's attempt at this canvas; attempt 0's are the plain run's."""
  b = row_keys_B.shape[0]
  salted = per_row(jax.random.fold_in, row_keys_B, RESTART_SALT + attempt_B)
  base = jax.random.wrap_key_data(jnp.where((attempt_B == 0)[:, None], jax.random.key_data(row_keys_B),
                                            jax.random.key_data(salted)), impl=jax.random.key_impl(row_keys_B))
  return split_per_row(per_row(jax.random.fold_in, base, jnp.broadcast_to(canvas_index, (b,))))


def advance(sampler: SamplerConfig, attempts: Attempts, step: Int[Array, ""], finished_B: Bool[Array, "B"],
            canvas_BxC: Int[Array, "B C"], history_SxBxC: Int[Array, "S B C"], row_keys_B: jax.Array,
            canvas_index: Int[Array, ""], vocab_size: int
            ) -> tuple[Int[Array, "B C"], Int[Array, "S B C"], Attempts]:
  """After step `step` of the canvas: rows whose attempt ran out without a stop start the next one, if the budget
  has steps left. Returns (canvas, stop history, attempts) with those rows restarted."""
  n, a = sampler.max_denoising_steps, attempts
  taken = a.step + 1
  again = ~finished_B & (taken >= a.length) & (step + 1 < n)
  index = a.index + again.astype(jnp.int32)
  init_keys, next_keys = attempt_keys(row_keys_B, index, canvas_index)
  canvas = jnp.where(again[:, None], uniform_tokens(init_keys, canvas_BxC.shape[1], vocab_size), canvas_BxC)
  history = jnp.where(again[None, :, None], -1, history_SxBxC)
  return canvas, history, Attempts(
      index=index, step=jnp.where(again, 0, taken),
      length=jnp.where(again, jnp.minimum(sampler.restart_after, n - (step + 1)), a.length),
      keys=jnp.where(again[:, None], jax.random.key_data(next_keys), a.keys))
