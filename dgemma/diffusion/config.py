"""The training objective's knobs: one frozen, validated dataclass, the single place their defaults live.

The defaults are the official SFT recipe (spec §4): linear schedule, t ~ U[1e-4, 1 - 1e-4], flat CE on the
chosen canvas plus the encoder's AR loss (weights 1 and 1), self-conditioning on half the rows with one
no-gradient pass. The other knobs are research options, off by default. A training config's `diffusion`
section converts with `ObjectiveConfig.from_config`, so a bad knob fails at start-up, not while tracing.
Hashable: `objective.loss_fn` closes over it under jit.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import numpy as np

from dgemma.diffusion import schedules

# flat_ce: the official recipe's unweighted CE. elbo: the uniform-state NELBO with the denoiser read as the posterior
# given the other noisy tokens; elbo_full: the same bound with the denoiser read as the full posterior (the one a flat
# CE trains and the sampler assumes), converted by Bayes as the held-out evaluation reads a flat-CE model.
LOSSES = ("flat_ce", "elbo", "elbo_full")
AR_TARGETS = ("all", "canvas")  # the AR loss on [prompt ‖ canvas] (official) or on the canvas only


@dataclasses.dataclass(frozen=True)
class ObjectiveConfig:
  """Knobs of `dgemma.diffusion.objective.loss_fn` (the `diffusion` section of a training config)."""

  schedule: str = "linear"  # alpha(t), a name in schedules.SCHEDULES
  t_eps: float = 1e-4  # t ~ [t_eps, 1 - t_eps]
  loss: str = "flat_ce"  # one of LOSSES
  num_noise_bins: int = 10  # bins of t for the logged loss per noise level (a metric; no effect on training)
  diffusion_loss_weight: float = 1.0  # 0: a purely autoregressive run (the denoiser is never called)
  ar_loss_weight: float = 1.0  # the encoder's next-token loss; 0: not computed
  ar_targets: str = "all"  # one of AR_TARGETS
  self_cond_prob: float = 0.5  # the share of rows trained with a self-conditioning signal (round(p·B) rows)
  # No-gradient passes before the scored one on those rows, each fed its predecessor's logits (the first none):
  # 1 is the official recipe; more make the signal look like the sampler's later steps'.
  self_cond_passes: int = 1
  # Noise levels drawn with density ~ t^t_tilt (0: uniform, the official; > 0 more heavy noise, in (-1, 0) more
  # light noise), the tilt moving linearly from 0 over t_tilt_steps training steps (0: from the first step).
  t_tilt: float = 0.0
  t_tilt_steps: int = 0
  # k > 1: each example is denoised at k independent noise levels against one encoding of its prompt.
  noise_draws: int = 1
  # The share of rows whose corrupted tokens are those of highest batch["noise_rank"] (corruption.corrupt_in_order);
  # > 0 needs a task whose batches carry that rank.
  ordered_noise_prob: float = 0.0
  # > 0: the losses (and the self-conditioning input) computed from the final hidden states this many tokens at a
  # time, never holding all [B, T, V] logits (dgemma/diffusion/chunked.py); the same numbers up to float rounding.
  # 0: from the whole logits.
  loss_chunk_tokens: int = 0
  # False: the denoiser's loss does not reach the encoder pass that built its cache (a stop-gradient on the cache),
  # so that pass runs forward only; the weights still learn from the denoiser's own pass (and any AR loss).
  cache_gradient: bool = True

  def __post_init__(self):
    for name in ("t_eps", "diffusion_loss_weight", "ar_loss_weight", "self_cond_prob", "t_tilt",
                 "ordered_noise_prob"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, float, np.integer, np.floating)):
        raise ValueError(f"diffusion.{name} must be a finite number, got {value!r}")
      with np.errstate(over="ignore"):  # checked in float32, the dtype the objective computes in (1e39 is not)
        if not np.isfinite(np.float32(value)):
          raise ValueError(f"diffusion.{name} must be a finite number in float32, got {value!r}")
      object.__setattr__(self, name, float(value))
    for name in ("num_noise_bins", "self_cond_passes", "t_tilt_steps", "noise_draws", "loss_chunk_tokens"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"diffusion.{name} must be an integer, got {value!r}")
      object.__setattr__(self, name, int(value))
    if not isinstance(self.cache_gradient, (bool, np.bool_)):
      raise ValueError(f"diffusion.cache_gradient must be true or false, got {self.cache_gradient!r}")
    object.__setattr__(self, "cache_gradient", bool(self.cache_gradient))
    if self.schedule not in schedules.SCHEDULES:
      raise ValueError(f"diffusion.schedule must be one of {sorted(schedules.SCHEDULES)}, got {self.schedule!r}")
    if self.loss not in LOSSES:
      raise ValueError(f"diffusion.loss must be one of {LOSSES}, got {self.loss!r}")
    if self.ar_targets not in AR_TARGETS:
      raise ValueError(f"diffusion.ar_targets must be one of {AR_TARGETS}, got {self.ar_targets!r}")
    if not 0 < self.t_eps < 0.5:
      raise ValueError(f"diffusion.t_eps must be in (0, 0.5), got {self.t_eps!r}")
    for name in ("diffusion_loss_weight", "ar_loss_weight"):
      if getattr(self, name) < 0:
        raise ValueError(f"diffusion.{name} must be >= 0, got {getattr(self, name)!r}")
    if self.t_tilt <= -1:
      raise ValueError(f"diffusion.t_tilt must be > -1 (the density t^tilt must integrate), got {self.t_tilt!r}")
    if self.diffusion_loss_weight == 0 and self.ar_loss_weight == 0:
      raise ValueError("diffusion.diffusion_loss_weight and diffusion.ar_loss_weight are both 0: nothing to train")
    for name in ("self_cond_prob", "ordered_noise_prob"):
      if not 0 <= getattr(self, name) <= 1:
        raise ValueError(f"diffusion.{name} must be in [0, 1], got {getattr(self, name)!r}")
    for name, low in (("num_noise_bins", 1), ("self_cond_passes", 1), ("t_tilt_steps", 0), ("noise_draws", 1),
                      ("loss_chunk_tokens", 0)):
      if getattr(self, name) < low:
        raise ValueError(f"diffusion.{name} must be >= {low}, got {getattr(self, name)!r}")

  @classmethod
  def from_dict(cls, knobs: Mapping[str, Any]) -> "ObjectiveConfig":
    """The config with these knobs set and the rest at their defaults; an unknown knob is refused."""
    known = [f.name for f in dataclasses.fields(cls)]
    unknown = sorted(set(knobs) - set(known))
    if unknown:
      raise ValueError(f"unknown diffusion knob(s) {unknown}; known: {known}")
    return cls(**knobs)

  @classmethod
  def from_config(cls, section: Any) -> "ObjectiveConfig":
    """From a training config's `diffusion` section (an ml_collections.ConfigDict or a plain mapping)."""
    return cls.from_dict(section.to_dict() if hasattr(section, "to_dict") else dict(section))

  def replace(self, **changes: Any) -> "ObjectiveConfig":
    return dataclasses.replace(self, **changes)
