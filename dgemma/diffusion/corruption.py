"""The uniform-state forward process: each token is kept with probability alpha, else replaced by a token
drawn uniformly from the whole vocabulary (which may coincide with the original). There is no [MASK] state.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


def sample_t(rng: jax.Array, batch: int, eps: float = 1e-4) -> Float[Array, "B"]:
  """One noise level per example, t ~ U[eps, 1 - eps]."""
  return jax.random.uniform(rng, (batch,), minval=eps, maxval=1.0 - eps)


def corrupt(rng: jax.Array, x0_BxL: Int[Array, "B L"], alpha_B: Float[Array, "B"],
            vocab_size: int) -> tuple[Int[Array, "B L"], Bool[Array, "B L"]]:
  """Returns (x_t, resampled): x_t keeps x0 where a coin with P(keep)=alpha says so, else a uniform token."""
  keep_rng, token_rng = jax.random.split(rng)
  resampled = jax.random.uniform(keep_rng, x0_BxL.shape) >= alpha_B[:, None]
  noise = jax.random.randint(token_rng, x0_BxL.shape, 0, vocab_size, dtype=x0_BxL.dtype)
  return jnp.where(resampled, noise, x0_BxL), resampled
