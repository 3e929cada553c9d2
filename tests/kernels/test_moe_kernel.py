"""The Pallas grouped matmuls (interpret mode) against `jax.lax.ragged_dot` and dense per-expert references.

Values and gradients (lhs and rhs, i.e. the gmm, transposed-gmm and tgmm kernels), on group layouts that
hit the edges: empty groups (first, middle, last), groups much smaller than a row tile (several groups per
tile), one group owning everything, rows past sum(group_sizes), M and the feature dims not multiples of
the tiles.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma.model.layers import experts_ragged_dot
from pallas_kernels.moe import GmmTiling, gmm, gmm_reference, moe_dense_reference, moe_experts, tgmm

F32_TOL = dict(atol=2e-5, rtol=2e-5)
TILES = GmmTiling(block_m=8, block_c=8, block_o=8)
M, C, O = 37, 24, 20  # 37 rows: 5 tiles of 8, the last one partial; C, O: 3 chunks, 3 tiles (last padded)

GROUPINGS = {
    "uneven-with-empty": [5, 0, 13, 0, 9, 7],  # sum 34 < 37: the last 3 rows belong to no group
    "empty-first-and-last": [0, 1, 2, 3, 25, 0],  # several groups inside one 8-row tile
    "one-group-owns-all": [0, 0, 37, 0, 0, 0],
    "all-empty": [0, 0, 0, 0, 0, 0],
}


def _operands(seed, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  lhs = jnp.asarray(rng.normal(size=(M, C)), dtype)
  rhs = jnp.asarray(rng.normal(size=(6, C, O)) / np.sqrt(C), dtype)
  return lhs, rhs, jnp.asarray(rng.normal(size=(M, O)), dtype)


def _value_and_grads(fn, lhs, rhs, group_sizes, ct):
  out, vjp = jax.vjp(lambda a, b: fn(a, b, group_sizes), lhs, rhs)
  return out, vjp(ct)


@pytest.mark.parametrize("grouping", GROUPINGS.values(), ids=GROUPINGS.keys())
def test_gmm_matches_ragged_dot_and_dense_reference(grouping):
  lhs, rhs, ct = _operands(0)
  group_sizes = jnp.asarray(grouping, jnp.int32)
  kernel = jax.jit(lambda a, b, g, ct: _value_and_grads(
      lambda a, b, g: gmm(a, b, g, tiling=TILES, interpret=True), a, b, g, ct))
  out, (dlhs, drhs) = kernel(lhs, rhs, group_sizes, ct)
  for reference in (jax.lax.ragged_dot, gmm_reference):
    ref, (ref_dlhs, ref_drhs) = jax.jit(lambda a, b, g, ct: _value_and_grads(reference, a, b, g, ct))(
        lhs, rhs, group_sizes, ct)
    np.testing.assert_allclose(out, ref, **F32_TOL)
    np.testing.assert_allclose(dlhs, ref_dlhs, **F32_TOL)
    np.testing.assert_allclose(drhs, ref_drhs, **F32_TOL)
  total = int(group_sizes.sum())
  np.testing.assert_array_equal(out[total:], 0.0)  # rows of no group
  np.testing.assert_array_equal(drhs[np.asarray(group_sizes) == 0], 0.0)  # empty experts get no gradient


def test_tgmm_is_the_per_group_weight_gradient():
  lhs, _, dout = _operands(1)
  group_sizes = jnp.asarray(GROUPINGS["empty-first-and-last"], jnp.int32)
  got = jax.jit(lambda a, b, g: tgmm(a, b, g, tiling=TILES, interpret=True))(lhs, dout, group_sizes)
  ends = np.cumsum(group_sizes)
  for g in range(6):
    rows = slice(ends[g] - group_sizes[g], ends[g])
    np.testing.assert_allclose(got[g], lhs[rows].T @ dout[rows], **F32_TOL)


def test_gmm_bf16_accumulates_in_f32():
  lhs, rhs, ct = _operands(2, jnp.bfloat16)
  group_sizes = jnp.asarray(GROUPINGS["uneven-with-empty"], jnp.int32)
  out, (dlhs, drhs) = jax.jit(lambda a, b, g, ct: _value_and_grads(
      lambda a, b, g: gmm(a, b, g, tiling=TILES, interpret=True), a, b, g, ct))(lhs, rhs, group_sizes, ct)
  assert out.dtype == dlhs.dtype == drhs.dtype == jnp.bfloat16
  f32 = lambda x: x.astype(jnp.float32)
  ref, (ref_dlhs, ref_drhs) = _value_and_grads(gmm_reference, f32(lhs), f32(rhs), group_sizes, f32(ct))
  np.testing.assert_allclose(f32(out), ref, atol=3e-2, rtol=2e-2)
  np.testing.assert_allclose(f32(dlhs), ref_dlhs, atol=3e-2, rtol=2e-2)
  np.testing.assert_allclose(f32(drhs), ref_drhs, atol=6e-2, rtol=2e-2)  # sums over up to 13 rows


def test_moe_experts_matches_ragged_dot_path_and_dense_experts():
  """The model's MoE contract, values and gradients in x, routing weights, gate/up and down weights."""
  t, d, f, k, e = 11, 16, 12, 2, 5  # 2F = 24, F = 12: no multiple of the 8-wide tiles
  rng = np.random.default_rng(3)
  x = jnp.asarray(rng.normal(size=(t, d)), jnp.float32)
  weights = jnp.asarray(rng.random((t, k)), jnp.float32)
  experts = jnp.asarray(np.stack([rng.choice([0, 2, 3], size=k, replace=False) for _ in range(t)]), jnp.int32)
  gate_up = jnp.asarray(rng.normal(size=(e, d, 2 * f)) / 4, jnp.float32)  # experts 1 and 4 get no token
  down = jnp.asarray(rng.normal(size=(e, f, d)) / 4, jnp.float32)
  ct = jnp.asarray(rng.normal(size=(t, d)), jnp.float32)

  def value_and_grads(fn):
    def run(x, w, gu, dn):
      out, vjp = jax.vjp(lambda x, w, gu, dn: fn(x, w, experts, gu, dn), x, w, gu, dn)
      return out, vjp(ct)
    return jax.jit(run)(x, weights, gate_up, down)

  out, grads = value_and_grads(lambda *a: moe_experts(*a, tiling=TILES, interpret=True))
  for reference in (experts_ragged_dot, moe_dense_reference):
    ref, ref_grads = value_and_grads(reference)
    np.testing.assert_allclose(out, ref, **F32_TOL)
    for name, g, r in zip(["x", "weights", "gate_up", "down"], grads, ref_grads):
      np.testing.assert_allclose(g, r, **F32_TOL, err_msg=name)
  np.testing.assert_array_equal(grads[2][np.array([1, 4])], 0.0)


def test_kernels_lower_to_triton():
  """gmm (plain and transposed) and tgmm pass the Pallas -> Triton lowering for CUDA at the real widths
  (2816 -> 2 x 704, 128 experts, bf16); compiling and running need a GPU."""
  t, d, f, e, k = 64, 2816, 704, 128, 8
  weights, experts = jnp.full((t, k), 1.0 / k), jnp.zeros((t, k), jnp.int32)

  def fwd_bwd(x, gate_up, down):
    out, vjp = jax.vjp(lambda *a: moe_experts(a[0], weights, experts, *a[1:], interpret=False), x, gate_up, down)
    return vjp(out)

  shapes = [jax.ShapeDtypeStruct(s, jnp.bfloat16) for s in [(t, d), (e, d, 2 * f), (e, f, d)]]  # no 1.5 GB
  lowered = jax.jit(fwd_bwd).trace(*shapes).lower(lowering_platforms=("cuda",))
  assert lowered.as_text().count("xla.gpu.triton") == 6
