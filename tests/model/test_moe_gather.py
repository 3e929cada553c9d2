"""The gather path (only the routed experts' weights, for few tokens) is the same function as the ragged_dot path."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import tiny_moe
from dgemma.model import layers
from dgemma.model.layers import experts_gather, experts_ragged_dot, route, use_gather

TOL = dict(atol=2e-5, rtol=2e-5)
# 16 experts, top 2: one or two tokens (AR decoding at batch 1 or 2) take the gather path, a prompt does not.
CONFIG = tiny_moe(num_experts=16, top_k_experts=2)


def _routed(t, d=16, e=16, f=8, k=2, seed=1):
  keys = jax.random.split(jax.random.key(seed), 5)
  x = jax.random.normal(keys[0], (t, d))
  gate_up = jax.random.normal(keys[2], (e, d, 2 * f)) / d ** 0.5
  down = jax.random.normal(keys[3], (e, f, d)) / f ** 0.5
  scale = 1.0 + jax.random.uniform(keys[4], (e,))
  weights, experts = route(jax.random.normal(keys[1], (t, d)), jax.random.normal(keys[4], (d, e)), jnp.ones((d,)),
                           scale, k, 1e-6)
  return x, weights, experts, gate_up, down


@pytest.mark.parametrize("t", [1, 3, 12])
def test_experts_gather_matches_ragged_dot(t):
  """With real top-k routing and per-expert scales; 12 tokens share experts."""
  args = _routed(t)
  want = experts_ragged_dot(*args)
  assert float(jnp.abs(want).mean()) > 0.1
  np.testing.assert_allclose(experts_gather(*args), want, **TOL)


def test_experts_gather_bf16_operands_match_ragged_dot_on_bf16_copies():
  x, weights, experts, gate_up, down = _routed(2)
  bf = lambda a: a.astype(jnp.bfloat16).astype(jnp.float32)
  got = experts_gather(x, weights, experts, gate_up, down, "bfloat16")
  # bf16 operands, f32 accumulation: the f32 path on bf16-rounded operands, up to the rounding of h to bf16.
  want = experts_ragged_dot(bf(x), weights, experts, bf(gate_up), bf(down))
  np.testing.assert_allclose(got, want, atol=2e-2 * float(jnp.abs(want).max()), rtol=2e-2)


def test_gather_reads_only_the_routed_experts():
  """Poisoning every unrouted expert with NaN changes nothing (the dense and ragged paths would read it)."""
  x, weights, experts, gate_up, down = _routed(1)
  unrouted = np.setdiff1d(np.arange(16), np.asarray(experts).ravel())
  nan_gate_up, nan_down = gate_up.at[unrouted].set(jnp.nan), down.at[unrouted].set(jnp.nan)
  got = jax.jit(experts_gather)(x, weights, experts, nan_gate_up, nan_down)
  np.testing.assert_array_equal(got, jax.jit(experts_gather)(x, weights, experts, gate_up, down))
  assert np.isnan(np.asarray(jax.jit(experts_ragged_dot)(x, weights, experts, nan_gate_up, nan_down))).all()


def test_use_gather_threshold():
  assert use_gather(1, 8, 128) and use_gather(8, 8, 128) and not use_gather(9, 8, 128)
  assert use_gather(1, 2, 4) and not use_gather(2, 2, 4)


@pytest.mark.parametrize("moe_impl", ["xla", "dense"])
def test_model_decode_step_matches_the_grouped_path(moe_impl, monkeypatch):
  """An AR step (one token per row, batch 1 and 2) through the model: gather path == the configured path."""
  config = CONFIG.replace(moe_impl=moe_impl)
  params = model.init_params(config, jax.random.key(0))
  prompt = jnp.asarray(np.random.default_rng(0).integers(3, config.vocab_size, (2, 6)), jnp.int32)
  for b in (1, 2):
    _, cache = model.encode(params, config, prompt[:b], model.init_cache(config, b, 8))
    step = lambda: jax.jit(lambda c: model.DiffusionGemma(config).apply(
        {"params": params}, prompt[:b, :1], c, method=model.DiffusionGemma.encode))(cache)
    got_logits, got_cache = step()
    with monkeypatch.context() as m:
      m.setattr(layers, "use_gather", lambda *a: False)
      want_logits, want_cache = step()
    np.testing.assert_allclose(got_logits, want_logits, **TOL)
    for g, w in zip(got_cache.keys, want_cache.keys):
      np.testing.assert_allclose(g, w, **TOL)


def test_gather_gradients_match():
  x, weights, experts, gate_up, down = _routed(2)
  loss = lambda fn: lambda gu, dn, xx: jnp.sum(fn(xx, weights, experts, gu, dn) ** 2)
  got = jax.grad(loss(experts_gather), argnums=(0, 1, 2))(gate_up, down, x)
  want = jax.grad(loss(experts_ragged_dot), argnums=(0, 1, 2))(gate_up, down, x)
  for g, w in zip(got, want):
    assert float(jnp.abs(w).max()) > 0
    np.testing.assert_allclose(g, w, atol=1e-5 * float(jnp.abs(w).max()), rtol=1e-4)
