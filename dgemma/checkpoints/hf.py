"""Hugging Face DiffusionGemma checkpoints (config.json + safetensors) <-> (ModelConfig, params).

HF stores one copy per tie group: `save_pretrained` keeps the decoder's names (`model.decoder.*`) plus the
encoder's `layer_scalar` buffers, which are cloned rather than tied. We read either tower's name and write
what `save_pretrained` writes, so an exported model loads in transformers. Layout changes (spec §7.2):
HF `nn.Linear` weights are [out, in]; ours are einsum-shaped [in, ..., out].
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dgemma.checkpoints import safetensors_io
from dgemma.config import ModelConfig
from dgemma.model import param_shapes

DECODER = "model.decoder"
ENCODER = "model.encoder.language_model"


@dataclasses.dataclass
class Tensor:
  """One parameter: where it lives in our tree, its HF names, and the two layout conversions."""
  path: tuple[str, ...]
  read_names: tuple[str, ...]  # tried in order on import
  write_names: tuple[str, ...]  # all written on export
  to_ours: Callable[[np.ndarray], np.ndarray]
  to_hf: Callable[[np.ndarray], np.ndarray]


def _same(x):
  return x


def _linear(*out_shape: int) -> tuple[Callable, Callable]:
  """HF [out, in] <-> ours [in, *out_shape]."""
  def to_ours(w):
    return w.T.reshape(w.shape[1], *out_shape)
  def to_hf(w):
    return w.reshape(w.shape[0], -1).T
  return to_ours, to_hf


def _linear_in(*in_shape: int) -> tuple[Callable, Callable]:
  """HF [out, in] <-> ours [*in_shape, out] (the attention output projection)."""
  def to_ours(w):
    return w.T.reshape(*in_shape, w.shape[0])
  def to_hf(w):
    return w.reshape(-1, w.shape[-1]).T
  return to_ours, to_hf


def _swap_last_two(w):
  return np.swapaxes(w, -1, -2)


def tensor_map(config: ModelConfig) -> list[Tensor]:
  """Every parameter of `config`'s model with its HF names and layout conversions."""
  entries: list[Tensor] = []

  def add(path, suffix, conv=(_same, _same), towers=(DECODER, ENCODER), write=(DECODER,), extra=()):
    entries.append(Tensor(tuple(path.split("/")), tuple(f"{t}.{suffix}" for t in towers) + extra,
                          tuple(f"{t}.{suffix}" for t in write), *conv))

  add("embedder/embedding", "embed_tokens.weight", extra=("lm_head.weight",))
  add("final_norm/scale", "norm.weight")
  for i, kind in enumerate(config.layer_types):
    n, kv, h, d = config.num_heads, config.num_kv_heads(kind), config.head_dim(kind), config.width
    p, s = f"layer_{i}", f"layers.{i}"
    add(f"{p}/pre_attention_norm/scale", f"{s}.input_layernorm.weight")
    add(f"{p}/attn/q_proj", f"{s}.self_attn.q_proj.weight", _linear(n, h))
    add(f"{p}/attn/k_proj", f"{s}.self_attn.k_proj.weight", _linear(kv, h))
    if config.has_v_proj(kind):
      add(f"{p}/attn/v_proj", f"{s}.self_attn.v_proj.weight", _linear(kv, h))
    add(f"{p}/attn/o_proj", f"{s}.self_attn.o_proj.weight", _linear_in(n, h))
    add(f"{p}/attn/q_norm/scale", f"{s}.self_attn.q_norm.weight")
    add(f"{p}/attn/k_norm/scale", f"{s}.self_attn.k_norm.weight")
    add(f"{p}/post_attention_norm/scale", f"{s}.post_attention_layernorm.weight")
    add(f"{p}/pre_mlp_norm/scale", f"{s}.pre_feedforward_layernorm.weight")
    add(f"{p}/mlp/gate", f"{s}.mlp.gate_proj.weight", _linear(config.mlp_hidden))
    add(f"{p}/mlp/up", f"{s}.mlp.up_proj.weight", _linear(config.mlp_hidden))
    add(f"{p}/mlp/down", f"{s}.mlp.down_proj.weight", _linear(d))
    if config.num_experts:
      add(f"{p}/post_mlp_norm/scale", f"{s}.post_feedforward_layernorm_1.weight")
      add(f"{p}/pre_moe_norm/scale", f"{s}.pre_feedforward_layernorm_2.weight")
      add(f"{p}/moe/router", f"{s}.router.proj.weight", _linear(config.num_experts))
      add(f"{p}/moe/router_scale", f"{s}.router.scale")
      add(f"{p}/moe/per_expert_scale", f"{s}.router.per_expert_scale")
      add(f"{p}/moe/gate_up", f"{s}.experts.gate_up_proj", (_swap_last_two, _swap_last_two))
      add(f"{p}/moe/down", f"{s}.experts.down_proj", (_swap_last_two, _swap_last_two))
      add(f"{p}/post_moe_norm/scale", f"{s}.post_feedforward_layernorm_2.weight")
    add(f"{p}/post_ffw_norm/scale", f"{s}.post_feedforward_layernorm.weight")
    # A buffer cloned (not tied) per tower: both copies are written; the encoder's is read first.
    add(f"{p}/layer_scalar", f"{s}.layer_scalar", towers=(ENCODER, DECODER), write=(ENCODER, DECODER))
  sc = "self_conditioning"
  add(f"{sc}/pre_norm/scale", f"{sc}.pre_norm.weight", towers=(DECODER,))
  add(f"{sc}/mlp/gate", f"{sc}.gate_proj.weight", _linear(config.mlp_hidden), towers=(DECODER,))
  add(f"{sc}/mlp/up", f"{sc}.up_proj.weight", _linear(config.mlp_hidden), towers=(DECODER,))
  add(f"{sc}/mlp/down", f"{sc}.down_proj.weight", _linear(config.width), towers=(DECODER,))
  return entries


def _set(tree: dict, path: tuple[str, ...], value) -> None:
  for key in path[:-1]:
    tree = tree.setdefault(key, {})
  tree[path[-1]] = value


def _get(tree: dict, path: tuple[str, ...]):
  for key in path:
    tree = tree[key]
  return tree


GENERATION_CONFIG = "generation_config.json"
# HF generate's knobs in generation_config.json that are SamplerConfig knobs of the same name and meaning (the
# entropy bound sits in its "sampler_config"), with the types HF's validation wants (it refuses an integer
# confidence threshold). HF's generation config refuses any other key.
_GENERATION_KNOBS = dict(max_denoising_steps=int, t_max=float, t_min=float, stability_threshold=int,
                         confidence_threshold=float)


def generation_defaults(path: str) -> tuple[tuple[int, ...] | None, dict]:
  """What an HF directory's generation_config.json tells HF `generate`: (its stop ids, from eos_token_id; None if
  unset) and {SamplerConfig knob: value} for the knobs it sets. No file, or null values: nothing."""
  file = os.path.join(path, GENERATION_CONFIG)
  if not os.path.isfile(file):
    return None, {}
  try:
    with open(file) as f:
      gen = json.load(f)
  except (OSError, ValueError) as e:
    raise ValueError(f"{file}: not readable JSON ({e})") from None
  if not isinstance(gen, dict):
    raise ValueError(f"{file}: expected a JSON object")
  knobs = {k: gen[k] for k in _GENERATION_KNOBS if gen.get(k) is not None}
  sampler = gen.get("sampler_config")
  if isinstance(sampler, dict) and sampler.get("entropy_bound") is not None:
    knobs["entropy_bound"] = sampler["entropy_bound"]
  eos = gen.get("eos_token_id")
  if eos is None:
    return None, knobs
  ids = eos if isinstance(eos, list) else [eos]
  if not all(isinstance(t, int) and not isinstance(t, bool) for t in ids):
    raise ValueError(f"{file}: eos_token_id must be a token id or a list of them, got {eos!r}")
  return tuple(ids), knobs


def load_hf(path: str, **config_overrides) -> tuple[ModelConfig, dict]:
  """Imports an HF DiffusionGemma directory. Returns (config, params) with params on the default device.

  Tensors are converted one at a time from memory-mapped files. `config_overrides` change config fields,
  e.g. `param_dtype="float32"` to upcast a bf16 checkpoint. The stop ids are generation_config.json's
  eos_token_id where it sets one (HF generate stops on those), else the model config's default.
  """
  if not os.path.isdir(path):
    raise FileNotFoundError(f"checkpoint directory {path} does not exist")
  stop_ids, _ = generation_defaults(path)
  if stop_ids is not None and "stop_ids" not in config_overrides:
    config_overrides = dict(config_overrides, stop_ids=stop_ids)
  config = ModelConfig.from_hf(path, **config_overrides)
  shapes = param_shapes(config)
  dtype = jnp.dtype(config.param_dtype)
  where: dict[str, safetensors_io.SafetensorsFile] = {}
  for f in safetensors_io.open_directory(path):
    for name in f.keys():
      where[name] = f
  params: dict = {}
  for t in tensor_map(config):
    name = next((n for n in t.read_names if n in where), None)
    if name is None:
      raise ValueError(f"{path}: missing tensor {t.read_names[0]} (for {'/'.join(t.path)})")
    expected = jax.eval_shape(t.to_hf, _get(shapes, t.path)).shape  # checked before any reshape
    if where[name].shape(name) != expected:
      raise ValueError(f"{path}: tensor {name} has shape {where[name].shape(name)}, which does not match the "
                       f"config (expected {expected})")
    _set(params, t.path, jnp.asarray(t.to_ours(where[name].get(name)), dtype=dtype))
  return config, params


def save_hf(path: str, config: ModelConfig, params: dict, max_shard_bytes: int = 4 << 30,
            sampler: dict | None = None) -> None:
  """Exports (config, params) as an HF DiffusionGemma directory that transformers loads.

  generation_config.json gets the stop ids (as eos_token_id) and, from `sampler` ({SamplerConfig knob: value},
  e.g. a checkpoint's recorded defaults), the knobs HF's generate has; the others (schedule, restarts, adaptive
  stopping) have no HF counterpart and are left out.
  """
  hf_config = config.to_hf()  # (first: a model HF cannot hold fails before anything is written)
  os.makedirs(path, exist_ok=True)
  for name in os.listdir(path):  # an earlier export's weight files would be read with these (open_directory)
    if name.endswith(".safetensors") or name == safetensors_io.INDEX_FILE:
      os.remove(os.path.join(path, name))
  shards: list[dict[str, np.ndarray]] = [{}]
  size = 0
  for t in tensor_map(config):
    value = t.to_hf(np.asarray(jax.device_get(_get(params, t.path))))
    for name in t.write_names:
      if size + value.nbytes > max_shard_bytes and shards[-1]:
        shards.append({})
        size = 0
      shards[-1][name] = value
      size += value.nbytes
  weight_map = {}
  for k, shard in enumerate(shards):
    fname = ("model.safetensors" if len(shards) == 1
             else f"model-{k + 1:05d}-of-{len(shards):05d}.safetensors")
    safetensors_io.save(os.path.join(path, fname), shard)
    weight_map.update({name: fname for name in shard})
  if len(shards) > 1:
    _write_json(os.path.join(path, safetensors_io.INDEX_FILE), {"metadata": {}, "weight_map": weight_map})
  _write_json(os.path.join(path, "config.json"), hf_config)
  generation = {k: _GENERATION_KNOBS[k](v) for k, v in (sampler or {}).items() if k in _GENERATION_KNOBS}
  if (sampler or {}).get("entropy_bound") is not None:
    # (HF stores its sampler config as a dataclass named by "_cls_name".)
    generation["sampler_config"] = {"_cls_name": "EntropyBoundSamplerConfig",
                                    "entropy_bound": float(sampler["entropy_bound"])}
  _write_json(os.path.join(path, GENERATION_CONFIG), {**generation, "eos_token_id": list(config.stop_ids)})


def _write_json(path: str, obj) -> None:
  tmp = path + ".tmp"
  with open(tmp, "w") as f:
    json.dump(obj, f, indent=2)
  os.replace(tmp, path)
