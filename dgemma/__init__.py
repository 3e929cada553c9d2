"""dgemma: DiffusionGemma-style text diffusion in JAX."""

from dgemma import checkpoints, config, model

__all__ = ["checkpoints", "config", "model"]
