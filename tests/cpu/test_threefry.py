"""The straight-line threefry lowering that dgemma.sampling registers for CPU (dgemma/cpu/threefry.py) gives JAX's
random bits exactly, and its switch turns it off."""

import json
import os
import subprocess
import sys

import jax
import jax.extend.random as jax_random
import jax.numpy as jnp
import numpy as np

from dgemma.cpu import threefry as cpu_threefry

# Known-answer vectors of Threefry-2x32 with 20 rounds (Random123's kat_vectors): key, counter -> output.
KAT = [((0x00000000, 0x00000000), (0x00000000, 0x00000000), (0x6b200159, 0x99ba4efe)),
       ((0xffffffff, 0xffffffff), (0xffffffff, 0xffffffff), (0x1cb996fc, 0xbb002be7)),
       ((0x13198a2e, 0x03707344), (0x243f6a88, 0x85a308d3), (0xc4923a9c, 0x483df7a0))]

# The draws the sampler makes, on a few keys; printed as lists so that another process can compare.
DRAWS = """
import jax, jax.numpy as jnp
keys = jax.random.split(jax.random.key(7), 5)
def draws(keys):
  return dict(
      uniform=jax.vmap(lambda k: jax.random.uniform(k, (64,)))(keys),
      randint=jax.vmap(lambda k: jax.random.randint(k, (64,), 0, 4096))(keys),
      split=jax.random.key_data(jax.vmap(lambda k: jax.random.split(k, 3))(keys)),
      fold_in=jax.random.key_data(jax.vmap(lambda k: jax.random.fold_in(k, 123))(keys)),
      bits=jax.random.bits(keys[0], (7, 3), jnp.uint32))
"""


def test_known_answer_vectors():
  assert cpu_threefry.use_unrolled_threefry_on_cpu()
  hash_jit = jax.jit(jax_random.threefry_2x32)
  for key, count, expected in KAT:
    out = hash_jit(jnp.array(key, jnp.uint32), jnp.array(count, jnp.uint32))
    assert [int(x) for x in out] == list(expected)
    direct = cpu_threefry.threefry2x32_unrolled(*(jnp.uint32(v) for v in key + count))
    assert [int(x) for x in direct] == list(expected)


def test_draws_equal_jax_rolled_lowering_and_compile_without_loops():
  # JAX's own (rolled) lowering, in a process that never imports dgemma.
  code = DRAWS + "import json; print(json.dumps({k: v.tolist() for k, v in jax.jit(draws)(keys).items()}))"
  reference = json.loads(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                        check=True).stdout)
  assert cpu_threefry.use_unrolled_threefry_on_cpu()
  scope = {}
  exec(DRAWS, scope)
  ours = jax.jit(scope["draws"])
  for name, value in ours(scope["keys"]).items():
    np.testing.assert_array_equal(np.asarray(value), np.asarray(reference[name], dtype=np.asarray(value).dtype),
                                  err_msg=name)
  hlo = ours.lower(scope["keys"]).compile().as_text()
  assert " while(" not in hlo, "the threefry hash still compiles to a loop"


def test_switch_keeps_jax_lowering():
  """DGEMMA_CPU_THREEFRY=0: importing the sampler registers nothing, and the hash still compiles to JAX's loop."""
  code = DRAWS + """
import jax.extend.random as jax_random
from dgemma.cpu import threefry
import dgemma.sampling  # registers the lowering at import unless switched off
hlo = jax.jit(jax_random.threefry_2x32).lower(jnp.zeros(2, jnp.uint32), jnp.zeros(8, jnp.uint32)).compile().as_text()
print(threefry.use_unrolled_threefry_on_cpu(), " while(" in hlo)
"""
  for value, expected in (("0", "False True"), ("1", "True False")):
    env = {**os.environ, "DGEMMA_CPU_THREEFRY": value, "JAX_PLATFORMS": "cpu"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    assert out.stdout.split("\n")[-2] == expected, (value, out.stdout, out.stderr[-2000:])
