"""Depth growth: a deeper model that starts out computing exactly what a trained one computes.

Every new layer is a copy of the layer it follows (same type, same attention and MLP weights) whose two output
norms are zeroed and whose layer scalar is one: its block adds nothing to the residual stream, so the grown
model's logits equal the original's until training moves those scales. The new layers begin from trained
weights rather than from noise, in the spirit of block expansion (LLaMA Pro), and a small model that has stopped
improving can be given more depth without starting over.
"""

from __future__ import annotations

from collections.abc import Sequence

import jax
import jax.numpy as jnp

from dgemma.config import ModelConfig

_OUTPUT_NORMS = ("post_attention_norm", "post_ffw_norm")  # what a block adds to x is scaled by these


def identity_copy(layer_params: dict) -> dict:
  """`layer_params` with the block's residual contribution switched off: output norms 0, layer scalar 1."""
  new = jax.tree.map(jnp.array, layer_params)  # a copy: the original's arrays stay untouched
  for name in _OUTPUT_NORMS:
    new[name] = {"scale": jnp.zeros_like(layer_params[name]["scale"])}
  new["layer_scalar"] = jnp.ones_like(layer_params["layer_scalar"])
  return new


def grow_depth(config: ModelConfig, params: dict, insert_after: Sequence[int]) -> tuple[ModelConfig, dict]:
  """(deeper config, its params): one identity copy of layer i inserted after layer i for each i listed
  (an index listed twice inserts two copies)."""
  n = config.num_layers
  if not insert_after:
    raise ValueError("grow_depth: insert_after is empty; list the layers (0-based) to insert a copy after")
  bad = sorted({i for i in insert_after if not 0 <= i < n})
  if bad:
    raise ValueError(f"grow_depth: layer indices {bad} out of range for a {n}-layer model")
  missing = [f"layer_{i}" for i in range(n) if f"layer_{i}" not in params]
  if missing:
    raise ValueError(f"grow_depth: params lack {missing[0]} (is this a {n}-layer model?)")
  layers, types = [], []
  for i in range(n):
    layers.append(params[f"layer_{i}"])
    types.append(config.layer_types[i])
    for _ in range(list(insert_after).count(i)):
      layers.append(identity_copy(params[f"layer_{i}"]))
      types.append(config.layer_types[i])
  grown = {k: v for k, v in params.items() if not k.startswith("layer_")}
  grown.update({f"layer_{j}": layer for j, layer in enumerate(layers)})
  return config.replace(num_layers=len(layers), layer_types=tuple(types)), grown
