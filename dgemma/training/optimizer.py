"""The optax chain of the official recipe: clip -> Adam (or factored RMS) -> weight decay -> warmup+cosine LR."""

from __future__ import annotations

import ml_collections
import optax


def learning_rate_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate`, then cosine decay to `end_learning_rate` at `decay_steps`."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
      decay_steps=max(cfg.decay_steps, cfg.warmup_steps + 1), end_value=cfg.end_learning_rate)


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  if cfg.name == "adam":
    scale = optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
  elif cfg.name == "factored_rms":  # Adafactor-style second moments: far less state for huge matrices
    scale = optax.scale_by_factored_rms()
  else:
    raise ValueError(f"unknown optimizer {cfg.name!r}; choose 'adam' or 'factored_rms'")
  return optax.chain(
      optax.clip_by_global_norm(cfg.grad_clip_norm),
      scale,
      optax.add_decayed_weights(cfg.weight_decay),
      optax.scale_by_learning_rate(learning_rate_schedule(cfg)),
  )
