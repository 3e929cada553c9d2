"""Per-token functions of the logits, computed a chunk of tokens at a time: the [N, V] logits of a 262k vocabulary
are never held whole, in the forward pass or the backward.

Each chunk's logits are made from the final-norm hidden states inside a `jax.checkpoint`, so the backward pass
recomputes them chunk by chunk from the hidden states (the residuals it keeps) instead of storing them.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
from jaxtyping import Array


def map_token_chunks(fn: Callable[..., Any], chunk_tokens: int, *per_token: Array) -> Any:
  """fn applied to chunks of `chunk_tokens` rows of the arrays `per_token` (all [N, ...]), outputs concatenated.

  `fn` maps chunks [c, ...] to a pytree of [c, ...] arrays and must treat rows independently. The last chunk is
  padded with copies of the last row (valid inputs: zeros could make a NaN, e.g. a noise level of 0, that the
  backward pass would carry into the weights' gradient), whose outputs are dropped. A chunk larger than N is one
  chunk of N."""
  if chunk_tokens < 1:
    raise ValueError(f"chunk_tokens must be >= 1, got {chunk_tokens}")
  n = per_token[0].shape[0]
  chunk = min(chunk_tokens, n)
  num = -(-n // chunk)
  pad = num * chunk - n
  stacked = [jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1), mode="edge").reshape((num, chunk) + x.shape[1:]) for x in per_token]
  out = jax.lax.map(jax.checkpoint(lambda xs: fn(*xs)), stacked)
  return jax.tree.map(lambda y: y.reshape((num * chunk,) + y.shape[2:])[:n], out)


def flatten_tokens(x_BxLx: Array) -> Array:
  """[B, L, ...] -> [B·L, ...]."""
  return x_BxLx.reshape((-1,) + x_BxLx.shape[2:])
