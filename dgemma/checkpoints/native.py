"""Our own inference checkpoint: a directory with `dgemma.json` (model config + metadata) and
`params.safetensors` (flat '/'-joined parameter names). Small models (e.g. the checkpoints in assets/) ship so.

`dgemma.loading.load_model(path)` opens any checkpoint a user may hand us: this format, an HF DiffusionGemma
directory, a GGUF file or a training workdir (its latest step).
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dgemma.checkpoints import safetensors_io
from dgemma.config import ModelConfig
from dgemma.model import param_shapes

CONFIG_FILE = "dgemma.json"
PARAMS_FILE = "params.safetensors"


def flatten(params: dict) -> dict[str, Any]:
  flat = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    flat["/".join(p.key for p in path)] = leaf
  return flat


def unflatten(flat: dict[str, Any]) -> dict:
  tree: dict = {}
  for name, leaf in flat.items():
    node = tree
    *parents, last = name.split("/")
    for p in parents:
      node = node.setdefault(p, {})
    node[last] = leaf
  return tree


def config_to_dict(config: ModelConfig) -> dict:
  return dataclasses.asdict(config)


def config_from_dict(d: dict) -> ModelConfig:
  fields = {f.name for f in dataclasses.fields(ModelConfig)}
  unknown = sorted(set(d) - fields)
  if unknown:
    raise ValueError(f"unknown model config field(s) {unknown}")
  d = dict(d)
  for key in ("layer_types", "stop_ids"):
    if key in d:
      d[key] = tuple(d[key])
  return ModelConfig(**d)


def save_model(path: str, config: ModelConfig, params: dict, metadata: dict | None = None) -> None:
  """Writes config, metadata (e.g. the task format) and params; each file is replaced atomically."""
  os.makedirs(path, exist_ok=True)
  flat = {k: np.asarray(jax.device_get(v)) for k, v in flatten(params).items()}
  safetensors_io.save(os.path.join(path, PARAMS_FILE), flat)
  tmp = os.path.join(path, CONFIG_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump({"model": config_to_dict(config), "metadata": metadata or {}}, f, indent=2)
  os.replace(tmp, os.path.join(path, CONFIG_FILE))


def load_native(path: str) -> tuple[ModelConfig, dict, dict]:
  with open(os.path.join(path, CONFIG_FILE)) as f:
    info = json.load(f)
  config = config_from_dict(info["model"])
  f = safetensors_io.SafetensorsFile(os.path.join(path, PARAMS_FILE))
  dtype = jnp.dtype(config.param_dtype)
  params = unflatten({k: jnp.asarray(f.get(k), dtype) for k in f.keys()})
  expected = jax.tree.map(lambda s: s.shape, param_shapes(config))
  got = jax.tree.map(lambda a: a.shape, params)
  if expected != got:
    raise ValueError(f"{path}: parameters do not match the model config in {CONFIG_FILE}")
  return config, params, info.get("metadata", {})
