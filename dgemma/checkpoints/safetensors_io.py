"""Reading and writing .safetensors files as numpy arrays, bfloat16 included.

The format is an 8-byte header length, a JSON header ({name: {dtype, shape, data_offsets}}) and raw
little-endian bytes. Reading memory-maps the file, so a tensor costs memory only when it is used: a 26B
checkpoint is imported tensor by tensor without a second full copy.
"""

from __future__ import annotations

import json
import math
import os
import struct
from typing import Iterator

import ml_dtypes
import numpy as np

_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(bool),
}
_NAMES = {v: k for k, v in _DTYPES.items()}


class SafetensorsFile:
  """Lazy, memory-mapped view of one .safetensors file."""

  def __init__(self, path: str):
    self.path = path
    try:
      with open(path, "rb") as f:
        (header_len,) = struct.unpack("<Q", f.read(8))
        self.header = json.loads(f.read(header_len))
    except (OSError, struct.error, json.JSONDecodeError, UnicodeDecodeError) as e:
      raise ValueError(f"{path} is not a readable safetensors file ({e})") from None
    self.header.pop("__metadata__", None)
    self._data_start = 8 + header_len
    self._mmap = np.memmap(path, dtype=np.uint8, mode="r")

  def keys(self) -> list[str]:
    return list(self.header)

  def shape(self, name: str) -> tuple[int, ...]:
    return tuple(self.header[name]["shape"])

  def get(self, name: str) -> np.ndarray:
    info = self.header[name]
    if info["dtype"] not in _DTYPES:
      raise ValueError(f"{self.path}: tensor {name} has unsupported dtype {info['dtype']}")
    start, end = info["data_offsets"]
    raw = self._mmap[self._data_start + start:self._data_start + end]
    expected = math.prod(info["shape"]) * np.dtype(_DTYPES[info["dtype"]]).itemsize
    if raw.nbytes != expected or end - start != expected:  # a truncated file, or a header that lies
      raise ValueError(f"{self.path}: tensor {name} has {raw.nbytes} bytes of data, {expected} expected for shape "
                       f"{tuple(info['shape'])} (a truncated or damaged file)")
    return raw.view(_DTYPES[info["dtype"]]).reshape(info["shape"])


def save(path: str, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
  """Writes `tensors` to `path` atomically (temporary file, then rename)."""
  header: dict = {"__metadata__": metadata or {"format": "pt"}}
  offset = 0
  arrays = {}
  for name, value in tensors.items():
    arr = np.ascontiguousarray(value)
    if arr.dtype not in _NAMES:
      raise ValueError(f"cannot store tensor {name} of dtype {arr.dtype}")
    header[name] = {"dtype": _NAMES[arr.dtype], "shape": list(arr.shape),
                    "data_offsets": [offset, offset + arr.nbytes]}
    offset += arr.nbytes
    arrays[name] = arr
  blob = json.dumps(header, separators=(",", ":")).encode()
  blob += b" " * (-len(blob) % 8)  # align the data section
  tmp = path + ".tmp"
  with open(tmp, "wb") as f:
    f.write(struct.pack("<Q", len(blob)))
    f.write(blob)
    for arr in arrays.values():
      f.write(arr.tobytes())
  os.replace(tmp, path)


INDEX_FILE = "model.safetensors.index.json"


def open_directory(path: str) -> Iterator[SafetensorsFile]:
  """The weight files of a checkpoint directory: those its index names (HF's sharded layout), else every
  .safetensors file in it."""
  index = os.path.join(path, INDEX_FILE)
  if os.path.exists(index):
    try:
      with open(index) as f:
        files = sorted(set(json.load(f)["weight_map"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as e:
      raise ValueError(f"{index}: not a safetensors index ({type(e).__name__}: {e})") from None
    missing = [n for n in files if not os.path.exists(os.path.join(path, n))]
    if missing:
      raise FileNotFoundError(f"{index} names {missing[0]}, which is not in {path}")
  else:
    files = sorted(n for n in os.listdir(path) if n.endswith(".safetensors"))
  if not files:
    raise FileNotFoundError(f"no .safetensors files in {path}")
  for name in files:
    yield SafetensorsFile(os.path.join(path, name))
