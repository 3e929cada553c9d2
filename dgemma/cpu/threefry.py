"""JAX's threefry hash as straight-line code on CPU too: the same random bits, a faster denoising step.

On CPU, JAX lowers its threefry2x32 primitive as a rolled loop (5 iterations of 4 rounds, which keeps compile
times short). Inside the sampling loop each rolled hash is a nested XLA while loop whose per-iteration
bookkeeping costs more than the arithmetic (a denoising step hashes three times: the sampling uniforms, and two
for the renoising tokens). Written out, the 20 rounds fuse into one elementwise kernel.

`use_unrolled_threefry_on_cpu` registers that straight-line form as the primitive's CPU lowering. It is the
same function (Threefry-2x32 with 20 rounds, Salmon et al. 2011), so every key, split and draw is
bit-identical: tests/cpu/test_threefry.py checks the published known-answer vectors and equality with JAX's
rolled lowering. On a JAX without these hooks it logs one warning and changes nothing (the same numbers, the
rolled loop). DGEMMA_CPU_THREEFRY=0 in the environment turns it off: JAX's own lowering stays.
"""

from __future__ import annotations

import logging
import os

import jax.numpy as jnp
import numpy as np

_ROTATIONS = ((13, 15, 26, 6), (17, 29, 16, 24))  # alternate between the two every 4 rounds
_PARITY = np.uint32(0x1BD11BDA)
_registered = False
SWITCH = "DGEMMA_CPU_THREEFRY"  # =0: JAX's own (rolled) lowering stays


def _rotate_left(x, r: int):
  return (x << np.uint32(r)) | (x >> np.uint32(32 - r))


def threefry2x32_unrolled(key0, key1, count0, count1):
  """Threefry-2x32-20 of the counter pair (count0, count1) under key (key0, key1), all uint32 arrays."""
  keys = (key0, key1, key0 ^ key1 ^ _PARITY)
  x0, x1 = count0 + keys[0], count1 + keys[1]
  for block in range(5):
    for r in _ROTATIONS[block % 2]:
      x0 = x0 + x1
      x1 = _rotate_left(x1, r) ^ x0
    x0 = x0 + keys[(block + 1) % 3]
    x1 = x1 + keys[(block + 2) % 3] + np.uint32(block + 1)
  return x0, x1


def use_unrolled_threefry_on_cpu() -> bool:
  """Makes XLA:CPU compile JAX's threefry as straight-line code (idempotent; the bits do not change).
  True when it is in effect; False, with nothing changed, where DGEMMA_CPU_THREEFRY=0 (the switch)."""
  global _registered
  if _registered:
    return True
  if os.environ.get(SWITCH) == "0":
    return False
  try:
    from jax.extend.random import threefry2x32_p
    from jax.interpreters import mlir
    lower_fun, register_lowering = mlir.lower_fun, mlir.register_lowering
  except (ImportError, AttributeError) as e:
    logging.warning("dgemma: JAX's threefry stays a rolled loop on CPU (%s): the same numbers, a slower "
                    "denoising step", e)
    return False

  def lowering(ctx, key0, key1, count0, count1):
    # The primitive broadcasts its operands to one shape; lower_fun traces with the abstract operands as given.
    shape = ctx.avals_out[0].shape
    def fn(k0, k1, c0, c1):
      return list(threefry2x32_unrolled(*(jnp.broadcast_to(a, shape) for a in (k0, k1, c0, c1))))
    return lower_fun(fn, multiple_results=True)(ctx, key0, key1, count0, count1)

  register_lowering(threefry2x32_p, lowering, platform="cpu")
  _registered = True
  return True
