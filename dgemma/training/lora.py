"""LoRA as in the official recipe: W x + x·A·B on attention, dense-MLP, router and self-conditioning
weights (never the MoE experts, the embedding or the norms). A is Kaiming-uniform, B zero, no alpha scaling,
so training starts exactly at the base model. The model itself knows nothing of LoRA: `merge` returns
W + A·B for the adapted leaves and the forward pass runs on the merged tree.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

# Parameter names (last path element, with its parent) that LoRA adapts.
_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
_GEGLU = ("gate", "up", "down")


def _is_target(path: tuple[str, ...]) -> bool:
  *parents, name = path
  parent = parents[-1] if parents else ""
  return (parent == "attn" and name in _ATTENTION) or (parent == "mlp" and name in _GEGLU) or (
      parent == "moe" and name == "router")


def _input_rank(path: tuple[str, ...]) -> int:
  """How many leading axes of the weight are its input (o_proj is [heads, head_dim, width])."""
  return 2 if path[-1] == "o_proj" else 1


def _paths(params: dict):
  for path, leaf in jax.tree_util.tree_flatten_with_path(params)[0]:
    yield tuple(p.key for p in path), leaf


def init(params: dict, rank: int, rng: jax.Array) -> dict:
  """LoRA parameters {'/'-joined path: {'a': [in, r], 'b': [r, out]}} in float32."""
  lora = {}
  targets = [(p, w) for p, w in _paths(params) if _is_target(p)]
  for (path, w), key in zip(targets, jax.random.split(rng, max(len(targets), 1))):
    k = _input_rank(path)
    fan_in, fan_out = math.prod(w.shape[:k]), math.prod(w.shape[k:])
    bound = 1.0 / math.sqrt(fan_in)  # Kaiming-uniform with a = sqrt(5), as torch's nn.Linear
    lora["/".join(path)] = {
        "a": jax.random.uniform(key, (fan_in, rank), jnp.float32, -bound, bound),
        "b": jnp.zeros((rank, fan_out), jnp.float32),
    }
  if not lora:
    raise ValueError("LoRA found no target weights in the parameter tree")
  return lora


def merge(params: dict, lora: dict) -> dict:
  """params with W + A·B at every adapted leaf (cast to W's dtype)."""
  def one(path, w):
    name = "/".join(p.key for p in path)
    if name not in lora:
      return w
    delta = (lora[name]["a"] @ lora[name]["b"]).reshape(w.shape)
    return (w.astype(jnp.float32) + delta).astype(w.dtype)
  return jax.tree_util.tree_map_with_path(one, params)
