"""The model configuration: one frozen dataclass that describes the whole text backbone.

It is hashable, so jitted functions take it as a static argument. Presets live at the bottom; an HF
`config.json` converts with `ModelConfig.from_hf`.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

LOCAL = "local"  # sliding-window attention layer
GLOBAL = "global"  # full attention layer
MOE_IMPLS = ("xla", "dense", "pallas")  # see ModelConfig.moe_impl
ATTENTION_IMPLS = ("xla", "pallas")  # see ModelConfig.attention_impl
ATTENTION_MODES = ("encode", "denoise")  # the model's two passes (training runs both)


def parse_attention_impl(spec: str) -> dict[tuple[str, str], str]:
  """ModelConfig.attention_impl -> {(mode, kind): impl} for every mode and layer kind.

  `spec` is one implementation for every layer ("xla", "pallas"), or comma-separated `selector=impl` entries,
  the selector being a layer kind ("local", "global"), a mode ("encode", "denoise") or both ("denoise.global").
  The most specific entry wins (mode.kind, then kind, then mode); what no entry covers is "xla".
  """
  if not isinstance(spec, str) or not spec:
    raise ValueError(f"attention_impl must be a non-empty string, got {spec!r}")
  if "=" not in spec:
    if spec not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl must be 'xla', 'pallas' or 'selector=impl,...', got {spec!r}")
    return {(m, k): spec for m in ATTENTION_MODES for k in (LOCAL, GLOBAL)}
  chosen = {}
  for item in spec.split(","):
    selector, _, impl = item.strip().partition("=")
    parts = selector.split(".")
    valid = (len(parts) == 1 and parts[0] in ATTENTION_MODES + (LOCAL, GLOBAL)) or (
        len(parts) == 2 and parts[0] in ATTENTION_MODES and parts[1] in (LOCAL, GLOBAL))
    if not valid:
      raise ValueError(f"attention_impl entry {item!r}: the selector must be local, global, encode, denoise or "
                       "mode.kind (e.g. denoise.global)")
    if impl not in ATTENTION_IMPLS:
      raise ValueError(f"attention_impl entry {item!r}: the implementation must be 'xla' or 'pallas'")
    if selector in chosen:
      raise ValueError(f"attention_impl names {selector!r} twice")
    chosen[selector] = impl
  return {(m, k): chosen.get(f"{m}.{k}", chosen.get(k, chosen.get(m, "xla")))
          for m in ATTENTION_MODES for k in (LOCAL, GLOBAL)}


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """DiffusionGemma text backbone. Field names say what they are; HF names are in `from_hf`."""

  vocab_size: int
  width: int  # model width D
  num_layers: int
  num_heads: int  # query heads, all layers
  local_num_kv_heads: int
  local_head_dim: int
  global_num_kv_heads: int
  global_head_dim: int
  mlp_hidden: int  # dense ("shared") GeGLU branch; also the self-conditioning hidden width
  num_experts: int  # 0: no MoE branch
  top_k_experts: int
  expert_hidden: int
  sliding_window: int  # W: a local-layer token sees W tokens including itself
  layer_types: tuple[str, ...]  # LOCAL or GLOBAL per layer
  global_k_eq_v: bool = True  # global layers take V from the raw K projection
  local_rope_theta: float = 10_000.0
  local_rope_fraction: float = 1.0
  global_rope_theta: float = 1_000_000.0
  global_rope_fraction: float = 0.25  # "proportional" RoPE: only this fraction of frequencies rotate
  final_softcap: float | None = 30.0
  rms_norm_eps: float = 1e-6
  canvas_length: int = 256
  param_dtype: str = "float32"  # "bfloat16" for real checkpoints
  # "bfloat16": the weight matmuls (attention q/k/v/o, the GeGLUs, the tied (un)embedding, the dense experts)
  # multiply bfloat16 copies of their operands with float32 accumulation, in the forward and the backward
  # pass (layers.mixed_matmul); attention scores, norms, softmaxes, residuals and the weights stay in
  # param_dtype. Mixed precision for CPUs and GPUs with fast bf16 dots. "": plain matmuls in param_dtype.
  matmul_dtype: str = ""
  pad_id: int = 0
  eos_id: int = 1
  bos_id: int = 2
  stop_ids: tuple[int, ...] = (1, 106, 50)
  # "xla", "pallas", or per mode / layer kind, e.g. "local=pallas,global=xla" (parse_attention_impl)
  attention_impl: str = "xla"
  # "xla" (lax.ragged_dot), "dense" (every expert, for CPU sampling) or "pallas". Whatever the choice, few
  # tokens (2·tokens·top_k <= num_experts, e.g. AR decoding) take layers.experts_gather: only the routed experts.
  moe_impl: str = "xla"
  remat: bool = False  # gradient checkpointing of every block
  # > 0: a learned table of this many position rows is added to the token embedding (row p at position p, or
  # the rows a position's features name). Not part of Gemma (0 there); it helps small models trained from
  # scratch on structured inputs (e.g. grids).
  learned_positions: int = 0
  # F > 0: positions are described by F features supplied by the task, e.g. segment ids and per-position feature
  # rows (on a grid: segment + row + column + box, so that an input cell and the output cell it fixes share
  # rows). They come as an int table [L, F] of ids into the learned rows (position p: row p; positions past L:
  # the last row), which travels with the weights (the checkpoint's metadata["position_features"]) and reaches
  # the model as an array argument (`position_features=` of encode / denoise): a table here would be part of
  # this hashed, jit-static config. A position's embedding is the sum of the rows its features name.
  num_position_features: int = 0
  # Needs num_position_features. A learned attention-logit bias per layer, head and position feature, added to
  # every (query, key) pair whose positions share that feature, in the spirit of T5's relative-position bias.
  # Zero at init (the plain model); not Gemma.
  relation_bias: bool = False
  # Switches for Gemma 3 backbones (imported from GGUF, dgemma/checkpoints/gguf.py); the defaults are Gemma 4's.
  # Gemma 3 scales queries by query_pre_attn_scalar**-0.5 where Gemma 4 uses 1.0, and has no V-norm.
  query_scale: float = 1.0
  value_norm: bool = True

  def __post_init__(self):
    if len(self.layer_types) != self.num_layers:
      raise ValueError(f"layer_types has {len(self.layer_types)} entries but num_layers={self.num_layers}")
    bad = sorted(set(self.layer_types) - {LOCAL, GLOBAL})
    if bad:
      raise ValueError(f"unknown layer type(s) {bad}; expected {LOCAL!r} or {GLOBAL!r}")
    for kind in (LOCAL, GLOBAL):
      if self.num_heads % self.num_kv_heads(kind):
        raise ValueError(f"num_heads={self.num_heads} is not a multiple of the {kind} KV heads")
    if self.num_experts and not 0 < self.top_k_experts <= self.num_experts:
      raise ValueError(f"top_k_experts={self.top_k_experts} must be in [1, num_experts={self.num_experts}]")
    parse_attention_impl(self.attention_impl)
    if self.moe_impl not in MOE_IMPLS:
      raise ValueError(f"moe_impl must be 'xla', 'dense' or 'pallas', got {self.moe_impl!r}")
    if self.param_dtype not in ("float32", "bfloat16", "float16"):
      raise ValueError(f"param_dtype must be float32, bfloat16 or float16, got {self.param_dtype!r}")
    if self.matmul_dtype not in ("", "bfloat16"):
      raise ValueError(f"matmul_dtype must be '' (the parameter dtype) or 'bfloat16', got {self.matmul_dtype!r}")
    if isinstance(self.num_position_features, bool) or not isinstance(self.num_position_features, int) \
        or self.num_position_features < 0:
      raise ValueError(f"num_position_features must be an integer >= 0, got {self.num_position_features!r}")
    if self.num_position_features and not self.learned_positions:
      raise ValueError("num_position_features needs learned_positions > 0 (the rows the features name)")
    if self.relation_bias and not self.num_position_features:
      raise ValueError("relation_bias needs num_position_features > 0 (the relations are equalities of features)")
    if self.relation_bias and "pallas" in parse_attention_impl(self.attention_impl).values():
      raise ValueError("relation_bias is implemented for attention_impl='xla' only")
    if not self.query_scale > 0:
      raise ValueError(f"query_scale must be > 0, got {self.query_scale!r}")

  # Per-layer-type views, so the layers never branch on names.
  def num_kv_heads(self, kind: str) -> int:
    return self.local_num_kv_heads if kind == LOCAL else self.global_num_kv_heads

  def head_dim(self, kind: str) -> int:
    return self.local_head_dim if kind == LOCAL else self.global_head_dim

  def rope(self, kind: str) -> tuple[float, float]:
    if kind == LOCAL:
      return self.local_rope_theta, self.local_rope_fraction
    return self.global_rope_theta, self.global_rope_fraction

  def attention_for(self, kind: str, mode: str) -> str:
    """The attention implementation of layers of this kind in this mode ("encode" or "denoise")."""
    return parse_attention_impl(self.attention_impl)[(mode, kind)]

  def has_v_proj(self, kind: str) -> bool:
    return kind == LOCAL or not self.global_k_eq_v

  def replace(self, **changes: Any) -> "ModelConfig":
    return dataclasses.replace(self, **changes)

  # ---------------------------------------------------------------------------------------------
  # Hugging Face config.json
  # ---------------------------------------------------------------------------------------------
  @classmethod
  def from_hf(cls, hf: dict[str, Any] | str | os.PathLike, **overrides: Any) -> "ModelConfig":
    """Builds the config from an HF DiffusionGemma `config.json` (a dict, a file, or its directory)."""
    if not isinstance(hf, dict):
      path = os.path.join(hf, "config.json") if os.path.isdir(hf) else hf
      if not os.path.exists(path):
        raise FileNotFoundError(f"no config.json at {path}")
      with open(path) as f:
        hf = json.load(f)
    arch = hf.get("model_type")
    if arch != "diffusion_gemma":
      raise ValueError(f"unsupported architecture model_type={arch!r}; expected 'diffusion_gemma'")
    t = hf["text_config"]
    n = t["num_hidden_layers"]
    hf_types = t.get("layer_types") or [
        "sliding_attention" if (i + 1) % 6 else "full_attention" for i in range(n)]
    hf_types = list(hf_types)
    hf_types[-1] = "full_attention"  # HF forces the last layer global
    types = tuple(LOCAL if x == "sliding_attention" else GLOBAL for x in hf_types)
    # Global-layer head dim / KV heads live in per_layer_config (all global layers share them).
    per_layer = t.get("per_layer_config") or {}
    global_idx = [i for i, k in enumerate(types) if k == GLOBAL]
    g = per_layer.get(str(global_idx[0]), per_layer.get(global_idx[0], {})) if global_idx else {}
    rope = t.get("rope_parameters") or {}
    local_rope = rope.get("sliding_attention", {"rope_theta": 10_000.0})
    global_rope = rope.get("full_attention", {"rope_theta": 1e6, "partial_rotary_factor": 0.25})
    for name, r in (("sliding_attention", local_rope), ("full_attention", global_rope)):
      if r.get("factor", 1.0) != 1.0:
        raise ValueError(f"unsupported RoPE scaling factor {r['factor']} for {name}")
    if local_rope.get("rope_type", "default") != "default":
      raise ValueError(f"unsupported local rope_type {local_rope.get('rope_type')!r}")
    if global_rope.get("rope_type", "proportional") != "proportional":
      raise ValueError(f"unsupported global rope_type {global_rope.get('rope_type')!r}")
    if t.get("use_bidirectional_attention") == "all":
      raise ValueError("use_bidirectional_attention='all' is not supported (text encoder must be causal)")
    if t.get("hidden_activation", "gelu_pytorch_tanh") != "gelu_pytorch_tanh":
      raise ValueError(f"unsupported activation {t.get('hidden_activation')!r}")
    eos = hf.get("eos_token_id", t.get("eos_token_id", 1))
    eos_first = eos[0] if isinstance(eos, list) else eos
    dtype = hf.get("dtype") or hf.get("torch_dtype") or "float32"
    fields = dict(
        vocab_size=t["vocab_size"],
        width=t["hidden_size"],
        num_layers=n,
        num_heads=t["num_attention_heads"],
        local_num_kv_heads=t["num_key_value_heads"],
        local_head_dim=t["head_dim"],
        global_num_kv_heads=g.get("num_key_value_heads", t["num_key_value_heads"]),
        global_head_dim=g.get("head_dim", t["head_dim"]),
        mlp_hidden=t["intermediate_size"],
        num_experts=t.get("num_experts") or 0,
        top_k_experts=t.get("top_k_experts") or 0,
        expert_hidden=t.get("moe_intermediate_size") or 0,
        sliding_window=t["sliding_window"],
        layer_types=types,
        global_k_eq_v=True,
        local_rope_theta=float(local_rope["rope_theta"]),
        local_rope_fraction=float(local_rope.get("partial_rotary_factor", 1.0)),
        global_rope_theta=float(global_rope["rope_theta"]),
        global_rope_fraction=float(global_rope.get("partial_rotary_factor", 1.0)),
        final_softcap=t.get("final_logit_softcapping", 30.0),
        rms_norm_eps=t.get("rms_norm_eps", 1e-6),
        canvas_length=hf.get("canvas_length", 256),
        param_dtype=dtype if dtype in ("float32", "bfloat16", "float16") else "float32",
        pad_id=t.get("pad_token_id", 0) if t.get("pad_token_id") is not None else 0,
        eos_id=eos_first,
        bos_id=t.get("bos_token_id", 2),
    )
    fields.update(overrides)
    return cls(**fields)

  def to_hf(self) -> dict[str, Any]:
    """The HF `config.json` dict for this model (text part; vision config kept minimal)."""
    if self.learned_positions:
      raise ValueError("HF DiffusionGemma has no learned position embedding; learned_positions must be 0 to export")
    if not self.global_k_eq_v:
      raise ValueError("HF DiffusionGemma has no V projection on global layers; global_k_eq_v must be True")
    if self.num_experts == 0:
      raise ValueError("HF DiffusionGemma always has the MoE branch; num_experts must be > 0 to export")
    if self.layer_types[-1] != GLOBAL:
      raise ValueError("HF DiffusionGemma's last layer is always global (full attention); layer_types ends with "
                       f"{self.layer_types[-1]!r}, so this model cannot be exported")
    if self.local_rope_fraction != 1.0:
      raise ValueError("HF default RoPE on local layers needs local_rope_fraction=1.0")
    if self.query_scale != 1.0 or not self.value_norm:
      raise ValueError("HF DiffusionGemma has query scale 1.0 and a V-norm; a Gemma 3 backbone (query_scale, "
                       "value_norm=False) cannot be exported to it")
    types = ["sliding_attention" if k == LOCAL else "full_attention" for k in self.layer_types]
    per_layer = {str(i): {"head_dim": self.global_head_dim, "num_key_value_heads": self.global_num_kv_heads}
                 for i, k in enumerate(self.layer_types) if k == GLOBAL}
    text = {
        "model_type": "diffusion_gemma_text",
        "vocab_size": self.vocab_size,
        "hidden_size": self.width,
        "intermediate_size": self.mlp_hidden,
        "num_hidden_layers": self.num_layers,
        "num_attention_heads": self.num_heads,
        "num_key_value_heads": self.local_num_kv_heads,
        "head_dim": self.local_head_dim,
        "per_layer_config": per_layer,
        "hidden_activation": "gelu_pytorch_tanh",
        "rms_norm_eps": self.rms_norm_eps,
        "sliding_window": self.sliding_window,
        "layer_types": types,
        "final_logit_softcapping": self.final_softcap,
        "num_experts": self.num_experts,
        "top_k_experts": self.top_k_experts,
        "moe_intermediate_size": self.expert_hidden,
        "rope_parameters": {
            "sliding_attention": {"rope_type": "default", "rope_theta": self.local_rope_theta},
            "full_attention": {"rope_type": "proportional", "rope_theta": self.global_rope_theta,
                               "partial_rotary_factor": self.global_rope_fraction},
        },
        "tie_word_embeddings": True,
        "pad_token_id": self.pad_id,
        "eos_token_id": self.eos_id,
        "bos_token_id": self.bos_id,
        "attention_bias": False,
        "attention_dropout": 0.0,
        "max_position_embeddings": 262_144,
        "use_bidirectional_attention": None,
    }
    return {
        "architectures": ["DiffusionGemmaForBlockDiffusion"],
        "model_type": "diffusion_gemma",
        "text_config": text,
        "vision_config": TINY_HF_VISION_CONFIG,
        "canvas_length": self.canvas_length,
        "tie_word_embeddings": True,
        "dtype": self.param_dtype,
    }


# HF builds a vision tower whatever the text model; a tiny one keeps exported checkpoints small.
# Our import ignores vision weights entirely.
TINY_HF_VISION_CONFIG = {
    "model_type": "gemma4_vision", "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 1,
    "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 8, "patch_size": 4,
    "pooling_kernel_size": 2, "position_embedding_size": 64,
}


def _pattern(num_layers: int, period: int = 6, last_global: bool = True) -> tuple[str, ...]:
  """(period-1) local layers then one global. Gemma 4 forces the last layer global; Gemma 3 does not."""
  types = [LOCAL if (i + 1) % period else GLOBAL for i in range(num_layers)]
  if last_global:
    types[-1] = GLOBAL
  return tuple(types)


def diffusiongemma_26b_a4b(**overrides: Any) -> ModelConfig:
  """The released 26B-A4B model (spec §1.1)."""
  fields = dict(
      vocab_size=262_144, width=2816, num_layers=30, num_heads=16,
      local_num_kv_heads=8, local_head_dim=256, global_num_kv_heads=2, global_head_dim=512,
      mlp_hidden=2112, num_experts=128, top_k_experts=8, expert_hidden=704,
      sliding_window=1024, layer_types=_pattern(30), param_dtype="bfloat16")
  fields.update(overrides)
  return ModelConfig(**fields)


def tiny_moe(**overrides: Any) -> ModelConfig:
  """A few-thousand-parameter model with every feature of the real one, for tests."""
  fields = dict(
      vocab_size=64, width=32, num_layers=4, num_heads=4,
      local_num_kv_heads=2, local_head_dim=8, global_num_kv_heads=1, global_head_dim=16,
      mlp_hidden=48, num_experts=4, top_k_experts=2, expert_hidden=12,
      sliding_window=4, layer_types=(LOCAL, GLOBAL, LOCAL, GLOBAL), canvas_length=8)
  fields.update(overrides)
  return ModelConfig(**fields)


def small_dense(vocab_size: int, width: int = 128, num_layers: int = 6, num_heads: int = 4,
                canvas_length: int = 81, **overrides: Any) -> ModelConfig:
  """A small dense (no MoE) model for CPU training from scratch, e.g. a task with a small vocabulary of its own."""
  head_dim = width // num_heads
  fields = dict(
      vocab_size=vocab_size, width=width, num_layers=num_layers, num_heads=num_heads,
      local_num_kv_heads=num_heads, local_head_dim=head_dim,
      global_num_kv_heads=num_heads, global_head_dim=head_dim,
      mlp_hidden=4 * width, num_experts=0, top_k_experts=0, expert_hidden=0,
      sliding_window=1024, layer_types=(GLOBAL,) * num_layers, global_rope_fraction=1.0,
      global_rope_theta=10_000.0, canvas_length=canvas_length)
  fields.update(overrides)
  return ModelConfig(**fields)


def gemma3_270m(**overrides: Any) -> ModelConfig:
  """Gemma 3 270M's backbone, as the GGUF import builds it (weights: `checkpoints.load_gguf`).

  Versus Gemma 4: a dense MLP only, one KV head and head dim 256 on every layer with a separate V projection,
  plain RoPE (10k local, 1M global, no scaling), window 512, queries scaled by query_pre_attn_scalar**-0.5
  = 256**-0.5, no V-norm, no final softcap. Gemma 3's RMSNorm multiplies by (1 + w); GGUF files store 1 + w,
  which is our plain scale, and Gemma 3 has no layer scalar (ours stays at 1.0).
  """
  fields = dict(
      vocab_size=262_144, width=640, num_layers=18, num_heads=4,
      local_num_kv_heads=1, local_head_dim=256, global_num_kv_heads=1, global_head_dim=256,
      mlp_hidden=2048, num_experts=0, top_k_experts=0, expert_hidden=0,
      sliding_window=512, layer_types=_pattern(18, last_global=False), global_k_eq_v=False,
      global_rope_fraction=1.0, final_softcap=None, query_scale=256 ** -0.5, value_norm=False,
      stop_ids=(1, 106))  # <eos>, <end_of_turn>
  fields.update(overrides)
  return ModelConfig(**fields)


PRESETS = {  # the model presets a training config names (`config.model_preset`), with keyword overrides
    "diffusiongemma_26b_a4b": diffusiongemma_26b_a4b,
    "tiny_moe": tiny_moe,
    "small_dense": small_dense,
    "gemma3_270m": gemma3_270m,
}


def from_preset(preset: str, overrides: dict) -> ModelConfig:
  """PRESETS[preset](**overrides); an unknown preset or override is a one-line ValueError."""
  if preset not in PRESETS:
    raise ValueError(f"unknown model preset {preset!r}; choose from {sorted(PRESETS)}")
  try:
    return PRESETS[preset](**overrides)
  except TypeError as e:
    raise ValueError(f"bad model override for preset {preset!r}: {e}") from None
