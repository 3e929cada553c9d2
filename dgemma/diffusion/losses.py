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


def context_only_logits(logits_BxLxV: Float[Array, "B L V"], xt_BxL: Int[Array, "B L"],
                        alpha_B: Float[Array, "B"]) -> Float[Array, "B L V"]:
  """Turns logits of the full posterior p(x0_l | x_t) into those of p(x0_l | x_t^{-l}), the posterior given the
  OTHER noisy tokens only, by dividing out token l's own likelihood q(x_t,l = i | x0_l = j) = alpha·[j = i] +
  (1-alpha)/N (Bayes): logits_j - log(1 + N·alpha/(1-alpha))·[j = i], in float32.

  What it is for: in `uniform_elbo_per_token`'s parameterization the reverse rate from x_t to x_t with token l
  set to j is ∝ xbar_θ,j / xbar_θ,i, and the exact time reversal has the same form with p_θ = p(x0_l | x_t^{-l}).
  So the bound is tight (equals the NLL) for the context-only posterior, not for the full posterior that a flat
  cross-entropy trains toward; this conversion maps the one to the other (tests/diffusion/test_elbo.py checks
  both by enumeration). Needs alpha < 1: at alpha = 1 the own token's logit becomes -inf.
  """
  v = logits_BxLxV.shape[-1]
  a = alpha_B.astype(jnp.float32)[:, None, None]
  own_likelihood_ratio = jnp.log1p(v * a / (1.0 - a))  # log q(i | i) - log q(i | j ≠ i)
  own = jax.nn.one_hot(xt_BxL, v, dtype=bool)
  # where, not a product with the one-hot: inf · 0 would put NaN on the other tokens at alpha = 1
  return jnp.where(own, logits_BxLxV.astype(jnp.float32) - own_likelihood_ratio, logits_BxLxV.astype(jnp.float32))


def denoiser_token_loss(loss: str, logits_BxLxV: Float[Array, "B L V"], x0_BxL: Int[Array, "B L"],
                        xt_BxL: Int[Array, "B L"], alpha_B: Float[Array, "B"],
                        dalpha_B: Float[Array, "B"]) -> Float[Array, "B L"]:
  """The denoiser's loss per token, by `diffusion.loss` (config.LOSSES): flat_ce, elbo (the logits read as the
  context-only posterior) or elbo_full (read as the full posterior, converted: what the held-out bound of a flat-CE
  model computes, so training on it lowers that number directly)."""
  if loss == "flat_ce":
    return token_cross_entropy(logits_BxLxV, x0_BxL)
  if loss == "elbo_full":
    logits_BxLxV = context_only_logits(logits_BxLxV, xt_BxL, alpha_B)
  elif loss != "elbo":
    raise ValueError(f"unknown diffusion loss {loss!r}")
  return uniform_elbo_per_token(logits_BxLxV, x0_BxL, xt_BxL, alpha_B, dalpha_B)


def noise_bin_stats(loss_B: Float[Array, "B"], t_B: Float[Array, "B"], num_bins: int) -> tuple[Array, Array]:
  """(sum of losses, count) per equal-width bin of t in [0, 1]: summed over steps, they give the mean loss
  per noise level over any logging window."""
  bins = jnp.clip((t_B * num_bins).astype(jnp.int32), 0, num_bins - 1)
  one_hot = jax.nn.one_hot(bins, num_bins, dtype=jnp.float32)
  return one_hot.T @ loss_B.astype(jnp.float32), jnp.sum(one_hot, axis=0)
