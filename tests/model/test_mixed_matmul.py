"""ModelConfig.matmul_dtype="bfloat16": bf16 operands with float32 accumulation, forward and backward."""

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
import pytest

from dgemma import model
from dgemma.config import small_dense
from dgemma.model.layers import experts_dense, mixed_matmul, token_matmul, unembed_matmul


def _bf16(x):
  """Round to bfloat16 and widen to float64: the operands the mixed matmul multiplies."""
  return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def test_forward_and_gradients_multiply_bf16_operands_exactly():
  """Against float64 products of the bf16-rounded operands (and the bf16-rounded cotangent in the backward):
  only the float32 accumulation differs, so the match is far tighter than bf16's own precision (~4e-3)."""
  rng = np.random.default_rng(0)
  x, w, g = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((37, 24), (24, 19), (37, 19)))
  y, vjp = jax.vjp(mixed_matmul, x, w)
  dx, dw = vjp(g)
  assert y.dtype == dx.dtype == dw.dtype == jnp.float32
  np.testing.assert_allclose(y, _bf16(x) @ _bf16(w), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, _bf16(g) @ _bf16(w).T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dw, _bf16(x).T @ _bf16(g), rtol=1e-5, atol=1e-5)
  # ... and it is not the float32 product: the rounding is real.
  assert np.abs(np.asarray(y) - np.asarray(x, np.float64) @ np.asarray(w, np.float64)).max() > 1e-3


def test_unembedding_form_multiplies_by_the_stored_transpose():
  """`w_is_NxK` (the tied unembedding, table stored [V, D]): the same products as x @ table.T, and the weight
  gradient comes back in the table's own layout."""
  rng = np.random.default_rng(2)
  x, table, g = (jnp.asarray(rng.normal(size=s), jnp.float32) for s in ((13, 24), (31, 24), (13, 31)))
  y, vjp = jax.vjp(lambda x, t: mixed_matmul(x, t, w_is_NxK=True), x, table)
  dx, dtable = vjp(g)
  assert dtable.shape == table.shape
  np.testing.assert_allclose(y, _bf16(x) @ _bf16(table).T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dx, _bf16(g) @ _bf16(table), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(dtable, _bf16(g).T @ _bf16(x), rtol=1e-5, atol=1e-5)
  x3 = x.reshape(1, 13, 24)
  np.testing.assert_allclose(unembed_matmul(x3, table), np.asarray(x3) @ np.asarray(table).T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(unembed_matmul(x3, table, "bfloat16")[0], y, rtol=0, atol=0)


def test_token_matmul_flattens_the_same_way_in_both_dtypes():
  rng = np.random.default_rng(1)
  x = jnp.asarray(rng.normal(size=(2, 5, 3, 4)), jnp.float32)
  w = jnp.asarray(rng.normal(size=(3, 4, 6)), jnp.float32)
  exact = np.einsum("btnh,nhd->btd", _bf16(x), _bf16(w))
  np.testing.assert_allclose(token_matmul(x, w, contract_dims=2, operand_dtype="bfloat16"), exact, rtol=1e-5,
                             atol=1e-5)
  np.testing.assert_allclose(token_matmul(x, w, contract_dims=2), np.einsum("btnh,nhd->btd", x, w), rtol=1e-5,
                             atol=1e-5)


def test_dense_experts_multiply_bf16_operands():
  """The dense MoE path (every expert, weighted): float64 products of the bf16-rounded input and weights, and of
  the rounded hidden activations before the down projection."""
  rng = np.random.default_rng(3)
  t, d, e, f, k = 7, 16, 4, 8, 2
  x = jnp.asarray(rng.normal(size=(t, d)), jnp.float32)
  gate_up = jnp.asarray(rng.normal(size=(e, d, 2 * f)), jnp.float32)
  down = jnp.asarray(rng.normal(size=(e, f, d)), jnp.float32)
  experts = jnp.asarray(np.stack([rng.choice(e, k, replace=False) for _ in range(t)]), jnp.int32)
  weights = jnp.asarray(rng.uniform(size=(t, k)), jnp.float32)
  got = experts_dense(x, weights, experts, gate_up, down, "bfloat16")
  combine = np.zeros((t, e))
  np.put_along_axis(combine, np.asarray(experts), np.asarray(weights, np.float64), axis=1)
  pre = np.einsum("td,edf->tef", _bf16(x), _bf16(gate_up))
  gate, up = pre[..., :f], pre[..., f:]
  gelu = 0.5 * gate * (1 + np.tanh(np.sqrt(2 / np.pi) * (gate + 0.044715 * gate ** 3)))
  hidden = (gelu * up).astype(np.float32) * combine[:, :, None].astype(np.float32)
  expected = np.einsum("tef,efd->td", _bf16(hidden), _bf16(down))
  np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3 * np.abs(expected).max())
  plain = experts_dense(x, weights, experts, gate_up, down)
  assert np.abs(np.asarray(plain) - expected).max() > np.abs(np.asarray(got) - expected).max()


def test_model_in_mixed_precision_stays_close_to_float32():
  """Same parameters, the whole denoiser (self-conditioned, so the soft embedding too): bf16 operands move the
  logits by about bf16's precision, and the loss gradient keeps its direction."""
  config = small_dense(vocab_size=13, width=32, num_layers=2, num_heads=2, canvas_length=8)
  mixed = config.replace(matmul_dtype="bfloat16")
  params = model.init_params(config, jax.random.key(0))
  rng = np.random.default_rng(2)
  v = config.vocab_size
  prompt = jnp.asarray(rng.integers(0, v, (3, 6)), jnp.int32)
  canvas = jnp.asarray(rng.integers(0, v, (3, 8)), jnp.int32)
  targets = jnp.asarray(rng.integers(0, v, (3, 8)), jnp.int32)
  previous = jnp.asarray(rng.normal(size=(3, 8, v)), jnp.float32)

  def loss(params, cfg):
    _, cache = model.encode(params, cfg, prompt, model.init_cache(cfg, 3, 6))
    logits = model.denoise(params, cfg, canvas, cache, previous)
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), targets[..., None], -1)), logits

  (l32, logits32), g32 = jax.value_and_grad(loss, has_aux=True)(params, config)
  (l16, logits16), g16 = jax.value_and_grad(loss, has_aux=True)(params, mixed)
  diff = np.abs(np.asarray(logits16) - np.asarray(logits32)).max()
  assert 0 < diff < 0.05 * np.abs(np.asarray(logits32)).max()
  assert abs(float(l16) - float(l32)) < 0.01 * float(l32)
  flat32, flat16 = (np.concatenate([np.ravel(v) for v in jax.tree.leaves(g)]) for g in (g32, g16))
  cosine = flat32 @ flat16 / np.linalg.norm(flat32) / np.linalg.norm(flat16)
  assert cosine > 0.99
  assert all(a.dtype == b.dtype for a, b in zip(jax.tree.leaves(g32), jax.tree.leaves(g16)))


def test_unknown_matmul_dtype_is_a_clear_error():
  with pytest.raises(ValueError, match="matmul_dtype must be"):
    small_dense(vocab_size=13, matmul_dtype="float8")
