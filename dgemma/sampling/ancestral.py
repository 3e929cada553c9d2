"""Ancestral sampling: the exact reverse step of the uniform-state noise process (SamplerConfig.update="ancestral").

The released sampler's step (acceptance.py) is a heuristic: it samples a whole clean canvas, keeps the confident
tokens and renoises the rest. The ancestral step is the one the diffusion ELBO scores (dgemma/diffusion/elbo.py): with
N steps per canvas, step k moves the canvas from noise level t = 1 - k/N to s = 1 - (k+1)/N by drawing each token
from

    p(x_s,l = k | x_t) = Σ_j q(x_s,l = k | x_t,l, x0_l = j) · p_θ(x0_l = j | x_t),

q the forward process of dgemma/diffusion/corruption.py (keep with probability alpha, else a uniform token). The
first canvas, uniform tokens, is an exact draw from x_1 (alpha(1) = 0), and the last step (s = 0) draws x_0 from
p_θ(x0 | x_t) itself; so at temperature 1 and many steps the canvas is a sample from the model the bound is about.
Tokens are drawn independently given x_t, as the bound's reverse process assumes; every step is run (no stop).

With x_t,l = i, r = alpha(t)/alpha(s) and p_ctx the posterior given the other tokens only (p_θ with token l's own
likelihood q(x_t,l = i | x0_l) divided out: losses.context_only_logits), the sum has the closed form

    p(x_s,l = k | x_t) ∝ (r·[k = i] + (1 - r)/V) · (alpha(s)·p_ctx(k) + (1 - alpha(s))/V),

the first factor q(x_t,l = i | x_s,l = k), the second Σ_j q(x_s,l = k | x0_l = j)·p_ctx(j):
tests/sampling/test_ancestral.py checks it against the sum written out. Multiplied out, it is a mixture of three
draws, which is how `step` samples it without writing the [B, C, V] distribution out:

    keep token i             with mass r·(alpha(s)·p_ctx(i) + (1 - alpha(s))/V),
    a draw from p_ctx        with mass (1 - r)·alpha(s)/V,
    a uniform token          with mass (1 - r)·(1 - alpha(s))/V.

The draw from p_ctx is the released sampler's (acceptance.analyse, or the CPU kernel: one exp pass, one uniform),
whose softmax is also the self-conditioning signal, so a step costs about what the released sampler's does.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array, Float, Int

from dgemma.diffusion import elbo, losses, schedules
from dgemma.sampling import acceptance
from dgemma.sampling.acceptance import TokenStats


def noise_levels(schedule: str, step: Int[Array, ""], num_steps: int) -> tuple[Array, Array]:
  """(alpha(t), alpha(s)) of step `step` of `num_steps`: from t = 1 - step/N to s = 1 - (step + 1)/N."""
  t = 1.0 - step.astype(jnp.float32) / num_steps
  s = 1.0 - (step + 1).astype(jnp.float32) / num_steps
  fn = schedules.get(schedule)
  return jnp.clip(fn(t), 0.0, 1.0), jnp.clip(fn(s), 0.0, 1.0)  # (cos(pi/2) rounds to a hair below 0)


def reverse_probs(logits_BxCxV: Float[Array, "B C V"], canvas_BxC: Int[Array, "B C"], alpha_t: Array,
                  alpha_s: Array, denoiser_output: str) -> Float[Array, "B C V"]:
  """p(x_s | x_t) per token (float32), from the denoiser's logits read as `denoiser_output` (elbo.DENOISER_OUTPUTS).
  alpha_t, alpha_s: scalars with 0 <= alpha_t < alpha_s <= 1."""
  if denoiser_output not in elbo.DENOISER_OUTPUTS:
    raise ValueError(f"denoiser_output must be one of {elbo.DENOISER_OUTPUTS}, got {denoiser_output!r}")
  b, c, v = logits_BxCxV.shape
  logits = logits_BxCxV.astype(jnp.float32)
  if denoiser_output == "full":
    logits = losses.context_only_logits(logits, canvas_BxC, jnp.full((b,), alpha_t, jnp.float32))
  p_ctx = jax.nn.softmax(logits, axis=-1)
  r = alpha_t / alpha_s
  own = jax.nn.one_hot(canvas_BxC, v, dtype=jnp.float32)
  unnormalized = (r * own + (1.0 - r) / v) * (alpha_s * p_ctx + (1.0 - alpha_s) / v)
  return unnormalized / jnp.sum(unnormalized, axis=-1, keepdims=True)


def _analyse(logits_BxCxV, uniform_BxC, temperature) -> TokenStats:
  return acceptance.analyse(logits_BxCxV, uniform_BxC, with_probs=True, temperature=temperature)


def step(keys_B: jax.Array, logits_BxCxV: Float[Array, "B C V"], canvas_BxC: Int[Array, "B C"],
         step_index: Int[Array, ""], num_steps: int, schedule: str, denoiser_output: str,
         temperature: float | Array = 1.0,
         token_stats: Callable[..., TokenStats] = _analyse) -> tuple[Int[Array, "B C"], Float[Array, "B C V"]]:
  """One reverse step of every row (its own key per row): (the canvas at noise level s = 1 - (step + 1)/N,
  softmax(logits / temperature) in float32, the self-conditioning signal). The temperature divides the logits
  before they are read (1: the model's own distribution). `token_stats(logits, uniform, temperature)`: the
  released sampler's draw with its float32 probabilities (acceptance.analyse's contract; the CPU kernel's too)."""
  if denoiser_output not in elbo.DENOISER_OUTPUTS:
    raise ValueError(f"denoiser_output must be one of {elbo.DENOISER_OUTPUTS}, got {denoiser_output!r}")
  b, c, v = logits_BxCxV.shape
  alpha_t, alpha_s = noise_levels(schedule, step_index, num_steps)
  logits = logits_BxCxV.astype(jnp.float32)
  rows, cols = jnp.arange(b)[:, None], jnp.arange(c)[None, :]
  temperature = jnp.asarray(temperature, jnp.float32)
  full = denoiser_output == "full"
  context = logits
  if full:  # token l's own likelihood divided out (losses.context_only_logits), at the one entry it changes
    own_ratio = jnp.log1p(v * alpha_t / (1.0 - alpha_t))
    t_BxC = jnp.broadcast_to(temperature, (b, c, 1))[..., 0] if temperature.ndim else temperature
    context = logits.at[rows, cols, canvas_BxC].add(-t_BxC * own_ratio)  # (its ratio on the tempered scale)
  u_Bx2xC = jax.vmap(lambda k: jax.random.uniform(k, (2, c), minval=jnp.finfo(jnp.float32).tiny))(keys_B)
  which_BxC, draw_BxC = u_Bx2xC[:, 0], u_Bx2xC[:, 1]
  stats = token_stats(context, draw_BxC, temperature)
  p_own = stats.probs[rows, cols, canvas_BxC]  # p_ctx(i)
  r = alpha_t / alpha_s
  keep = r * (alpha_s * p_own + (1.0 - alpha_s) / v)
  from_context = (1.0 - r) * alpha_s / v
  from_uniform = (1.0 - r) * (1.0 - alpha_s) / v
  target = which_BxC * (keep + from_context + from_uniform)
  uniform_token = jnp.minimum((draw_BxC * v).astype(jnp.int32), v - 1)
  # (Strict comparisons and the from_uniform > 0 test: a component without mass is never chosen, even when rounding
  # puts the target on its boundary.)
  canvas = jnp.where(target < keep, canvas_BxC,
                     jnp.where((target < keep + from_context) | (from_uniform <= 0), stats.sample, uniform_token))
  if not full:
    return canvas.astype(jnp.int32), stats.probs
  # The full posterior's softmax from p_ctx: token i's own likelihood multiplied back in, exp(own_ratio) = 1 + g.
  g = jnp.expm1(own_ratio)
  norm = 1.0 + g * p_own
  probs = (stats.probs / norm[..., None]).at[rows, cols, canvas_BxC].set(p_own * (1.0 + g) / norm)
  return canvas.astype(jnp.int32), probs
