"""`load_model(path)`: any checkpoint a user may hand us, as (config, params, metadata).

Above both `dgemma.checkpoints` (the file formats) and `dgemma.training` (a training workdir's orbax checkpoints,
LoRA merged) and `dgemma.diffusionize` (a pretrained AR Gemma turned into a diffusion model), so that none of
those imports another through it.
"""

from __future__ import annotations

import os

import jax

from dgemma import diffusionize
from dgemma.checkpoints.hf import generation_defaults, load_hf
from dgemma.checkpoints.native import CONFIG_FILE, load_native
from dgemma.config import ModelConfig
from dgemma.training import checkpointing


def load_model(path: str) -> tuple[ModelConfig, dict, dict]:
  """(config, params, metadata) from a native checkpoint, an HF directory, a training workdir or a GGUF file."""
  if not os.path.exists(path):
    raise FileNotFoundError(f"checkpoint {path} does not exist")
  if path.endswith(".gguf"):  # a pretrained AR Gemma: turned into a diffusion model on load
    config, params = diffusionize.load_gguf_diffusion(path, jax.random.key(0))
    return config, params, {"diffusionized_from": os.path.abspath(path)}
  if os.path.exists(os.path.join(path, CONFIG_FILE)):
    return load_native(path)
  if os.path.exists(os.path.join(path, "config.json")):
    config, params = load_hf(path)
    _, knobs = generation_defaults(path)  # sampling defaults, as HF generate takes them from the directory
    return config, params, {"sampler": knobs} if knobs else {}
  if os.path.isdir(os.path.join(path, "checkpoints")):  # a training workdir: its latest step
    return checkpointing.load_inference(path)
  raise ValueError(f"{path} is not a checkpoint: expected {CONFIG_FILE}, an HF config.json, "
                   "or a training workdir with checkpoints/")
