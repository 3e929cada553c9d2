"""The chunked losses (diffusion.loss_chunk_tokens > 0) against the whole-logits ones: the same loss, metrics and
gradients to float tolerance, whatever the chunk (one that does not divide the tokens, one larger than them)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import tiny_moe
from dgemma.diffusion import chunked, objective
from dgemma.diffusion.config import ObjectiveConfig

# 67: a vocabulary that no chunk below divides; the softcap (tiny_moe's 30) and its absence (Gemma 3) both covered.
CONFIGS = {"softcap": tiny_moe(vocab_size=67, canvas_length=4, num_layers=2, layer_types=("local", "global")),
           "no_softcap": tiny_moe(vocab_size=67, canvas_length=4, num_layers=2, layer_types=("local", "global"),
                                  final_softcap=None, num_experts=0)}
OBJECTIVES = {
    "official": ObjectiveConfig(),  # flat CE, AR loss on [prompt ‖ canvas], self-conditioning on half the rows
    "elbo_sc_passes": ObjectiveConfig(loss="elbo", self_cond_prob=1.0, self_cond_passes=2, ar_loss_weight=0.0,
                                      noise_draws=2),
    "elbo_full": ObjectiveConfig(loss="elbo_full", ar_loss_weight=0.0, noise_draws=2),
    "ar": ObjectiveConfig(diffusion_loss_weight=0.0, ar_loss_weight=1.0, ar_targets="canvas", self_cond_prob=0.0),
}


def _batch(vocab):
  rng = np.random.default_rng(3)
  prompt = jnp.asarray(rng.integers(3, vocab, (3, 5)), jnp.int32).at[1, 4].set(0)  # row 1 right-padded
  return {"prompt": prompt, "canvas": jnp.asarray(rng.integers(0, vocab, (3, 8)), jnp.int32),
          "canvas_mask": jnp.asarray([[1] * 8, [1, 1, 1, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 1, 0, 0]], bool)}


def test_map_token_chunks_equals_the_whole_function():
  x = jnp.arange(23 * 3, dtype=jnp.float32).reshape(23, 3)
  y = jnp.arange(23)
  fn = lambda a, b: (jnp.sum(a * a, -1) + b, a[:, ::-1])
  for chunk in (1, 5, 23, 100):
    got = chunked.map_token_chunks(fn, chunk, x, y)
    np.testing.assert_array_equal(got[0], fn(x, y)[0])
    np.testing.assert_array_equal(got[1], fn(x, y)[1])
  with pytest.raises(ValueError, match="chunk_tokens"):
    chunked.map_token_chunks(fn, 0, x, y)


@pytest.mark.parametrize("model_name", sorted(CONFIGS))
@pytest.mark.parametrize("objective_name", sorted(OBJECTIVES))
def test_chunked_loss_and_gradients_equal_the_whole_logits_ones(model_name, objective_name):
  config = CONFIGS[model_name]
  params = model.init_params(config, jax.random.key(0))
  # A strong self-conditioning branch, so that a wrong self-conditioning input shows in the loss.
  params["self_conditioning"]["mlp"] = jax.tree.map(lambda w: 30 * w, params["self_conditioning"]["mlp"])
  batch, key = _batch(config.vocab_size), jax.random.key(5)

  def run(chunk):
    cfg = OBJECTIVES[objective_name].replace(loss_chunk_tokens=chunk)
    fn = jax.jit(jax.value_and_grad(lambda p: objective.loss_fn(p, config, cfg, batch, key, 3), has_aux=True))
    return fn(params)

  (loss, metrics), grads = run(0)
  assert np.isfinite(float(loss)) and float(loss) > 0
  for chunk in (7, 1000):  # 7 divides neither the denoiser's tokens (3·2·4) nor the encoder's; 1000 > all of them
    (loss_c, metrics_c), grads_c = run(chunk)
    np.testing.assert_allclose(float(loss_c), float(loss), rtol=1e-5)
    assert sorted(metrics_c) == sorted(metrics)
    for k in metrics:
      np.testing.assert_allclose(np.asarray(metrics_c[k]), np.asarray(metrics[k]), rtol=1e-5, atol=1e-6, err_msg=k)
    flat, flat_c = jax.tree_util.tree_leaves_with_path(grads), jax.tree.leaves(grads_c)
    assert len(flat) == len(flat_c)
    for (path, g), g_c in zip(flat, flat_c):
      # Chunking reorders float32 sums: an element that is a small difference of large terms moves by rounding
      # of the array's scale, not its own (seen: 2.4e-6 on 5.4e-3 in an embedding gradient of scale 0.45, on an
      # AMD EPYC host). A wrong chunk would move elements by their own size.
      scale = float(jnp.max(jnp.abs(g)))
      np.testing.assert_allclose(np.asarray(g_c), np.asarray(g), rtol=1e-4, atol=max(1e-6, 1e-5 * scale),
                                 err_msg=jax.tree_util.keystr(path))
    assert any(float(jnp.max(jnp.abs(g))) > 0 for g in jax.tree.leaves(grads_c))
