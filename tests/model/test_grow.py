"""Depth growth (dgemma/grow.py, scripts/grow_model.py): the grown model computes the original's logits exactly,
and its new layers are trainable."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import checkpoints, grow, loading, model
from dgemma.config import GLOBAL, LOCAL, tiny_moe
from tests.script_loader import load_script

CONFIG = tiny_moe()  # local and global layers, dense GeGLU and MoE branches


@pytest.fixture(scope="module")
def params():
  """Random weights with every norm scale and layer scalar moved off 1, so that a copy that kept any of them
  would change the output."""
  base = model.init_params(CONFIG, jax.random.key(0))
  leaves, tree = jax.tree.flatten(base)
  keys = jax.random.split(jax.random.key(1), len(leaves))
  return jax.tree.unflatten(tree, [x + 0.3 * jax.random.normal(k, x.shape, x.dtype) for x, k in zip(leaves, keys)])


def _logits(params, config):
  rng = np.random.default_rng(0)
  prompt = jnp.asarray(rng.integers(0, config.vocab_size, (2, 7)), jnp.int32)
  canvas = jnp.asarray(rng.integers(0, config.vocab_size, (2, 8)), jnp.int32)
  encoded, cache = model.encode(params, config, prompt, model.init_cache(config, 2, 24))
  sc = jnp.asarray(rng.normal(size=(2, 8, config.vocab_size)), jnp.float32)
  return encoded, model.denoise(params, config, canvas, cache, sc)


def test_grown_model_computes_the_same_logits(params):
  grown_config, grown_params = grow.grow_depth(CONFIG, params, [0, 1, 1, 3])
  assert grown_config.num_layers == 8
  assert grown_config.layer_types == (LOCAL, LOCAL, GLOBAL, GLOBAL, GLOBAL, LOCAL, GLOBAL, GLOBAL)
  assert jax.tree.map(lambda a: a.shape, grown_params) == jax.tree.map(lambda s: s.shape,
                                                                       model.param_shapes(grown_config))
  for got, want in zip(_logits(grown_params, grown_config), _logits(params, CONFIG)):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  # The inserted layer is the layer before it, switched off; the original layers are untouched.
  # Layers 0, c0, 1, c1, c1, 2, 3, c3: an inserted layer is the one before it, switched off; originals untouched.
  np.testing.assert_array_equal(grown_params["layer_3"]["attn"]["q_proj"], params["layer_1"]["attn"]["q_proj"])
  np.testing.assert_array_equal(grown_params["layer_3"]["post_ffw_norm"]["scale"], 0.0)
  np.testing.assert_array_equal(grown_params["layer_3"]["layer_scalar"], 1.0)
  np.testing.assert_array_equal(grown_params["layer_5"]["layer_scalar"], params["layer_2"]["layer_scalar"])


def test_inserted_layers_get_gradients(params):
  """Zeroed output norms must not make the new block dead: their scales receive gradient from the first step."""
  grown_config, grown_params = grow.grow_depth(CONFIG, params, [2])

  def loss(p):
    return jnp.sum(_logits(p, grown_config)[1] ** 2)

  g = jax.grad(loss)(grown_params)["layer_3"]
  assert float(jnp.abs(g["post_attention_norm"]["scale"]).max()) > 0
  assert float(jnp.abs(g["post_ffw_norm"]["scale"]).max()) > 0


def test_bad_indices_are_one_line_errors(params):
  with pytest.raises(ValueError, match=r"out of range for a 4-layer model"):
    grow.grow_depth(CONFIG, params, [4])
  with pytest.raises(ValueError, match="insert_after is empty"):
    grow.grow_depth(CONFIG, params, [])


def test_script_writes_a_loadable_deeper_checkpoint(params, tmp_path, capsys):
  src, out = str(tmp_path / "src"), str(tmp_path / "grown")
  checkpoints.save_model(src, CONFIG, params, {"task": {"name": "demo"}})
  script = load_script("scripts/grow_model.py")
  assert script.main(["grow_model.py", f"--ckpt={src}", f"--out={out}"]) == 0
  config, grown, metadata = loading.load_model(out)  # checks the parameter shapes against the config
  assert config.num_layers == 2 * CONFIG.num_layers and metadata["task"] == {"name": "demo"}
  for got, want in zip(_logits(grown, config), _logits(params, CONFIG)):
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)
  assert script.main(["grow_model.py", f"--ckpt={src}", f"--out={out}", "--insert_after=1,9"]) == 1
  assert "out of range" in capsys.readouterr().err
  assert script.main(["grow_model.py", f"--ckpt={src}", f"--out={out}", "--insert_after=a"]) == 1
  assert "comma-separated" in capsys.readouterr().err
