"""Noise schedules alpha(t): the probability that a token is kept at noise level t in [0, 1].

A schedule is one small function t -> alpha(t) with alpha(0) = 1 and alpha(1) = 0; its time derivative comes
from `jax.grad`, so adding a schedule means adding one function to `SCHEDULES`.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp


def linear(t):
  """alpha = 1 - t: the official DiffusionGemma schedule."""
  return 1.0 - t


def cosine(t):
  """alpha = cos(pi t / 2): keeps more tokens at low t, corrupts faster near t = 1."""
  return jnp.cos(0.5 * jnp.pi * t)


def sine(t):
  """alpha = 1 - sin(pi t / 2): corrupts fast at low t, so more of training sees heavy noise (e.g. half the
  draws have over 70% of tokens replaced), where a canvas must be reasoned out from the prompt."""
  return 1.0 - jnp.sin(0.5 * jnp.pi * t)


SCHEDULES: dict[str, Callable] = {"linear": linear, "cosine": cosine, "sine": sine}


def get(name: str) -> Callable:
  if name not in SCHEDULES:
    raise ValueError(f"unknown noise schedule {name!r}; choose from {sorted(SCHEDULES)}")
  return SCHEDULES[name]


def alpha_and_derivative(name: str, t: jax.Array) -> tuple[jax.Array, jax.Array]:
  """(alpha(t), d alpha / dt), elementwise."""
  fn = get(name)
  return fn(t), jax.vmap(jax.grad(lambda s: fn(s)))(t.reshape(-1)).reshape(t.shape)
