"""The autoregressive baseline equals token-by-token decoding through the public encoder API."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import small_dense
from dgemma.sampling import ARConfig, generate_autoregressive

NEW = 7


@pytest.fixture(scope="module")
def tiny():
  config = small_dense(vocab_size=48, width=32, num_layers=2, num_heads=2, canvas_length=8)
  params = model.init_params(config, jax.random.key(3))
  params = jax.tree.map(lambda x: x * 2 if x.ndim >= 2 else x, params)  # peaked, varied predictions
  rng = np.random.default_rng(0)
  prompt = rng.integers(3, 48, (3, 5))
  valid = np.ones_like(prompt, bool)
  valid[1, 2:] = False  # right padding: row 1 continues from its third token
  return config, params, np.where(valid, prompt, 0), valid


def _reference(config, params, prompt, valid, stop_ids):
  """Greedy decoding one `model.encode` call at a time, with HF's handling of finished rows."""
  cache = model.init_cache(config, prompt.shape[0], prompt.shape[1] + NEW)
  logits, cache = model.encode(params, config, jnp.asarray(prompt), cache, jnp.asarray(valid))
  last = valid.sum(1) - 1
  next_logits = np.asarray(logits)[np.arange(len(prompt)), last]
  done = np.zeros(len(prompt), bool)
  out = []
  for _ in range(NEW):
    token = np.where(done, config.pad_id, next_logits.argmax(-1))
    out.append(token)
    done |= np.isin(token, stop_ids)
    logits, cache = model.encode(params, config, jnp.asarray(token[:, None], jnp.int32), cache)
    next_logits = np.asarray(logits)[:, 0]
  return np.stack(out, 1)


def test_greedy_matches_token_by_token_encoding(tiny):
  config, params, prompt, valid = tiny
  free = _reference(config, params, prompt, valid, ())
  # A stop token that ends row 0 early but no other row, so that padding and per-row stops are exercised.
  stop = int(free[0, 3])
  assert stop not in free[1:].ravel() and stop not in free[0, :3]
  expected = _reference(config, params, prompt, valid, (stop,))
  out = generate_autoregressive(params, config, prompt, valid, jax.random.key(0),
                                ARConfig(max_new_tokens=NEW, stop_ids=(stop,)))
  np.testing.assert_array_equal(np.asarray(out.tokens), expected)
  np.testing.assert_array_equal(np.asarray(out.forward_passes), [4, NEW, NEW])
  assert (np.asarray(out.tokens)[0, 4:] == config.pad_id).all()
  nonpad = (expected != config.pad_id).sum(1)
  np.testing.assert_allclose(np.asarray(out.tokens_per_forward), nonpad / np.array([4, NEW, NEW]))


def test_temperature_sampling_depends_on_the_key_only_per_row(tiny):
  config, params, prompt, valid = tiny
  ar = ARConfig(max_new_tokens=NEW, temperature=1.5, stop_ids=())
  keys = jnp.stack([jax.random.key(i) for i in (1, 2, 3)])
  a = np.asarray(generate_autoregressive(params, config, prompt, valid, keys, ar).tokens)
  swapped = jnp.stack([jax.random.key(i) for i in (9, 2, 8)])
  b = np.asarray(generate_autoregressive(params, config, prompt, valid, swapped, ar).tokens)
  np.testing.assert_array_equal(a[1], b[1])
  assert not np.array_equal(a[[0, 2]], b[[0, 2]])
  greedy = _reference(config, params, prompt, valid, ())
  assert not np.array_equal(a, greedy)  # sampling, not argmax


def test_bad_ar_config():
  with pytest.raises(ValueError, match="max_new_tokens must be a positive integer"):
    ARConfig(max_new_tokens=0)
  with pytest.raises(ValueError, match="temperature must be >= 0"):
    ARConfig(temperature=-1.0)
