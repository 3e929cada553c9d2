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


def test_self_conditioning_probabilities_equal_their_logits(params):
  """The sampler passes softmax(logits) (from `acceptance.analyse`, which computes it anyway) in place of the
  logits: the same signal, up to float32 rounding of the normaliser."""
  from dgemma.sampling import acceptance
  canvas = _tokens(8, (2, 8))
  _, cache = model.encode(params, CONFIG, _tokens(9, (2, 7)), model.init_cache(CONFIG, 2, 16))
  sc = 3.0 * jax.random.normal(jax.random.key(2), (2, 8, CONFIG.vocab_size))
  mask = jnp.asarray([True, False])
  probs = acceptance.analyse(sc, with_probs=True).probs
  np.testing.assert_allclose(probs, jax.nn.softmax(sc, axis=-1), rtol=1e-5, atol=1e-7)
  from_logits = model.denoise(params, CONFIG, canvas, cache, sc, mask)
  from_probs = model.denoise(params, CONFIG, canvas, cache, self_conditioning_mask=mask, self_conditioning_probs=probs)
  np.testing.assert_allclose(from_probs, from_logits, rtol=1e-5, atol=1e-5)
  with pytest.raises(ValueError, match="not several"):
    model.denoise(params, CONFIG, canvas, cache, sc, mask, probs)


@pytest.mark.parametrize("matmul_dtype", ["", "bfloat16"])
def test_transposed_table_gives_the_same_self_conditioning(params, matmul_dtype):
  """The sampler multiplies the probabilities by E.T built once (`embedding_table_transposed`): the same product
  as by the embedding itself, up to the matmul's summation order."""
  config = CONFIG.replace(matmul_dtype=matmul_dtype)
  canvas = _tokens(10, (2, 8))
  _, cache = model.encode(params, config, _tokens(11, (2, 7)), model.init_cache(config, 2, 16))
  probs = jax.nn.softmax(3.0 * jax.random.normal(jax.random.key(3), (2, 8, config.vocab_size)), axis=-1)
  table = model.embedding_table_transposed(params, config)
  assert table.shape == (config.width, config.vocab_size)
  assert table.dtype == (jnp.bfloat16 if matmul_dtype else jnp.float32)
  plain = model.denoise(params, config, canvas, cache, self_conditioning_probs=probs)
  with_table = model.denoise(params, config, canvas, cache, self_conditioning_probs=probs,
                             self_conditioning_table=table)
  np.testing.assert_allclose(with_table, plain, rtol=1e-4, atol=1e-4)
  logits = jnp.log(probs)  # the logits path takes the same table
  np.testing.assert_allclose(model.denoise(params, config, canvas, cache, logits, self_conditioning_table=table),
                             plain, rtol=1e-4, atol=1e-4)
  with pytest.raises(ValueError, match="transposed embedding table must have shape"):
    model.denoise(params, config, canvas, cache, self_conditioning_probs=probs, self_conditioning_table=table.T)


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
  config = CONFIG.replace(learned_positions=6, num_position_features=2)
  params = model.init_params(config, jax.random.key(6))
  table = params["embedder"]["positions"]
  tokens = jnp.full((1, 5), 9, jnp.int32)
  from dgemma.model.layers import Embedder
  x = Embedder(config).apply({"params": params["embedder"]}, tokens, jnp.arange(5)[None], jnp.asarray(features),
                             method=Embedder.encode)
  base = Embedder(config.replace(learned_positions=0, num_position_features=0)).apply(
      {"params": {"embedding": params["embedder"]["embedding"]}}, tokens, jnp.arange(5)[None], method=Embedder.encode)
  np.testing.assert_allclose(x - base, jnp.stack([table[jnp.asarray(f)].sum(0) for f in features])[None], atol=1e-6)
  np.testing.assert_array_equal(x[0, 1], x[0, 3])
  with pytest.raises(ValueError, match="position_features ids"):
    model.encode(params, CONFIG.replace(learned_positions=4, num_position_features=2), tokens,
                 model.init_cache(config, 1, 8), position_features=features)


def _sudoku_relation_config(**overrides):
  from dgemma.tasks.sudoku import digits as sudoku_task
  return CONFIG.replace(canvas_length=81, learned_positions=sudoku_task.CELL_POSITION_ROWS,
                        num_position_features=4, relation_bias=True, **overrides)


def _sudoku_features():
  from dgemma.tasks.sudoku import digits as sudoku_task
  return np.asarray(sudoku_task.cell_position_features(), np.int32)


def test_shared_features_match_the_grid():
  """Sudoku layout (BOS, 81 clues, 81 canvas cells): the shared-feature bits against row/column/box computed
  from the cell indices."""
  from dgemma.tasks.sudoku import digits as sudoku_task
  from dgemma.model.masks import shared_features
  positions = jnp.arange(163)[None]
  same_FxBxTxS = np.asarray(shared_features(sudoku_task.cell_position_features(), positions, positions))[:, 0]

  def cell(p):  # (segment, row, column, box) with None for BOS
    if p == 0:
      return ("bos", None, None, None)
    i = (p - 1) if p <= 81 else (p - 82)
    r, c = divmod(i, 9)
    return ("prompt" if p <= 81 else "canvas", r, c, (r // 3, c // 3))

  rng = np.random.default_rng(0)
  for p, q in rng.integers(0, 163, (400, 2)).tolist() + [(1, 82), (5, 90), (0, 0), (0, 82)]:
    a, b = cell(p), cell(q)
    expected = [a[0] == b[0]] + [a[k] is not None and a[k] == b[k] for k in (1, 2, 3)]
    if a[1] is None and b[1] is None:  # BOS with BOS: "no cell" equals "no cell"
      expected = [True, True, True, True]
    np.testing.assert_array_equal(same_FxBxTxS[:, p, q], expected, err_msg=f"positions {p}, {q}")


def test_relation_bias_starts_as_the_plain_model():
  config = _sudoku_relation_config()
  params = model.init_params(config, jax.random.key(7))
  assert all(np.all(params[f"layer_{i}"]["attn"]["relation_bias"] == 0) for i in range(config.num_layers))
  plain = config.replace(relation_bias=False)
  plain_params = jax.tree.map(lambda x: x, params)
  for i in range(config.num_layers):
    del plain_params[f"layer_{i}"]["attn"]["relation_bias"]
  prompt, canvas, features = _tokens(12, (2, 82)), _tokens(13, (2, 81)), _sudoku_features()
  _, cache = model.encode(params, config, prompt, model.init_cache(config, 2, 82), position_features=features)
  _, plain_cache = model.encode(plain_params, plain, prompt, model.init_cache(plain, 2, 82),
                                position_features=features)
  np.testing.assert_allclose(model.denoise(params, config, canvas, cache, position_features=features),
                             model.denoise(plain_params, plain, canvas, plain_cache, position_features=features),
                             atol=1e-6)


def test_relation_bias_can_confine_attention_to_a_row():
  """A large weight on "same row" in every head of every layer confines attention to the query's row (each
  query sees itself, so it always has a same-row key): through the causal prompt pass and the denoiser, a
  canvas cell's logits then depend on its own row only, in the prompt and in the canvas."""
  config = _sudoku_relation_config()
  params = model.init_params(config, jax.random.key(8))
  for i in range(config.num_layers):
    weights = np.zeros(params[f"layer_{i}"]["attn"]["relation_bias"].shape, np.float32)
    weights[1] = 1e4  # features are (segment, row, column, box)
    params[f"layer_{i}"]["attn"]["relation_bias"] = jnp.asarray(weights)

  features = _sudoku_features()

  def canvas_logits(params, prompt, canvas):
    _, cache = model.encode(params, config, prompt, model.init_cache(config, 1, 82), position_features=features)
    return np.asarray(model.denoise(params, config, canvas, cache, position_features=features))[0].reshape(
        9, 9, -1)  # [row, column, V]

  prompt, canvas = _tokens(14, (1, 82)), _tokens(15, (1, 81))
  base = canvas_logits(params, prompt, canvas)
  for which, index, row in (("canvas", 3, 0), ("canvas", 9 * 7 + 2, 7), ("prompt", 1 + 9 * 5 + 8, 5)):
    tokens = canvas if which == "canvas" else prompt
    changed = tokens.at[0, index].set((tokens[0, index] + 1) % config.vocab_size)
    out = canvas_logits(params, changed, canvas) if which == "prompt" else canvas_logits(params, prompt, changed)
    others = [r for r in range(9) if r != row]
    np.testing.assert_allclose(out[others], base[others], atol=1e-6, err_msg=f"{which} cell {index}")
    assert np.abs(out[row] - base[row]).max() > 1e-4, f"{which} cell {index} should change its row"
  # Without the bias the same change reaches other rows: the confinement above is the bias's doing.
  plain = jax.tree.map(lambda x: x, params)  # a new dict tree over the same arrays
  for i in range(config.num_layers):
    plain[f"layer_{i}"]["attn"]["relation_bias"] = jnp.zeros_like(params[f"layer_{i}"]["attn"]["relation_bias"])
  changed = canvas.at[0, 3].set((canvas[0, 3] + 1) % config.vocab_size)
  assert np.abs(canvas_logits(plain, prompt, changed)[1:] - canvas_logits(plain, prompt, canvas)[1:]).max() > 1e-4


def test_relation_bias_config_errors():
  with pytest.raises(ValueError, match="needs num_position_features"):
    CONFIG.replace(relation_bias=True)
  with pytest.raises(ValueError, match="attention_impl='xla'"):
    _sudoku_relation_config(attention_impl="pallas")


@pytest.mark.parametrize("length", [1, 2, 7, 64, 160, 163])
def test_max_last_axis_is_the_max(length):
  """The halving-maxima max (attention softmax, sampler arg-max) equals jnp.max exactly, odd lengths, -inf and
  the masked logit included."""
  from dgemma.model.layers import max_last_axis
  x = np.random.default_rng(length).normal(size=(3, 5, length)).astype(np.float32)
  x[0, 0, :] = -np.inf
  x[1, 2, :] = -2.3819763e38  # every key masked
  x[2, 1, length // 2] = 1e30
  np.testing.assert_array_equal(jax.jit(max_last_axis)(x), np.max(x, axis=-1))
