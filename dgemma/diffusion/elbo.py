"""The held-out uniform-state ELBO in bits per token, estimated on a fixed set of stratified noise levels
(docs/text.md, "Held-out likelihood").

    -log p(x) <= NELBO = ∫_0^1 E_{x_t ~ q(x_t|x)} [ Σ_l f(x, x_t, t)_l ] dt     (+ prior 0, + reconstruction 0)

with f the integrand of `losses.uniform_elbo_per_token`. The prior term is 0 because alpha(1) = 0 makes x_1
uniform, which is the prior; the reconstruction term is 0 because alpha(0) = 1 makes x_0 the data itself.
The integral is the midpoint rule over K strata, t_k = (k + 1/2)/K (clipped into [eps, 1 - eps]), with
`draws` corruptions per stratum from a fixed key, so two runs with the same K and key see the same noise.
"""

from __future__ import annotations

import math
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from dgemma.diffusion import corruption, losses, schedules

Denoiser = Callable[[Int[Array, "B L"]], Float[Array, "B L V"]]  # x_t -> logits of p_θ(x_0 | x_t)

# How the bound reads the denoiser's softmax at token l. "context": as p(x0_l | x_t^{-l}), the posterior given the
# other noisy tokens, which is what makes the bound tight (the parameterization `diffusion.loss=elbo` trains).
# "full": as p(x0_l | x_t), the posterior a flat cross-entropy trains toward, turned into the context-only one by
# Bayes (`losses.context_only_logits`) before the bound is computed. tests/diffusion/test_elbo.py: both are tight
# for the exact posterior they name, and reading a full posterior as "context" is not.
DENOISER_OUTPUTS = ("context", "full")


def denoiser_output_for(loss: str) -> str:
  """What a run trained with `diffusion.loss` = loss makes its denoiser output: the context-only posterior for
  loss='elbo', the full posterior for the flat cross-entropy (and elbo_full, which reads it so)."""
  return "context" if loss == "elbo" else "full"


def stratified_t(num_t: int, eps: float = 1e-4) -> Float[Array, "K"]:
  """The K midpoints (k + 1/2)/K, clipped into [eps, 1 - eps] (a no-op unless K > 1/(2 eps))."""
  if isinstance(num_t, bool) or not isinstance(num_t, int) or num_t < 1:
    raise ValueError(f"the number of t values must be a positive integer, got {num_t!r}")
  return jnp.clip((jnp.arange(num_t, dtype=jnp.float32) + 0.5) / num_t, eps, 1.0 - eps)


def strata_sums(denoise: Denoiser, x0_BxL: Int[Array, "B L"], mask_BxL: Bool[Array, "B L"], vocab_size: int,
                schedule: str, num_t: int, key: jax.Array, eps: float = 1e-4,
                draws: int = 1, denoiser_output: str = "context") -> tuple[Float[Array, "B K"], Float[Array, "B K"]]:
  """Per example and stratum, summed over the masked tokens (nats), averaged over `draws` corruptions:
  (the NELBO integrand, the flat cross-entropy -log p_θ(x_0|x_t) of training's loss). `denoiser_output`: how the
  bound reads the logits (DENOISER_OUTPUTS); the cross-entropy always reads them as they are. Stratum k's noise comes
  from fold_in(key, k), so it does not depend on K's other strata or on the batch's other calls. `key`: one key,
  or one per example ([B] keys), which makes an example's noise independent of the batch it is in."""
  if denoiser_output not in DENOISER_OUTPUTS:
    raise ValueError(f"denoiser_output must be one of {DENOISER_OUTPUTS}, got {denoiser_output!r}")
  t_K = stratified_t(num_t, eps)
  b = x0_BxL.shape[0]
  m = mask_BxL.astype(jnp.float32)
  elbo_cols, ce_cols = [], []
  for k in range(num_t):
    t_B = jnp.full((b,), t_K[k])
    alpha_B, dalpha_B = schedules.alpha_and_derivative(schedule, t_B)
    elbo_B, ce_B = jnp.zeros((b,)), jnp.zeros((b,))
    for d in range(draws):
      x_t = _corrupt(_fold(_fold(key, k), d), x0_BxL, alpha_B, vocab_size)
      logits = denoise(x_t)
      bound_logits = logits if denoiser_output == "context" else losses.context_only_logits(logits, x_t, alpha_B)
      elbo_B += jnp.sum(losses.uniform_elbo_per_token(bound_logits, x0_BxL, x_t, alpha_B, dalpha_B) * m, -1)
      ce_B += jnp.sum(losses.token_cross_entropy(logits, x0_BxL) * m, -1)
    elbo_cols.append(elbo_B / draws)
    ce_cols.append(ce_B / draws)
  return jnp.stack(elbo_cols, 1), jnp.stack(ce_cols, 1)


def _fold(key: jax.Array, data: int) -> jax.Array:
  return jax.random.fold_in(key, data) if key.ndim == 0 else jax.vmap(lambda k: jax.random.fold_in(k, data))(key)


def _corrupt(key: jax.Array, x0_BxL, alpha_B, vocab_size: int):
  if key.ndim == 0:
    return corruption.corrupt(key, x0_BxL, alpha_B, vocab_size)[0]
  one = lambda k, x_L, a: corruption.corrupt(k, x_L[None], a[None], vocab_size)[0][0]
  return jax.vmap(one)(key, x0_BxL, alpha_B)


def summarize(elbo_sums_BxK: np.ndarray, ce_sums_BxK: np.ndarray, tokens_B: np.ndarray) -> dict:
  """The bound in bits per token over all examples' tokens (a ratio Σ_i s_i / Σ_i n_i, s_i = example i's
  midpoint-rule NELBO, n_i its token count), its standard error over examples (the ratio estimator's: data and
  Monte-Carlo noise together), and per stratum the integrand and the cross-entropy in bits per token."""
  elbo_sums_BxK, ce_sums_BxK = np.asarray(elbo_sums_BxK, np.float64), np.asarray(ce_sums_BxK, np.float64)
  tokens_B = np.asarray(tokens_B, np.float64)
  n, k = elbo_sums_BxK.shape
  total_tokens = tokens_B.sum()
  if total_tokens <= 0:
    raise ValueError("no target tokens to evaluate")
  s_B = elbo_sums_BxK.mean(1)  # the midpoint rule: width 1/K per stratum
  ratio = s_B.sum() / total_tokens
  stderr = (math.sqrt(n / (n - 1) * np.sum((s_B - ratio * tokens_B) ** 2)) / total_tokens) if n > 1 else float("nan")
  ln2 = math.log(2.0)
  return {"bits_per_token": ratio / ln2, "stderr_bits_per_token": stderr / ln2, "num_t": k, "num_examples": n,
          "num_tokens": int(total_tokens),
          "elbo_integrand_bits_by_t": (elbo_sums_BxK.sum(0) / total_tokens / ln2).tolist(),
          "cross_entropy_bits_by_t": (ce_sums_BxK.sum(0) / total_tokens / ln2).tolist()}
