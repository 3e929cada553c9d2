"""Helpers for config files: `get_config("key=value,...")` variants and the model config a run uses."""

from __future__ import annotations

from typing import Any

import ml_collections

from dgemma import config as model_configs


def parse_arg(arg: str | None, **defaults: Any) -> ml_collections.ConfigDict:
  """'a=1,b=x' -> ConfigDict(a=1, b='x'), typed by the defaults; an unknown key is an error."""
  out = ml_collections.ConfigDict(defaults)
  for item in filter(None, (arg or "").split(",")):
    if "=" not in item:
      raise ValueError(f"config argument {item!r} is not of the form key=value")
    key, value = item.split("=", 1)
    if key not in defaults:
      raise ValueError(f"unknown config argument {key!r}; known: {sorted(defaults)}")
    kind = type(defaults[key])
    out[key] = (value.lower() in ("1", "true", "yes")) if kind is bool else kind(value)
  return out


model_config = model_configs.from_preset  # (config.model_preset, config.model overrides) -> ModelConfig


def sampling_metadata(c: ml_collections.ConfigDict, init_metadata: dict | None = None) -> dict:
  """What a run's model records for sampling it (read back by sample.py, the eval scripts and the evaluations):
  `self_conditioning`, whether that branch learned anything (here or in the `init_from` checkpoint), and
  `sampler`, the config's sampling defaults, else those of the checkpoint it starts from; and the model's position
  features, which the model reads: the `init_from` checkpoint's (its model is the run's), else
  `config.position_features`. A bad knob fails here."""
  from dgemma import sampling  # (the sampler imports the model; configs need not)
  from dgemma.model import position_features
  start = (init_metadata or {}) if c.get("init_from") else None  # (a checkpoint without records: {})
  metadata = {"self_conditioning": bool(c.diffusion.self_cond_prob > 0 or (
      start is not None and sampling.self_conditioning_for(start)))}
  if c.get("sampler"):
    metadata["sampler"] = c.sampler.to_dict()
  elif start and start.get("sampler"):
    metadata["sampler"] = dict(start["sampler"])
  if "sampler" in metadata:
    sampling.sampler_config(metadata)
  table = start.get(position_features.METADATA_KEY) if start is not None else c.get("position_features")
  if table:
    metadata[position_features.METADATA_KEY] = position_features.to_json(table)
  return metadata
