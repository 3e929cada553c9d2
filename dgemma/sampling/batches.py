"""Many prompts through one compiled sampler, a fixed number of rows at a time (sample.py --batch_size).

Every row draws from its own key, fold_in(key, row) over all the rows, which is what one batch of all of them
would use: a prompt's sample does not depend on the batch size. The last batch is filled up with copies of its
last row (results dropped), so every batch has the shape the sampler was compiled for.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from dgemma.sampling.generate import GenerateOutput


def row_keys(key: jax.Array, num_rows: int) -> jax.Array:
  """[num_rows] keys: fold_in(key, row)."""
  return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(num_rows))


def spans(num_rows: int, batch_size: int) -> list[tuple[int, int]]:
  """(start, stop) of each batch; batch_size 0 (or more than the rows): one batch of all of them."""
  if batch_size < 0:
    raise ValueError(f"--batch_size must be >= 0 (0: all prompts in one batch), got {batch_size}")
  size = num_rows if batch_size == 0 else min(batch_size, num_rows)
  return [(start, min(start + size, num_rows)) for start in range(0, num_rows, size)]


def _fill(x: np.ndarray | jax.Array, size: int):
  missing = size - x.shape[0]
  return x if missing == 0 else jnp.concatenate([x, jnp.repeat(x[-1:], missing, axis=0)]) \
      if isinstance(x, jax.Array) else np.concatenate([x, np.repeat(x[-1:], missing, axis=0)])


def run(sample: Callable[..., GenerateOutput], tokens_RxP: np.ndarray, valid_RxP: np.ndarray, keys_R: jax.Array,
        batch_size: int, to_host: Callable = jax.device_get,
        before_batch: Callable[[int, int], None] | None = None) -> GenerateOutput:
  """`sample(tokens, valid, keys)` over the rows in batches; the outputs of all rows as host arrays.
  `before_batch(start, stop)` is called before each batch runs (e.g. to point a live view at its rows)."""
  parts = []
  batches = spans(tokens_RxP.shape[0], batch_size)
  size = batches[0][1] - batches[0][0]
  for start, stop in batches:
    if before_batch is not None:
      before_batch(start, stop)
    out = to_host(jax.block_until_ready(sample(_fill(tokens_RxP[start:stop], size), _fill(valid_RxP[start:stop], size),
                                               _fill(keys_R[start:stop], size))))
    parts.append(jax.tree.map(lambda x: np.asarray(x)[:stop - start], out))
  return jax.tree.map(lambda *xs: np.concatenate(xs), *parts)
