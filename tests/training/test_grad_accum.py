"""Gradient accumulation (config.grad_accum_steps): the mean gradient of k microbatches, each with its own noise;
for a loss without randomness, the whole batch's gradient."""

import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import train
from configs import sft_sudoku
from dgemma import model
from dgemma.config import tiny_moe
from dgemma.diffusion import objective
from dgemma.diffusion.config import ObjectiveConfig
from dgemma.loading import load_model
from dgemma.training import state as state_lib

CONFIG = tiny_moe(canvas_length=4, num_layers=2, layer_types=("local", "global"))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _batch(rows=4):
  rng = np.random.default_rng(0)
  return {"prompt": jnp.asarray(rng.integers(3, 64, (rows, 5)), jnp.int32).at[1, 3:].set(0),
          "canvas": jnp.asarray(rng.integers(0, 64, (rows, 8)), jnp.int32),
          "canvas_mask": jnp.asarray(rng.random((rows, 8)) < 0.7, bool).at[:, 0].set(True)}


def _update(objective_config, k, batch, seed=3):
  """The step's gradient, read off an SGD update of learning rate 1 (new = old - grad), and its metrics."""
  params = model.init_params(CONFIG, jax.random.key(0))
  state = state_lib.create(params, optax.sgd(1.0), 0, jax.random.key(1))
  old = jax.tree.map(np.asarray, state.trainable)
  new, metrics = state_lib.make_train_step(CONFIG, objective_config, optax.sgd(1.0), seed, grad_accum_steps=k)(
      state, batch)
  return jax.tree.map(lambda a, b: a - np.asarray(b), old, new.trainable), jax.device_get(metrics), params


def _assert_trees_close(a, b, rtol=1e-5):
  """Leaf by leaf, to float32 rounding: of the leaf's scale, and of weights of order 1 (the update is read back as a
  difference of weights, exact to about one float32 ulp of 1, 1.2e-7)."""
  for (path, x), y in zip(jax.tree_util.tree_leaves_with_path(a), jax.tree.leaves(b), strict=True):
    y = np.asarray(y)
    np.testing.assert_allclose(np.asarray(x), y, rtol=rtol, atol=1e-5 * float(np.max(np.abs(y))) + 3e-7,
                               err_msg=jax.tree_util.keystr(path))


def test_microbatches_are_strided_and_cover_the_batch():
  x = jnp.arange(12).reshape(6, 2)
  m = state_lib.microbatches({"x": x}, 3)["x"]
  np.testing.assert_array_equal(m[1], np.asarray(x)[[1, 4]])
  assert sorted(np.asarray(m).reshape(-1, 2)[:, 0].tolist()) == sorted(np.asarray(x)[:, 0].tolist())
  with pytest.raises(ValueError, match="does not split into grad_accum_steps=4"):
    state_lib.microbatches({"x": x}, 4)


def test_accumulated_gradient_is_the_mean_of_the_microbatch_gradients():
  """The diffusion objective (random noise, self-conditioning, AR loss): the update equals the mean of the
  gradients of each microbatch computed on its own with its own key; the metrics are the microbatches' means
  (the per-noise-level sums and counts: their sums)."""
  cfg, batch, k, seed = ObjectiveConfig(), _batch(4), 2, 3
  grads, metrics, params = _update(cfg, k, batch, seed)
  rng = jax.random.fold_in(jax.random.key(seed), 0)  # step 0's key
  micro = state_lib.microbatches(batch, k)
  fn = jax.jit(jax.value_and_grad(lambda p, b, r: objective.loss_fn(p, CONFIG, cfg, b, r, 0), has_aux=True))
  results = [fn(params, jax.tree.map(lambda x: x[i], micro), state_lib.microbatch_rng(rng, i)) for i in range(k)]
  expected = jax.tree.map(lambda *g: np.mean(np.stack(g), 0), *[g for _, g in results])
  _assert_trees_close(grads, expected)
  for name in results[0][0][1]:
    parts = np.stack([np.asarray(r[0][1][name]) for r in results])
    want = parts.sum(0) if name.endswith(("_sum", "_count")) else parts.mean(0)
    np.testing.assert_allclose(metrics[name], want, rtol=1e-5, err_msg=name)
  np.testing.assert_allclose(metrics["grad_norm"], optax.tree.norm(expected), rtol=1e-5)
  assert metrics["loss_by_t_count"].sum() == 4  # every row counted once


def test_accumulation_of_a_deterministic_loss_gives_the_whole_batch_gradient():
  """objective=ar draws nothing at random, and its loss is a mean of per-row means: 1, 2 or 4 microbatches give the
  same update and the same loss."""
  cfg = ObjectiveConfig(diffusion_loss_weight=0.0, ar_loss_weight=1.0, ar_targets="canvas", self_cond_prob=0.0)
  batch = _batch(4)
  whole, whole_metrics, _ = _update(cfg, 1, batch)
  for k in (2, 4):
    grads, metrics, _ = _update(cfg, k, batch)
    _assert_trees_close(grads, whole)
    np.testing.assert_allclose(metrics["loss"], whole_metrics["loss"], rtol=1e-6)


def test_bad_accumulation_is_refused_in_one_line(tmp_path):
  with pytest.raises(ValueError, match="grad_accum_steps must be a positive integer"):
    state_lib.make_train_step(CONFIG, ObjectiveConfig(), optax.sgd(1.0), 0, grad_accum_steps=0)
  c = sft_sudoku.get_config("size=debug")
  c.data.cache_dir = str(tmp_path / "data")
  c.grad_accum_steps = 3  # the debug batch is 4
  with pytest.raises(ValueError, match=r"^config.batch_size=4 does not split into config.grad_accum_steps=3 equal "
                                       r"microbatches: choose a divisor of the batch size$"):
    train.train(c, str(tmp_path / "run"))
  assert not os.path.exists(tmp_path / "run")


def test_accumulating_run_resumes_bit_identically(tmp_path):
  c = sft_sudoku.get_config("size=debug")  # 6 steps, a checkpoint every 3
  c.data.cache_dir = str(tmp_path / "data")
  c.grad_accum_steps = 2
  scalars = train.train(c, str(tmp_path / "straight"))
  assert np.isfinite(scalars["loss"])
  train.train(c, str(tmp_path / "resumed"), stop_at_step=4)
  train.train(c, str(tmp_path / "resumed"))
  a, b = load_model(str(tmp_path / "straight" / "model"))[1], load_model(str(tmp_path / "resumed" / "model"))[1]
  assert jax.tree.all(jax.tree.map(lambda x, y: bool(np.array_equal(x, y)), a, b))


_MESH_SCRIPT = """
import sys, jax, numpy as np, train
from tests.sharding import common
c = common.config(sys.argv[1], mesh={"data": 2}, steps=2)
c.grad_accum_steps = 2
losses, (_, params), _ = common.run_steps(c)
np.savez(sys.argv[2], losses=np.asarray(losses), **{jax.tree_util.keystr(p): np.asarray(x)
         for p, x in jax.tree_util.tree_flatten_with_path(params)[0]})
"""


def test_accumulation_on_a_two_device_mesh_matches_one_device(tmp_path):
  """The microbatches of a batch split over 2 data-parallel devices (strided: each device keeps its rows) give the
  single device's steps."""
  from tests.sharding import common
  out2 = tmp_path / "two.npz"
  subprocess.run([common.PYTHON, "-c", _MESH_SCRIPT, str(tmp_path / "data2"), str(out2)], cwd=ROOT, check=True,
                 env=common.subprocess_env(2), timeout=400)
  c = common.config(str(tmp_path / "data1"), steps=2)
  c.grad_accum_steps = 2
  losses, (_, params), _ = common.run_steps(c)
  with np.load(out2) as two:
    np.testing.assert_allclose(two["losses"], np.asarray(losses), rtol=1e-5)
    for path, x in jax.tree_util.tree_flatten_with_path(params)[0]:
      np.testing.assert_allclose(two[jax.tree_util.keystr(path)], np.asarray(x), rtol=1e-4, atol=1e-6)
