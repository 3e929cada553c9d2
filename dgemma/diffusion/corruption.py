"""The uniform-state forward process: each token is kept with probability alpha, else replaced by a token
drawn uniformly from the whole vocabulary (which may coincide with the original). There is no [MASK] state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


def sample_t(rng: jax.Array, batch: int, eps: float = 1e-4, tilt: float | jax.Array = 0.0) -> Float[Array, "B"]:
  """One noise level per example on [eps, 1 - eps]: uniform at tilt 0 (the official recipe); tilt g > -1 gives
  density proportional to t^g (t = u^(1/(1+g)), u uniform): g > 0 more draws at heavy noise (g = 1: P(t < 0.3)
  falls from 0.3 to 0.09), -1 < g < 0 more at light noise (g = -0.5: P(t < 1/16) rises from 0.06 to 0.25)."""
  u = jax.random.uniform(rng, (batch,))
  return eps + (1.0 - 2.0 * eps) * u ** (1.0 / (1.0 + tilt))


def tilt_at(step: int | jax.Array, tilt: float, ramp_steps: int) -> jax.Array:
  """The noise-level tilt at a training step: moves linearly from 0 to `tilt` over `ramp_steps` steps, then
  stays (ramp_steps 0: `tilt` from the first step). With tilt > 0 a curriculum: light noise early, where a model
  from scratch learns the rules, heavy noise late, when the light-noise examples have stopped teaching.
  With loss='elbo' or 'elbo_full' a tilt reweights the bound's noise levels (no importance correction): no longer
  the ELBO."""
  if tilt <= -1:
    raise ValueError(f"diffusion.t_tilt must be > -1 (the density t^tilt must integrate), got {tilt}")
  if ramp_steps < 0:
    raise ValueError(f"diffusion.t_tilt_steps must be >= 0, got {ramp_steps}")
  if ramp_steps == 0:
    return jnp.asarray(tilt, jnp.float32)
  return tilt * jnp.minimum(1.0, jnp.asarray(step, jnp.float32) / ramp_steps)


def corrupt(rng: jax.Array, x0_BxL: Int[Array, "B L"], alpha_B: Float[Array, "B"],
            vocab_size: int) -> tuple[Int[Array, "B L"], Bool[Array, "B L"]]:
  """Returns (x_t, resampled): x_t keeps x0 where a coin with P(keep)=alpha says so, else a uniform token."""
  keep_rng, token_rng = jax.random.split(rng)
  resampled = jax.random.uniform(keep_rng, x0_BxL.shape) >= alpha_B[:, None]
  return _replace(token_rng, x0_BxL, resampled, vocab_size), resampled


def _replace(rng: jax.Array, x0_BxL: Int[Array, "B L"], resampled_BxL: Bool[Array, "B L"], vocab_size: int):
  """x0 with the resampled tokens replaced by tokens drawn uniformly from the whole vocabulary."""
  noise = jax.random.randint(rng, x0_BxL.shape, 0, vocab_size, dtype=x0_BxL.dtype)
  return jnp.where(resampled_BxL, noise, x0_BxL)


def corrupt_in_order(rng: jax.Array, x0_BxL: Int[Array, "B L"], alpha_B: Float[Array, "B"], vocab_size: int,
                     rank_BxL: Float[Array, "B L"]) -> tuple[Int[Array, "B L"], Bool[Array, "B L"]]:
  """As `corrupt`, with the same number of resampled tokens (one coin per token), but the resampled tokens are
  those of highest rank (ties broken at random): e.g. rank = the round in which a solver deduces a puzzle's
  cell, so the canvas looks like a partly solved puzzle, as the sampler's canvases do mid-way."""
  count_rng, tie_rng, token_rng = jax.random.split(rng, 3)
  num_resampled_B = jnp.sum(jax.random.uniform(count_rng, x0_BxL.shape) >= alpha_B[:, None], axis=-1)
  priority = rank_BxL + jax.random.uniform(tie_rng, x0_BxL.shape)  # ranks are integers: ties break at random
  place_BxL = jnp.argsort(jnp.argsort(-priority, axis=-1), axis=-1)  # 0 = resampled first
  resampled = place_BxL < num_resampled_B[:, None]
  return _replace(token_rng, x0_BxL, resampled, vocab_size), resampled
