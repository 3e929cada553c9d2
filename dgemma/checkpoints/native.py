"""Our own inference checkpoint: a directory with `dgemma.json` (model config + metadata) and
`params.safetensors` (flat '/'-joined parameter names). Small models (e.g. the checkpoints in assets/) ship so.

A model with position features keeps its [L, F] table in metadata["position_features"]
(dgemma/model/position_features.py). Checkpoints written before kept it inside the model config, as
"position_features"; `upgrade_config_dict` reads them.

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
from dgemma.model import position_features

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


def upgrade_config_dict(d: dict) -> tuple[dict, list | None]:
  """(the model config dict in the current format, the position-feature table an older one held inside it, or
  None). Older configs held the table itself as "position_features"; today's hold its width,
  "num_position_features", and the table travels in the metadata."""
  d = dict(d)
  if "position_features" not in d:
    return d, None
  table = [list(row) for row in d.pop("position_features")] or None
  d.setdefault("num_position_features", len(table[0]) if table else 0)
  return d, table


def config_from_dict(d: dict) -> ModelConfig:
  """The ModelConfig of a config dict (an older one's position-feature table is dropped: `upgrade_config_dict`)."""
  d, _ = upgrade_config_dict(d)
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
  metadata = dict(metadata or {})
  table = position_features.check(config, metadata.get(position_features.METADATA_KEY))  # a model needing one has one
  if table is not None:
    metadata[position_features.METADATA_KEY] = position_features.to_json(table)
  flat = {k: np.asarray(jax.device_get(v)) for k, v in flatten(params).items()}
  safetensors_io.save(os.path.join(path, PARAMS_FILE), flat)
  tmp = os.path.join(path, CONFIG_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump({"model": config_to_dict(config), "metadata": metadata}, f, indent=2)
  os.replace(tmp, os.path.join(path, CONFIG_FILE))


def load_native(path: str) -> tuple[ModelConfig, dict, dict]:
  with open(os.path.join(path, CONFIG_FILE)) as f:
    info = json.load(f)
  config, metadata = config_and_metadata(info)
  f = safetensors_io.SafetensorsFile(os.path.join(path, PARAMS_FILE))
  dtype = jnp.dtype(config.param_dtype)
  params = unflatten({k: jnp.asarray(f.get(k), dtype) for k in f.keys()})
  expected = jax.tree.map(lambda s: s.shape, param_shapes(config))
  got = jax.tree.map(lambda a: a.shape, params)
  if expected != got:
    raise ValueError(f"{path}: parameters do not match the model config in {CONFIG_FILE}")
  return config, params, metadata


def config_and_metadata(info: dict) -> tuple[ModelConfig, dict]:
  """The model config and metadata of a saved {"model", "metadata"} dict (dgemma.json, a run's run.json), the
  position-feature table in the metadata whichever the format (checked against the config)."""
  model_dict, legacy_table = upgrade_config_dict(info["model"])
  config = config_from_dict(model_dict)
  metadata = dict(info.get("metadata") or {})
  if legacy_table is not None:
    metadata.setdefault(position_features.METADATA_KEY, legacy_table)
  position_features.check(config, metadata.get(position_features.METADATA_KEY))
  return config, metadata
