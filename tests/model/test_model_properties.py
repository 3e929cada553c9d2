"""Properties of encode/denoise that need no reference implementation."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import tiny_moe

CONFIG = tiny_moe()


@pytest.fixture(scope="module")
def params():
  return model.init_params(CONFIG, jax.random.key(0))


def _tokens(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).integers(0, CONFIG.vocab_size, shape), jnp.int32)


def test_append_equals_single_pass(params):
  prompt, canvas = _tokens(0, (2, 7)), _tokens(1, (2, 8))
  cache = model.init_cache(CONFIG, 2, 24)
  logits_a, cache_a = model.encode(params, CONFIG, prompt, cache)
  logits_b, cache_b = model.encode(params, CONFIG, canvas, cache_a)
  logits_ab, cache_ab = model.encode(params, CONFIG, jnp.concatenate([prompt, canvas], 1), cache)
  np.testing.assert_allclose(jnp.concatenate([logits_a, logits_b], 1), logits_ab, atol=1e-5)
  for k1, k2 in zip(cache_b.keys, cache_ab.keys):
    np.testing.assert_allclose(k1, k2, atol=1e-5)
  np.testing.assert_array_equal(cache_b.end, cache_ab.end)


def test_denoiser_ignores_garbage_beyond_valid_length(params):
  prompt, canvas = _tokens(2, (2, 7)), _tokens(3, (2, 8))
  _, cache = model.encode(params, CONFIG, prompt, model.init_cache(CONFIG, 2, 20))
  clean = model.denoise(params, CONFIG, canvas, cache)
  rng = np.random.default_rng(4)
  garbage = cache.replace(
      keys=tuple(jnp.where(jnp.arange(20)[None, :, None, None] >= 7, 1e3 * rng.normal(size=k.shape), k)
                 for k in cache.keys),
      values=tuple(jnp.where(jnp.arange(20)[None, :, None, None] >= 7, 1e3 * rng.normal(size=v.shape), v)
                   for v in cache.values),
      valid=cache.valid.at[:, 10:].set(True))  # stale "valid" flags past `end` must not matter either
  np.testing.assert_allclose(model.denoise(params, CONFIG, canvas, garbage), clean, atol=1e-6)


def test_denoiser_depends_on_cache_and_self_conditioning(params):
  """Guards against a vacuous pass: the cache and the SC signal must both change the output."""
  canvas = _tokens(5, (1, 8))
  _, cache1 = model.encode(params, CONFIG, _tokens(6, (1, 7)), model.init_cache(CONFIG, 1, 16))
  _, cache2 = model.encode(params, CONFIG, _tokens(7, (1, 7)), model.init_cache(CONFIG, 1, 16))
  a = model.denoise(params, CONFIG, canvas, cache1)
  assert float(jnp.abs(a - model.denoise(params, CONFIG, canvas, cache2)).max()) > 1e-4
  sc = jax.random.normal(jax.random.key(1), (1, 8, CONFIG.vocab_size))
  assert float(jnp.abs(a - model.denoise(params, CONFIG, canvas, cache1, sc)).max()) > 1e-4


def test_rows_are_independent(params):
  prompt, canvas = _tokens(8, (3, 7)), _tokens(9, (3, 8))
  _, cache = model.encode(params, CONFIG, prompt, model.init_cache(CONFIG, 3, 16))
  full = model.denoise(params, CONFIG, canvas, cache)
  _, cache1 = model.encode(params, CONFIG, prompt[1:2], model.init_cache(CONFIG, 1, 16))
  np.testing.assert_allclose(model.denoise(params, CONFIG, canvas[1:2], cache1), full[1:2], atol=1e-5)


def test_cache_overflow_is_a_clear_error(params):
  cache = model.init_cache(CONFIG, 1, 8)
  _, cache = model.encode(params, CONFIG, _tokens(0, (1, 6)), cache)
  with pytest.raises(ValueError, match="cache slots"):
    model.encode(params, CONFIG, _tokens(1, (1, 4)), cache)


def test_learned_positions_keep_append_equal_to_single_pass():
  config = CONFIG.replace(learned_positions=32)
  params = model.init_params(config, jax.random.key(5))
  assert params["embedder"]["positions"].shape == (32, config.width)
  prompt, canvas = _tokens(10, (1, 7)), _tokens(11, (1, 8))
  cache = model.init_cache(config, 1, 24)
  _, cache_a = model.encode(params, config, prompt, cache)
  logits_b, _ = model.encode(params, config, canvas, cache_a)
  logits_ab, _ = model.encode(params, config, jnp.concatenate([prompt, canvas], 1), cache)
  np.testing.assert_allclose(logits_b, logits_ab[:, 7:], atol=1e-5)
  # The embedding is really used: shifting the cache offset changes the canvas logits.
  shifted = model.denoise(params, config, canvas, cache_a.replace(end=cache_a.end + 3))
  assert float(jnp.abs(shifted - model.denoise(params, config, canvas, cache_a)).max()) > 1e-4


def test_position_features_share_table_rows():
  """position_features: a position's embedding is the sum of its rows, so two positions with the same features
  embed identically (the Sudoku layout: a clue and its canvas cell differ only in the segment row)."""
  features = ((0, 3), (1, 4), (2, 3), (1, 4), (2, 5))  # positions 1 and 3 share both rows
  config = CONFIG.replace(learned_positions=6, position_features=features)
  params = model.init_params(config, jax.random.key(6))
  table = params["embedder"]["positions"]
  tokens = jnp.full((1, 5), 9, jnp.int32)
  from dgemma.model.layers import Embedder
  x = Embedder(config).apply({"params": params["embedder"]}, tokens, jnp.arange(5)[None], method=Embedder.encode)
  base = Embedder(config.replace(learned_positions=0, position_features=())).apply(
      {"params": {"embedding": params["embedder"]["embedding"]}}, tokens, jnp.arange(5)[None], method=Embedder.encode)
  np.testing.assert_allclose(x - base, jnp.stack([table[jnp.asarray(f)].sum(0) for f in features])[None], atol=1e-6)
  np.testing.assert_array_equal(x[0, 1], x[0, 3])
  with pytest.raises(ValueError, match="position_features ids"):
    CONFIG.replace(learned_positions=4, position_features=features)
