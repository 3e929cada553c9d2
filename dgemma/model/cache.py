"""The KV cache: a fixed-shape pytree, so encode and denoise jit once and run inside `lax` loops.

Slot s of row b holds the token at position s (positions are slot indices, as in Hugging Face: a right-padded
prompt keeps its pad slots, which are simply never attended to). Every layer, local ones included, has a
full-length cache; the sliding window is applied by the attention mask.
"""

from __future__ import annotations

import flax.struct
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from dgemma.config import ModelConfig


@flax.struct.dataclass
class KVCache:
  keys: tuple[Array, ...]  # per layer [B, S, K, H]: after k-norm and RoPE
  values: tuple[Array, ...]  # per layer [B, S, K, H]: after v-norm
  valid: Bool[Array, "B S"]  # slot holds a real (non-padding) token
  end: Int[Array, "B"]  # slots written so far; the next token goes to slot `end`

  @property
  def batch_size(self) -> int:
    return self.valid.shape[0]

  @property
  def capacity(self) -> int:
    return self.valid.shape[1]

  @property
  def slot_positions(self) -> Int[Array, "B S"]:
    """The position of the token each slot holds: slot s holds position s (the cache is filled in order)."""
    return jnp.broadcast_to(jnp.arange(self.capacity)[None, :], self.valid.shape)

  def prefix(self, length: int) -> "KVCache":
    """A read-only view of its first `length` slots, for attention to read only those: it needs end <= length
    (no token written past the view). Writing through it (`encode`) would lose the slots past `length`."""
    if not 0 < length <= self.capacity:
      raise ValueError(f"a cache prefix needs 0 < length <= {self.capacity} slots, got {length}")
    return KVCache(keys=tuple(k[:, :length] for k in self.keys), values=tuple(v[:, :length] for v in self.values),
                   valid=self.valid[:, :length], end=self.end)

  def with_end(self, end: Int[Array, "B"]) -> "KVCache":
    """The same cache seen as holding only its first `end` slots per row (training picks canvas s so)."""
    return self.replace(end=jnp.asarray(end, jnp.int32))


def init_cache(config: ModelConfig, batch_size: int, max_len: int) -> KVCache:
  """An empty cache for `batch_size` rows of up to `max_len` tokens each."""
  dtype = jnp.dtype(config.param_dtype)
  keys, values = [], []
  for kind in config.layer_types:
    shape = (batch_size, max_len, config.num_kv_heads(kind), config.head_dim(kind))
    keys.append(jnp.zeros(shape, dtype))
    values.append(jnp.zeros(shape, dtype))
  return KVCache(keys=tuple(keys), values=tuple(values),
                 valid=jnp.zeros((batch_size, max_len), bool),
                 end=jnp.zeros((batch_size,), jnp.int32))
