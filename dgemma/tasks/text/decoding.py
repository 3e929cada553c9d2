"""Which decoder a text checkpoint's weights are for. A run trained with objective=ar (configs/text.py, recorded
as diffusion_loss_weight 0 in the training config that an exported model keeps in its metadata) never trained
its denoiser: it is scored (scripts/eval_text.py, the in-training likelihood) and decoded (sample.py, the
training samples) through the causal encoder. The one place that decision is made."""

from __future__ import annotations

from typing import Mapping


def trained_diffusion(metadata: Mapping | None) -> Mapping:
  """The training config's `diffusion` section recorded in an exported model's metadata ({} when it has none:
  an HF checkpoint, a model exported without its training config)."""
  return ((metadata or {}).get("train_config") or {}).get("diffusion") or {}


def mode(diffusion: Mapping, requested: str = "auto") -> str:
  """'ar' or 'diffusion': `requested`, or for 'auto' 'ar' exactly when the run trained with diffusion_loss_weight
  0 (a training config's `diffusion` section; a section without the field had the default, 1)."""
  if requested != "auto":
    return requested
  return "ar" if diffusion.get("diffusion_loss_weight", 1.0) == 0 else "diffusion"
