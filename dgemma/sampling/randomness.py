"""Per-row randomness of the samplers: every batch row draws from its own key, so that a row's result does not
depend on the rest of its batch."""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Int


def row_keys(rng: jax.Array, batch: int) -> jax.Array:
  """Per-row keys: a single key gives fold_in(rng, row), so row b's draws do not depend on the batch size;
  an array of `batch` keys is used as is. (Traced inside the jitted samplers, where it costs no dispatch.)"""
  check_rng(rng, batch)
  key = rng if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else jax.random.wrap_key_data(rng)
  if key.shape == ():
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch))
  return key


def check_rng(rng: jax.Array, batch: int) -> None:
  """One-line error unless `rng` is one key or `batch` keys (typed, or raw uint32 key data)."""
  typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
  shape = rng.shape if typed else rng.shape[:-1]
  if not typed and (rng.ndim == 0 or rng.dtype != jnp.uint32):
    raise ValueError(f"rng must be a JAX random key (jax.random.key) or raw uint32 key data, got "
                     f"{rng.dtype} of shape {rng.shape}")
  if shape not in ((), (batch,)):
    raise ValueError(f"rng must be one key or {batch} keys (one per row), got key shape {shape}")


def per_row(fn, keys_B, *args):
  """`fn(key, *row_args)` for every row."""
  return jax.vmap(fn)(keys_B, *args)


def split_per_row(keys_B) -> tuple[jax.Array, jax.Array]:
  """Two keys per row, from jax.random.split of the row's key."""
  first, second = jnp.moveaxis(per_row(jax.random.split, keys_B), 1, 0)
  return first, second


def uniform_tokens(keys_B, length: int, vocab_size: int) -> Int[Array, "B L"]:
  """A uniformly random token sequence per row: the starting canvas, and the noise that renoising draws from."""
  return per_row(lambda k: jax.random.randint(k, (length,), 0, vocab_size, jnp.int32), keys_B)
