"""Training losses: the flat cross-entropy of the official recipe, the continuous-time uniform-state ELBO
(a research option), the encoder's autoregressive loss, and per-noise-level statistics.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int


def token_cross_entropy(logits_BxLxV: Float[Array, "B L V"], targets_BxL: Int[Array, "B L"]) -> Float[Array, "B L"]:
  logp = jax.nn.log_softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  return -jnp.take_along_axis(logp, targets_BxL[..., None], axis=-1)[..., 0]


def difficulty_weights(ce_BxL: Float[Array, "B L"], gamma: float) -> Float[Array, "B L"]:
  """Per-token loss weights (1 - p_θ(x0))^gamma, p_θ(x0) = exp(-CE), held constant under differentiation.

  Token-level reweighting as in MGDM (Ye et al. 2024, "Beyond Autoregression"): cells the model already gets
  right weigh ~0 and the hard ones (in a puzzle, the cells that need search) keep their weight. Each token's
  gradient keeps the direction of plain CE (the weight carries no gradient), so a target the context fixes is
  still pushed to probability 1."""
  return jax.lax.stop_gradient((-jnp.expm1(-ce_BxL)) ** gamma)


def masked_mean(values_BxL: Array, mask_BxL: Bool[Array, "B L"]) -> Float[Array, "B"]:
  """Per-example mean over the mask (0 where the mask is empty)."""
  m = mask_BxL.astype(jnp.float32)
  return jnp.sum(values_BxL * m, axis=-1) / jnp.maximum(jnp.sum(m, axis=-1), 1.0)


def uniform_elbo_per_token(logits_BxLxV: Float[Array, "B L V"], x0_BxL: Int[Array, "B L"],
                           xt_BxL: Int[Array, "B L"], alpha_B: Float[Array, "B"],
                           dalpha_B: Float[Array, "B"]) -> Float[Array, "B L"]:
  """Continuous-time NELBO integrand of uniform-state diffusion (UDLM, Schiff et al. 2024; Duo, Sahoo et
  al. 2025), per token, for one t per example. Zero iff the model puts all mass on x0; never negative.

  With N = vocab size, xbar = N·alpha·onehot(x0) + (1-alpha) and xbar_θ = N·alpha·p_θ + (1-alpha), and
  i = x_t, the integrand is
      alpha'/(N alpha) · [ N/xbar_i - N/xbar_θ,i - Σ_j (xbar_j / xbar_i) · log(xbar_θ,i · xbar_j / (xbar_θ,j · xbar_i)) ].
  """
  v = logits_BxLxV.shape[-1]
  a = alpha_B[:, None, None]
  probs = jax.nn.softmax(logits_BxLxV.astype(jnp.float32), axis=-1)
  xbar = v * a * jax.nn.one_hot(x0_BxL, v) + (1.0 - a)
  xbar_theta = v * a * probs + (1.0 - a)
  pick = lambda arr: jnp.take_along_axis(arr, xt_BxL[..., None], axis=-1)[..., 0]
  xbar_i, xbar_theta_i = pick(xbar), pick(xbar_theta)
  log_ratio = (jnp.log(xbar_theta_i)[..., None] + jnp.log(xbar) - jnp.log(xbar_theta) - jnp.log(xbar_i)[..., None])
  bracket = v / xbar_i - v / xbar_theta_i - jnp.sum(xbar / xbar_i[..., None] * log_ratio, axis=-1)
  weight = dalpha_B[:, None] / (v * alpha_B[:, None])  # alpha' < 0 and the bracket is <= 0
  return weight * bracket


def noise_bin_stats(loss_B: Float[Array, "B"], t_B: Float[Array, "B"], num_bins: int) -> tuple[Array, Array]:
  """(sum of losses, count) per equal-width bin of t in [0, 1]: summed over steps, they give the mean loss
  per noise level over any logging window."""
  bins = jnp.clip((t_B * num_bins).astype(jnp.int32), 0, num_bins - 1)
  one_hot = jax.nn.one_hot(bins, num_bins, dtype=jnp.float32)
  return one_hot.T @ loss_B.astype(jnp.float32), jnp.sum(one_hot, axis=0)
