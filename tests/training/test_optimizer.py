"""The Muon option: which parameters it orthogonalises (by logical axes), and Adam for the rest."""

import jax
import jax.numpy as jnp
import ml_collections
import numpy as np
import optax
import pytest

import train
from configs import sft_sudoku
from dgemma.training import optimizer


def _cfg(name):
  return ml_collections.ConfigDict(dict(
      name=name, learning_rate=1.0, end_learning_rate=1.0, warmup_steps=0, decay_steps=10, b1=0.9, b2=0.99,
      eps=1e-8, weight_decay=0.0, grad_clip_norm=1e9))


def _first_update(tx, params, grads):
  return tx.update(grads, tx.init(params), params)[0]


def _polar(m):  # the exact orthogonal factor U V^T of m = U S V^T, which Newton-Schulz approximates
  u, _, vt = np.linalg.svd(np.asarray(m, np.float64), full_matrices=False)
  return u @ vt


def _cosine(x, y):
  x, y = np.ravel(np.asarray(x, np.float64)), np.ravel(np.asarray(y, np.float64))
  return abs(x @ y) / np.linalg.norm(x) / np.linalg.norm(y)


def _params():
  c = sft_sudoku.get_config("size=debug")
  c.model.update(dict(width=64, num_heads=2, mlp_hidden=96))  # q/k/v [64, 2, 32]: 64 x 64 as a matrix
  return train.build_model(c)[1]


def test_weight_matrices_get_orthogonalised_updates_in_their_input_output_grouping():
  """Muon's first update of a weight points along the polar factor of its gradient viewed as the matrix
  [inputs, outputs] that multiplies the activations (brute force: SVD), not along the raw gradient nor along
  the polar factor of another grouping of the same axes."""
  params = _params()
  grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(p.size), p.shape), params)
  update = _first_update(optimizer.make_optimizer(_cfg("muon")), params, grads)["layer_0"]
  g = grads["layer_0"]
  width = params["embedder"]["embedding"].shape[1]
  as_matrix = {  # from the model's einsums: x[D] @ q[D, H, K], o[H, K, D], x @ up[D, F], h @ down[F, D]
      ("attn", "q_proj"): lambda w: w.reshape(width, -1), ("attn", "k_proj"): lambda w: w.reshape(width, -1),
      ("attn", "o_proj"): lambda w: w.reshape(-1, width), ("mlp", "up"): lambda w: w,
      ("mlp", "gate"): lambda w: w, ("mlp", "down"): lambda w: w}
  for (block, name), to_matrix in as_matrix.items():
    grad, got = np.asarray(g[block][name]), update[block][name]
    expected = _polar(to_matrix(grad)).reshape(grad.shape)
    assert _cosine(got, expected) > 0.97, name
    assert _cosine(got, grad) < 0.92, name  # the property is not automatic
  q = np.asarray(g["attn"]["q_proj"])  # [D, H, K] grouped as [D * H, K]
  assert _cosine(update["attn"]["q_proj"], _polar(q.reshape(-1, q.shape[-1])).reshape(q.shape)) < 0.9


def test_everything_else_gets_adam():
  """Embeddings, norm scales, layer scalars and the relation bias are updated exactly as by optax's AdamW."""
  params = _params()
  grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(p.size + 1), p.shape), params)
  c = _cfg("muon")
  got = _first_update(optimizer.make_optimizer(c), params, grads)
  expected = _first_update(optax.adamw(1.0, b1=c.b1, b2=c.b2, eps=c.eps, weight_decay=0.0, nesterov=True),
                           params, grads)
  numbers = optimizer.muon_dimension_numbers(params)
  is_leaf = lambda x: x is None or isinstance(x, optax.contrib.MuonDimensionNumbers)
  flat_numbers = jax.tree.leaves(numbers, is_leaf=is_leaf)
  adam_leaves = [(g, e) for n, g, e in zip(flat_numbers, jax.tree.leaves(got), jax.tree.leaves(expected))
                 if n is None]
  assert len(adam_leaves) >= 5 and len(adam_leaves) < len(flat_numbers)
  for g, e in adam_leaves:
    np.testing.assert_allclose(g, e, rtol=1e-5, atol=1e-7)
  assert numbers["embedder"]["embedding"] is None and numbers["layer_0"]["attn"]["relation_bias"] is None


def test_expert_axis_is_a_batch_axis():
  """[E, D, F] expert weights: each expert's [D, F] matrix is orthogonalised on its own."""
  params = {"layer_0": {"moe": {"gate_up": jnp.zeros((3, 16, 24)), "down": jnp.zeros((3, 12, 16))}}}
  grads = jax.tree.map(lambda p: jax.random.normal(jax.random.key(p.ndim + p.size), p.shape), params)
  update = _first_update(optimizer.make_optimizer(_cfg("muon")), params, grads)["layer_0"]["moe"]
  for name in ("gate_up", "down"):
    for e in range(3):
      assert _cosine(update[name][e], _polar(grads["layer_0"]["moe"][name][e])) > 0.97, (name, e)


def test_unknown_optimizer_is_one_clear_error():
  with pytest.raises(ValueError, match="unknown optimizer 'sgd'.*'muon'"):
    optimizer.make_optimizer(_cfg("sgd"))


@pytest.mark.parametrize("name", ["adam", "muon"])
def test_lr_multipliers_scale_exactly_the_named_parameters(name):
  """optimizer.lr_multipliers: the named leaves' updates are the plain optimizer's times the factor (relation_bias
  is in every layer), every other leaf's update is unchanged, and a name no parameter has is one clear error."""
  params = _params()
  grads = jax.tree.map(lambda p: jnp.asarray(np.random.default_rng(p.size).normal(size=p.shape), p.dtype), params)
  plain = _first_update(optimizer.make_optimizer(_cfg(name)), params, grads)
  c = _cfg(name)
  c.lr_multipliers = ml_collections.ConfigDict(dict(relation_bias=7.0))
  scaled = _first_update(optimizer.make_optimizer(c), params, grads)
  named = 0
  for (path, got), want in zip(jax.tree_util.tree_flatten_with_path(scaled)[0], jax.tree.leaves(plain)):
    is_named = path[-1].key == "relation_bias"
    named += is_named
    np.testing.assert_allclose(got, want * (7.0 if is_named else 1.0), rtol=1e-6)
  assert named == len([k for k in params if k.startswith("layer_")])  # one relation bias per layer
  c.lr_multipliers = ml_collections.ConfigDict(dict(relation_bais=7.0))
  with pytest.raises(ValueError, match="lr_multipliers names \\['relation_bais'\\], which no trainable parameter"):
    optimizer.make_optimizer(c).init(params)
