"""moe_impl="dense" (every token through every expert) is the same function as the ragged_dot path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import tiny_moe
from dgemma.model.layers import experts_dense, experts_ragged_dot, geglu_fused, route

XLA = tiny_moe()
DENSE = XLA.replace(moe_impl="dense")
TOL = dict(atol=2e-5, rtol=2e-5)


@pytest.fixture(scope="module")
def params():
  return model.init_params(XLA, jax.random.key(0))


def _tokens(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).integers(3, XLA.vocab_size, shape), jnp.int32)


def test_experts_match_ragged_dot():
  """The expert functions alone, with real top-k routing (several tokens per expert, per-expert scales)."""
  t, d, e, f, k = 12, 16, 5, 8, 2
  keys = jax.random.split(jax.random.key(1), 5)
  x = jax.random.normal(keys[0], (t, d))
  router_in = jax.random.normal(keys[1], (t, d))
  gate_up = jax.random.normal(keys[2], (e, d, 2 * f)) / d ** 0.5
  down = jax.random.normal(keys[3], (e, f, d)) / f ** 0.5
  scale = 1.0 + jax.random.uniform(keys[4], (e,))
  weights, experts = route(router_in, jax.random.normal(keys[4], (d, e)), jnp.ones((d,)), scale, k, 1e-6)
  want = experts_ragged_dot(x, weights, experts, gate_up, down)
  assert float(jnp.abs(want).mean()) > 0.1  # a real signal, not ~0 on both sides
  np.testing.assert_allclose(experts_dense(x, weights, experts, gate_up, down), want, **TOL)


def test_encode_and_denoise_logits_match(params):
  prompt, canvas = _tokens(0, (2, 7)), _tokens(1, (2, 8))
  valid = jnp.asarray([[True] * 7, [True] * 4 + [False] * 3])
  sc = jax.random.normal(jax.random.key(2), (2, 8, XLA.vocab_size))
  out = {}
  for config in (XLA, DENSE):
    logits, cache = model.encode(params, config, prompt, model.init_cache(config, 2, 16), valid)
    out[config.moe_impl] = (logits, cache.keys + cache.values, model.denoise(params, config, canvas, cache, sc))
  np.testing.assert_allclose(out["dense"][0], out["xla"][0], **TOL)
  for got, want in zip(out["dense"][1], out["xla"][1]):
    np.testing.assert_allclose(got, want, **TOL)
  np.testing.assert_allclose(out["dense"][2], out["xla"][2], **TOL)


def test_gradients_match(params):
  """A tiny training-like loss: encode [prompt ‖ clean canvas], denoise a noisy canvas against that cache."""
  prompt, clean, noisy = _tokens(3, (2, 5)), _tokens(4, (2, 8)), _tokens(5, (2, 8))
  ct = jax.random.normal(jax.random.key(6), (2, 8, XLA.vocab_size))

  def loss(prm, config):
    full = jnp.concatenate([prompt, clean], axis=1)
    enc_logits, cache = model.DiffusionGemma(config).apply(
        {"params": prm}, full, model.init_cache(config, 2, 13), method=model.DiffusionGemma.encode)
    dec_logits = model.DiffusionGemma(config).apply(
        {"params": prm}, noisy, cache.with_end(jnp.full((2,), 5)), method=model.DiffusionGemma.denoise)
    return jnp.mean(jax.nn.logsumexp(enc_logits, axis=-1)) + jnp.sum(dec_logits * ct)

  grad = lambda config: jax.jit(jax.value_and_grad(lambda prm: loss(prm, config)))(params)
  (loss_x, grads_x), (loss_d, grads_d) = grad(XLA), grad(DENSE)
  np.testing.assert_allclose(loss_d, loss_x, rtol=1e-5)
  # The expert and router weights get real gradients on both sides (not a vacuous zero match).
  moe_x = grads_x["layer_0"]["moe"]
  assert float(jnp.abs(moe_x["gate_up"]).max()) > 0 and float(jnp.abs(moe_x["router"]).max()) > 0
  # One scale for the whole tree (as the Pallas test): some gradients are ~0 by symmetry.
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grads_x))
  for (path, gx), gd in zip(jax.tree_util.tree_leaves_with_path(grads_x), jax.tree_util.tree_leaves(grads_d)):
    np.testing.assert_allclose(gd, gx, atol=1e-5 * scale, rtol=1e-4, err_msg=jax.tree_util.keystr(path))


def test_bad_moe_impl_is_a_clear_error():
  with pytest.raises(ValueError, match="moe_impl must be 'xla', 'dense' or 'pallas', got 'ragged'"):
    XLA.replace(moe_impl="ragged")


def _every_expert_weighted(x, weights, experts, gate_up, down, operand_dtype=""):
  """The dense formula written out: every expert's GeGLU activations, times its routing weight (0 if unchosen)."""
  one_hot = jax.nn.one_hot(experts, gate_up.shape[0], dtype=weights.dtype)
  combine = jnp.einsum("tk,tke->te", weights, one_hot).astype(x.dtype)
  if operand_dtype == "bfloat16":
    einsum = lambda spec, a, b: jnp.einsum(spec, a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                                           preferred_element_type=jnp.float32).astype(x.dtype)
  else:
    einsum = jnp.einsum
  h = geglu_fused(einsum("td,edf->tef", x, gate_up)) * combine[:, :, None]
  return einsum("tef,efd->td", h, down)


@pytest.mark.parametrize("operand_dtype", ["", "bfloat16"])
def test_chosen_pair_activations_equal_every_expert_weighted(operand_dtype):
  """The GeGLU on the chosen (token, expert) pairs only, scattered into zeros, gives the numbers of weighting
  every expert's activations; and an unchosen expert whose activations overflow no longer turns them into NaN."""
  t, d, e, f, k = 24, 16, 6, 8, 2
  keys = jax.random.split(jax.random.key(7), 3)
  x = jax.random.normal(keys[0], (t, d))
  gate_up = jax.random.normal(keys[1], (e, d, 2 * f)) / d ** 0.5
  down = jax.random.normal(keys[2], (e, f, d)) / f ** 0.5
  # Distinct experts per token, never the last one; unnormalised weights, as after per-expert scales.
  rng = np.random.default_rng(8)
  experts = jnp.asarray(np.stack([rng.choice(e - 1, k, replace=False) for _ in range(t)]), jnp.int32)
  weights = jnp.asarray(rng.uniform(0.1, 2.0, (t, k)), jnp.float32)
  got = jax.jit(experts_dense, static_argnums=5)(x, weights, experts, gate_up, down, operand_dtype)
  want = jax.jit(_every_expert_weighted, static_argnums=5)(x, weights, experts, gate_up, down, operand_dtype)
  assert float(jnp.abs(want).mean()) > 0.1
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6 * float(jnp.abs(want).max()))

  huge = gate_up.at[e - 1].set(1e30)  # inf activations for the expert nobody chose
  assert np.isnan(np.asarray(_every_expert_weighted(x, weights, experts, huge, down, operand_dtype))).any()
  np.testing.assert_array_equal(experts_dense(x, weights, experts, huge, down, operand_dtype),
                                experts_dense(x, weights, experts, gate_up, down, operand_dtype))
