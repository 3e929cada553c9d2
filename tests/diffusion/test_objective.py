"""The block-diffusion objective: canvas selection, loss masks, and the training view of the cache."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import tiny_moe
from dgemma.diffusion import corruption, losses, objective
from dgemma.diffusion.config import ObjectiveConfig
from dgemma.model.transformer import DiffusionGemma

CONFIG = tiny_moe(canvas_length=4, num_layers=2, layer_types=("local", "global"))


def jit_loss(cfg):
  """objective.loss_fn under jit for one objective config: dispatched op by op, a loss and its gradient took
  minutes on 2 cores (bad configs still raise, while tracing)."""
  return jax.jit(lambda params, batch, key: objective.loss_fn(params, CONFIG, cfg, batch, key))


def _cfg(**kw):
  """The official objective without self-conditioning unless asked (most tests check one piece at a time)."""
  return ObjectiveConfig(**{"self_cond_prob": 0.0, **kw})


def test_select_canvas_only_picks_non_empty_canvases():
  mask = np.zeros((3, 12), bool)
  mask[0, :4] = True  # one valid canvas
  mask[1, :10] = True  # three valid canvases (the last partly)
  # row 2: no valid canvas -> n_valid = 1 -> s = 0
  s = np.stack([np.asarray(objective.select_canvas(jax.random.key(i), jnp.asarray(mask), 4)) for i in range(200)])
  assert set(s[:, 0]) == {0} and set(s[:, 2]) == {0}
  assert set(s[:, 1]) == {0, 1, 2}


def test_take_canvas():
  x = jnp.arange(24).reshape(2, 12)
  np.testing.assert_array_equal(objective.take_canvas(x, jnp.asarray([2, 1]), 4), [[8, 9, 10, 11], [16, 17, 18, 19]])


def test_training_view_equals_sampler_view():
  """Denoising canvas s against the cache of [prompt ‖ all clean canvases] seen up to P + s·C gives the
  sampler's logits: encode [prompt ‖ canvases < s], then denoise."""
  params = model.init_params(CONFIG, jax.random.key(0))
  rng = np.random.default_rng(0)
  prompt = jnp.asarray(rng.integers(3, 64, (2, 5)), jnp.int32).at[0, 4].set(0)  # row 0 right-padded
  prompt_valid = prompt != 0
  canvases = jnp.asarray(rng.integers(0, 64, (2, 12)), jnp.int32)
  noisy = jnp.asarray(rng.integers(0, 64, (2, 4)), jnp.int32)
  m = DiffusionGemma(CONFIG)
  full = jnp.concatenate([prompt, canvases], 1)
  valid = jnp.concatenate([prompt_valid, jnp.ones((2, 12), bool)], 1)
  s = 2

  @jax.jit
  def train_view_fn(params):
    _, cache = m.apply({"params": params}, full, model.init_cache(CONFIG, 2, 17), valid, method=m.encode)
    return m.apply({"params": params}, noisy, cache.with_end(jnp.full((2,), 5 + s * 4)), method=m.denoise)

  train_view = train_view_fn(params)
  _, prefix = model.encode(params, CONFIG, full[:, :5 + s * 4], model.init_cache(CONFIG, 2, 17), valid[:, :5 + s * 4])
  sampler_view = model.denoise(params, CONFIG, noisy, prefix)
  np.testing.assert_allclose(train_view, sampler_view, atol=1e-5)


@pytest.mark.parametrize("self_cond_prob,passes", [(0.0, 1), (0.5, 1), (0.5, 3), (1.0, 2)])
def test_diffusion_loss_covers_exactly_canvas_s(self_cond_prob, passes):
  """The diffusion loss equals the CE of canvas s's clean tokens given its noisy version, masked by
  canvas_mask, recomputed example by example with the sampler-style prefix cache. With self-conditioning, the
  chosen rows are denoised twice, as the sampler's first two steps: no signal, then the first pass's logits
  (with `self_cond_passes` = 3, two more passes feeding each its predecessor's logits come before the scored
  one)."""
  params = model.init_params(CONFIG, jax.random.key(1))
  # A strong self-conditioning branch, so that the number of passes shows in the loss.
  params["self_conditioning"]["mlp"] = jax.tree_util.tree_map(lambda w: 30 * w, params["self_conditioning"]["mlp"])
  rng = np.random.default_rng(1)
  batch = {"prompt": jnp.asarray(rng.integers(3, 64, (4, 5)), jnp.int32),
           "canvas": jnp.asarray(rng.integers(3, 64, (4, 8)), jnp.int32),
           "canvas_mask": jnp.asarray([[1, 1, 1, 1, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0],
                                       [1] * 8, [1, 1, 1, 1, 1, 0, 0, 0]], bool)}
  key = jax.random.key(7)
  cfg = _cfg(self_cond_prob=self_cond_prob, self_cond_passes=passes)
  _, metrics = jax.jit(lambda p: objective.loss_fn(p, CONFIG, cfg, batch, key))(params)
  t_rng, noise_rng, s_rng, sc_rng = jax.random.split(key, 4)
  t = corruption.sample_t(t_rng, 4, 1e-4)
  x_t, _ = corruption.corrupt(noise_rng, batch["canvas"], 1.0 - t, CONFIG.vocab_size)
  s = objective.select_canvas(s_rng, batch["canvas_mask"], 4)
  assert int(s[1]) == 0  # row 1 has one valid canvas
  sc_rows = set(np.asarray(objective.self_conditioning_rows(sc_rng, 4, self_cond_prob)).tolist()
                if self_cond_prob else [])
  assert len(sc_rows) == round(4 * self_cond_prob)
  expected = []
  for b in range(4):
    sb = int(s[b])
    prefix_len = 5 + 4 * sb
    full = jnp.concatenate([batch["prompt"], batch["canvas"]], 1)[b:b + 1]
    _, cache = model.encode(params, CONFIG, full[:, :prefix_len], model.init_cache(CONFIG, 1, 13))
    x0 = batch["canvas"][b:b + 1, 4 * sb:4 * sb + 4]
    noisy = x_t[b:b + 1, 4 * sb:4 * sb + 4]
    logits = model.denoise(params, CONFIG, noisy, cache)
    if b in sc_rows:
      for _ in range(passes):
        logits = model.denoise(params, CONFIG, noisy, cache, logits)
    ce = losses.token_cross_entropy(logits, x0)[0]
    mask = batch["canvas_mask"][b, 4 * sb:4 * sb + 4]
    expected.append(float(jnp.sum(ce * mask) / jnp.sum(mask)))
  np.testing.assert_allclose(float(metrics["diffusion_loss"]), np.mean(expected), rtol=1e-4)


def test_self_conditioning_rows_are_a_random_share_of_the_batch():
  rows = [tuple(np.asarray(objective.self_conditioning_rows(jax.random.key(i), 10, 0.5))) for i in range(50)]
  assert all(len(r) == 5 and len(set(r)) == 5 and list(r) == sorted(r) and 0 <= r[0] and r[-1] < 10 for r in rows)
  assert len(set(rows)) > 40  # different draws pick different rows
  counts = np.bincount(np.concatenate(rows), minlength=10)
  assert counts.min() > 10  # every row gets its turn (expected 25 each)
  assert len(objective.self_conditioning_rows(jax.random.key(0), 3, 0.01)) == 1
  assert len(objective.self_conditioning_rows(jax.random.key(0), 3, 1.0)) == 3


def test_gradients_flow_to_every_trained_weight():
  params = model.init_params(CONFIG, jax.random.key(2))
  rng = np.random.default_rng(2)
  batch = {"prompt": jnp.asarray(rng.integers(3, 64, (2, 5)), jnp.int32),
           "canvas": jnp.asarray(rng.integers(3, 64, (2, 4)), jnp.int32),
           "canvas_mask": jnp.ones((2, 4), bool)}
  grads = jax.jit(jax.grad(lambda p: objective.loss_fn(p, CONFIG, _cfg(self_cond_prob=1.0), batch, jax.random.key(0))[0]))(params)
  zero = [jax.tree_util.keystr(path) for path, g in jax.tree_util.tree_flatten_with_path(grads)[0]
          if float(jnp.abs(g).max()) == 0.0]
  assert not zero, zero


def test_autoregressive_baseline_loss_is_the_canvas_next_token_ce():
  """diffusion weight 0 + ar_targets='canvas': the loss is the causal CE of the canvas tokens only, recomputed
  from one encode pass; no diffusion metrics (the denoiser is not run)."""
  params = model.init_params(CONFIG, jax.random.key(3))
  rng = np.random.default_rng(3)
  batch = {"prompt": jnp.asarray(rng.integers(3, 64, (2, 5)), jnp.int32),
           "canvas": jnp.asarray(rng.integers(3, 64, (2, 8)), jnp.int32),
           "canvas_mask": jnp.asarray([[1] * 8, [1] * 5 + [0] * 3], bool)}
  cfg = _cfg(diffusion_loss_weight=0.0, ar_targets="canvas")
  loss, metrics = jit_loss(cfg)(params, batch, jax.random.key(0))
  assert "diffusion_loss" not in metrics and "loss_by_t_sum" not in metrics
  expected = []
  for b in range(2):
    full = jnp.concatenate([batch["prompt"], batch["canvas"]], 1)[b:b + 1]
    logits, _ = model.encode(params, CONFIG, full, model.init_cache(CONFIG, 1, 13))
    n = int(batch["canvas_mask"][b].sum())
    # Position 4 (last prompt token) predicts canvas token 0, ..., position 4+n-1 predicts canvas token n-1.
    ce = losses.token_cross_entropy(logits[:, 4:4 + n], full[:, 5:5 + n])
    expected.append(float(jnp.mean(ce)))
  np.testing.assert_allclose(float(loss), np.mean(expected), rtol=1e-5)


def test_ordered_noise_needs_a_rank_and_trains_with_one():
  params = model.init_params(CONFIG, jax.random.key(0))
  rng = np.random.default_rng(0)
  batch = {"prompt": jnp.asarray(rng.integers(3, 64, (2, 5)), jnp.int32),
           "canvas": jnp.asarray(rng.integers(3, 64, (2, 4)), jnp.int32), "canvas_mask": jnp.ones((2, 4), bool)}
  cfg = _cfg(ar_loss_weight=0.0, ordered_noise_prob=1.0)
  with pytest.raises(ValueError, match="noise_rank"):
    objective.loss_fn(params, CONFIG, cfg, batch, jax.random.key(1))
  batch["noise_rank"] = jnp.asarray([[0, 1, 2, 3], [3, 2, 1, 0]], jnp.float32)
  loss, _ = jit_loss(cfg)(params, batch, jax.random.key(1))
  plain, _ = jit_loss(_cfg(ar_loss_weight=0.0))(params, batch, jax.random.key(1))
  assert np.isfinite(loss) and loss != plain  # the ranked corruption changed the noisy canvas


def test_train_step_draws_noise_levels_with_the_tilt_of_its_step():
  """With a noise-level curriculum (t_tilt over t_tilt_steps) the train step's loss-by-noise-level counts are
  those of t drawn with the tilt of the state's own step: the step reaches the objective."""
  import optax
  from dgemma.training import state as state_lib
  params = model.init_params(CONFIG, jax.random.key(1))
  rng = np.random.default_rng(2)
  b = 64
  batch = {"prompt": jnp.asarray(rng.integers(3, 64, (b, 5)), jnp.int32),
           "canvas": jnp.asarray(rng.integers(3, 64, (b, 4)), jnp.int32), "canvas_mask": jnp.ones((b, 4), bool)}
  cfg = _cfg(ar_loss_weight=0.0, t_tilt=4.0, t_tilt_steps=10)
  tx = optax.sgd(0.0)
  step_fn = state_lib.make_train_step(CONFIG, cfg, tx, seed=5)
  counts = {}
  for step in (0, 5, 10):
    state = state_lib.create(jax.tree.map(jnp.copy, params), tx, 0, jax.random.key(0))  # the step donates it
    _, metrics = step_fn(state.replace(step=jnp.asarray(step, state.step.dtype)), batch)
    t_rng = jax.random.split(jax.random.fold_in(jax.random.key(5), step), 4)[0]
    t = np.asarray(corruption.sample_t(t_rng, b, 1e-4, 4.0 * min(1.0, step / 10)))
    expected = np.bincount(np.minimum((t * 10).astype(int), 9), minlength=10)
    np.testing.assert_array_equal(np.asarray(metrics["loss_by_t_count"]), expected)
    counts[step] = expected
  # The tilt moves draws to heavy noise: at full tilt (density ~ t^4) most fall in t > 0.7.
  assert counts[10][7:].sum() > counts[0][7:].sum() + 15


@pytest.mark.parametrize("self_cond_prob,ar_weight", [(0.0, 1.0), (1.0, 0.0)])
def test_noise_draws_equal_a_batch_of_repeated_examples(self_cond_prob, ar_weight):
  """noise_draws=k shares one prompt encoding among k noisy copies of each example: loss and gradients equal
  those of the batch with every example written k times (consecutively), drawn with the same key; only the
  encoder's work differs. The AR loss is the encoder's, so it is the same either way."""
  params = model.init_params(CONFIG, jax.random.key(4))
  rng = np.random.default_rng(4)
  b, k = 3, 2
  batch = {"prompt": jnp.asarray(rng.integers(3, 64, (b, 5)), jnp.int32),
           "canvas": jnp.asarray(rng.integers(3, 64, (b, 8)), jnp.int32),
           "canvas_mask": jnp.asarray([[1] * 8, [1] * 5 + [0] * 3, [1] * 8], bool)}
  repeated = {key: jnp.repeat(value, k, axis=0) for key, value in batch.items()}
  cfg = dict(self_cond_prob=self_cond_prob, self_cond_passes=2, ar_loss_weight=ar_weight)
  # Jitted, as jit_loss.
  grad = lambda c, bt: jax.jit(jax.value_and_grad(
      lambda p, bt: objective.loss_fn(p, CONFIG, c, bt, jax.random.key(9)), has_aux=True))(params, bt)
  (loss_k, metrics_k), grads_k = grad(_cfg(noise_draws=k, **cfg), batch)
  (loss_rep, metrics_rep), grads_rep = grad(_cfg(**cfg), repeated)
  np.testing.assert_allclose(float(loss_k), float(loss_rep), rtol=1e-6)
  np.testing.assert_array_equal(np.asarray(metrics_k["loss_by_t_count"]), np.asarray(metrics_rep["loss_by_t_count"]))
  assert int(np.asarray(metrics_k["loss_by_t_count"]).sum()) == b * k  # every copy drew its own noise level
  # The two sides sum the same terms in another order (the k copies' cache gradients before or inside the
  # encoder's backward), so an element's rounding error scales with the gradient's terms, not with the element:
  # elements that cancel to ~0 (the last layer's scalar feeds a scale-invariant norm) carry the error of the
  # large ones. One tolerance for the whole tree, from its largest element, as in test_moe_dense.
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads_rep))
  for (path, g_k), g_rep in zip(jax.tree_util.tree_leaves_with_path(grads_k), jax.tree.leaves(grads_rep)):
    np.testing.assert_allclose(np.asarray(g_k), np.asarray(g_rep), rtol=1e-4, atol=1e-5 * scale,
                               err_msg=jax.tree_util.keystr(path))


def test_without_cache_gradient_the_encoder_pass_is_a_constant():
  """cache_gradient=False: the loss is unchanged and its gradient is the recomputed denoiser loss's gradient with
  the sampler-style prefix cache built from the same weights outside the differentiation (a constant)."""
  params = model.init_params(CONFIG, jax.random.key(3))
  rng = np.random.default_rng(3)
  batch = {"prompt": jnp.asarray(rng.integers(3, 64, (3, 5)), jnp.int32),
           "canvas": jnp.asarray(rng.integers(3, 64, (3, 8)), jnp.int32),
           "canvas_mask": jnp.asarray([[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0], [1] * 6 + [0, 0]], bool)}
  key = jax.random.key(5)
  value_and_grad = lambda cfg: jax.jit(jax.value_and_grad(
      lambda p: objective.loss_fn(p, CONFIG, cfg, batch, key)[0]))(params)
  loss_frozen, grads_frozen = value_and_grad(_cfg(ar_loss_weight=0.0, cache_gradient=False))
  loss_full, grads_full = value_and_grad(_cfg(ar_loss_weight=0.0))

  t_rng, noise_rng, s_rng, _ = jax.random.split(key, 4)
  t = corruption.sample_t(t_rng, 3, 1e-4)
  x_t, _ = corruption.corrupt(noise_rng, batch["canvas"], 1.0 - t, CONFIG.vocab_size)
  s = [int(v) for v in np.asarray(objective.select_canvas(s_rng, batch["canvas_mask"], 4))]
  full = jnp.concatenate([batch["prompt"], batch["canvas"]], 1)
  caches = []
  for b in range(3):  # each row's prefix cache, from the weights as they are: no gradient reaches it
    prefix_len = 5 + 4 * s[b]
    caches.append(model.encode(params, CONFIG, full[b:b + 1, :prefix_len], model.init_cache(CONFIG, 1, 13))[1])

  def recomputed(p):
    per_row = []
    for b in range(3):
      sb = s[b]
      logits = model.denoise(p, CONFIG, x_t[b:b + 1, 4 * sb:4 * sb + 4], caches[b])
      ce = losses.token_cross_entropy(logits, batch["canvas"][b:b + 1, 4 * sb:4 * sb + 4])[0]
      mask = batch["canvas_mask"][b, 4 * sb:4 * sb + 4]
      per_row.append(jnp.sum(ce * mask) / jnp.sum(mask))
    return jnp.mean(jnp.stack(per_row))

  loss_expected, grads_expected = jax.jit(jax.value_and_grad(recomputed))(params)
  np.testing.assert_allclose(float(loss_frozen), float(loss_expected), rtol=1e-5)
  np.testing.assert_allclose(float(loss_full), float(loss_frozen), rtol=1e-6)
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree.leaves(grads_expected))
  for (path, g), g_expected in zip(jax.tree_util.tree_leaves_with_path(grads_frozen), jax.tree.leaves(grads_expected)):
    np.testing.assert_allclose(np.asarray(g), np.asarray(g_expected), rtol=1e-4, atol=1e-5 * scale,
                               err_msg=jax.tree_util.keystr(path))
  # The knob matters: with the cache's gradient the encoder pass adds to the same weights.
  difference = max(float(jnp.max(jnp.abs(a - b))) for a, b in zip(jax.tree.leaves(grads_full),
                                                                   jax.tree.leaves(grads_frozen)))
  assert difference > 1e-3 * scale
