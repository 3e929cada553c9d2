"""Temperature schedules over the denoising steps of one canvas.

Steps are counted as Hugging Face counts them: the k-th step (k = 0..N-1) has `remaining = N - k`, so the
first step sees remaining = N and the last remaining = 1. The schedules therefore start at t_max and never
quite reach t_min (spec §5.1 b).
"""

from __future__ import annotations

import math

import jax.numpy as jnp
from jaxtyping import Array, Float, Int

SCHEDULES = ("linear", "cosine", "constant")


def check(schedule: str, t_max: float, t_min: float) -> None:
  """One-line ValueError for a schedule that cannot produce positive temperatures."""
  if schedule not in SCHEDULES:
    raise ValueError(f"unknown temperature schedule {schedule!r}; choose from {list(SCHEDULES)}")
  if not (math.isfinite(t_max) and math.isfinite(t_min)):
    raise ValueError(f"temperatures must be finite, got t_max={t_max}, t_min={t_min}")
  if schedule == "constant":
    if t_max <= 0:
      raise ValueError(f"the constant schedule uses t_max, which must be > 0 (got {t_max})")
    return
  if t_min < 0:
    raise ValueError(f"t_min must be >= 0, got {t_min}")
  if t_max <= t_min:
    raise ValueError(f"t_max must be > t_min, got t_max={t_max}, t_min={t_min}")


def temperature(schedule: str, t_max: float, t_min: float, remaining: Int[Array, ""],
                num_steps: int) -> Float[Array, ""]:
  """The temperature of the step with `remaining` steps left (N..1), as a float32 scalar.

  linear:   HF's LinearTemperatureScheduleLogitsProcessor, t_min + (t_max - t_min) * remaining / N, with the
            same float32 arithmetic (HF turns the step into an int32 tensor before dividing).
  cosine:   t_min + (t_max - t_min) * (1 - cos(pi * remaining / N)) / 2: stays near t_max early, falls late.
  constant: t_max at every step.
  """
  if schedule == "constant":
    return jnp.float32(t_max)
  frac = jnp.asarray(remaining, jnp.float32) / jnp.float32(num_steps)
  if schedule == "linear":
    return jnp.float32(t_min) + jnp.float32(t_max - t_min) * frac
  if schedule == "cosine":
    return jnp.float32(t_min) + jnp.float32(t_max - t_min) * (0.5 * (1.0 - jnp.cos(jnp.pi * frac)))
  raise ValueError(f"unknown temperature schedule {schedule!r}; choose from {list(SCHEDULES)}")
