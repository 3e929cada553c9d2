"""The model gives the same logits (and training gradients) with the `xla` and `pallas` implementations.

Wiring: the model's hooks already route `attention_impl="pallas"` to `pallas_kernels.attention.attention` and
`moe_impl="pallas"` to `pallas_kernels.moe.moe_experts`. The attention kernel needs structured masks, which
`dgemma/model/transformer.py` builds once the proposed change is applied (it swaps
`masks.encoder_mask`/`masks.denoiser_mask` for `AttentionMask.causal`/`AttentionMask.denoiser`, which take the
same arguments). Until then this test makes exactly that swap with monkeypatch, for the Pallas run only
(after it, the patch is redundant and harmless).
Small kernel tiles are patched in too, so the model's masks really span several blocks (and skip some).
"""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import GLOBAL, LOCAL, tiny_moe
from dgemma.model import masks
from dgemma.model.transformer import DiffusionGemma
from pallas_kernels import attention as attention_kernels
from pallas_kernels import moe as moe_kernels
from pallas_kernels.mask_spec import AttentionMask

XLA = tiny_moe()
PALLAS = tiny_moe(attention_impl="pallas", moe_impl="pallas")
TOL = dict(atol=2e-5, rtol=2e-5)


@pytest.fixture(scope="module")
def params():
  return model.init_params(XLA, jax.random.key(0))


@pytest.fixture
def structured_masks(monkeypatch):
  """What the transformer.py change does when attention_impl == "pallas" (same call signatures)."""
  def model_with_masks(fn):
    def run(*args):
      with monkeypatch.context() as m:
        m.setattr(masks, "encoder_mask", AttentionMask.causal)
        m.setattr(masks, "denoiser_mask", AttentionMask.denoiser)
        m.setattr(attention_kernels, "default_block_sizes",
                  lambda h: attention_kernels.BlockSizes(block_q=4, block_k=4, block_q_bwd=4, block_k_bwd=8))
        m.setattr(moe_kernels, "DEFAULT_TILING", moe_kernels.GmmTiling(block_m=8, block_c=8, block_o=8))
        return fn(*args)
    return run
  return model_with_masks


def _tokens(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).integers(3, XLA.vocab_size, shape), jnp.int32)


def _encode(config, params, tokens, cache, token_valid):
  return DiffusionGemma(config).apply({"params": params}, tokens, cache, token_valid,
                                      method=DiffusionGemma.encode)


def _denoise(config, params, canvas, cache, sc_logits):
  return DiffusionGemma(config).apply({"params": params}, canvas, cache, sc_logits,
                                      method=DiffusionGemma.denoise)


def _sampling_pass(config, params, prompt, prompt_valid, canvas, canvas_valid, sc_logits):
  """Prefill a right-padded prompt, denoise a canvas (self-conditioned), commit it, denoise the next one.

  Prompt and canvas have the same length, so each jitted pass compiles once and runs twice.
  """
  encode = jax.jit(functools.partial(_encode, config))
  denoise = jax.jit(functools.partial(_denoise, config))
  cache = model.init_cache(config, prompt.shape[0], 24)
  prompt_logits, cache = encode(params, prompt, cache, prompt_valid)
  first = denoise(params, canvas, cache, sc_logits)
  commit_logits, cache = encode(params, canvas, cache, canvas_valid)
  second = denoise(params, canvas, cache, first)
  return prompt_logits, commit_logits, first, second, cache


def test_sampling_logits_match(params, structured_masks):
  prompt, canvas = _tokens(0, (2, 8)), _tokens(1, (2, 8))
  # Row 1: a 2-token prompt (its last padded queries see no valid key in the 4-token window: empty rows) and
  # a canvas committed with 3 padding tokens at the end.
  prompt_valid = jnp.asarray([[True] * 8, [True] * 2 + [False] * 6])
  canvas_valid = jnp.asarray([[True] * 8, [True] * 5 + [False] * 3])
  sc_logits = jax.random.normal(jax.random.key(1), (2, 8, XLA.vocab_size))
  inputs = (prompt, prompt_valid, canvas, canvas_valid, sc_logits)
  xla = _sampling_pass(XLA, params, *inputs)
  pallas = structured_masks(_sampling_pass)(PALLAS, params, *inputs)
  # Encoder logits at padded positions are not used by anything (and differ: XLA averages all values in
  # rows with nothing to see, the kernel gives 0); every real position must agree.
  for got, want, valid in [(pallas[0], xla[0], prompt_valid), (pallas[1], xla[1], canvas_valid)]:
    np.testing.assert_allclose(np.asarray(got)[np.asarray(valid)], np.asarray(want)[np.asarray(valid)], **TOL)
  for got, want in zip(pallas[2:4], xla[2:4]):  # denoiser logits: every position
    np.testing.assert_allclose(got, want, **TOL)
  cache_p, cache_x = pallas[4], xla[4]
  np.testing.assert_array_equal(cache_p.valid, cache_x.valid)
  valid = np.asarray(cache_x.valid)
  for kp, kx in zip(cache_p.keys + cache_p.values, cache_x.keys + cache_x.values):
    np.testing.assert_allclose(np.asarray(kp)[valid], np.asarray(kx)[valid], **TOL)


def _training_loss(config, params, prompt, prompt_valid, clean, canvas_mask, noisy, selected, ct_enc, ct_dec):
  """Spec §4.3 in miniature: encode [prompt ‖ clean canvases] (AR loss), then denoise the noisy canvas
  against the cache seen up to P + s·C per row (denoiser loss); gradients flow into the cache too."""
  p, c = prompt.shape[1], noisy.shape[1]
  full = jnp.concatenate([prompt, clean], axis=1)
  valid = jnp.concatenate([prompt_valid, canvas_mask], axis=1)
  enc_logits, cache = _encode(config, params, full, model.init_cache(config, full.shape[0], full.shape[1]), valid)
  dec_logits = _denoise(config, params, noisy, cache.with_end(p + selected * c), None)
  enc_loss = jnp.sum(jnp.where(valid[:, :, None], enc_logits * ct_enc, 0.0))
  return enc_loss + jnp.sum(dec_logits * ct_dec)


def test_training_gradients_match(structured_masks):
  """Two layers (one local, one global) keep the interpret-mode compile of every backward kernel short."""
  xla_config = tiny_moe(num_layers=2, layer_types=(LOCAL, GLOBAL))
  pallas_config = xla_config.replace(attention_impl="pallas", moe_impl="pallas")
  params = model.init_params(xla_config, jax.random.key(3))
  b, p, c, n = 2, 5, 8, 2
  rng = np.random.default_rng(2)
  args = (_tokens(3, (b, p)), jnp.asarray([[True] * 5, [True] * 3 + [False] * 2]),
          _tokens(4, (b, n * c)), jnp.asarray(np.repeat([[True, True], [True, False]], c, axis=1)),
          _tokens(5, (b, c)), jnp.asarray([1, 0], jnp.int32),
          jnp.asarray(rng.normal(size=(b, p + n * c, XLA.vocab_size)), jnp.float32),
          jnp.asarray(rng.normal(size=(b, c, XLA.vocab_size)), jnp.float32))
  grad = lambda config: jax.jit(jax.value_and_grad(lambda prm: _training_loss(config, prm, *args)))
  loss_x, grads_x = grad(xla_config)(params)
  loss_p, grads_p = structured_masks(grad(pallas_config))(params)
  np.testing.assert_allclose(loss_p, loss_x, rtol=1e-5)
  # One scale for the whole tree: some gradients are ~0 by symmetry (the last layer's scalar feeds a
  # scale-invariant RMSNorm), where any per-leaf relative test would only compare rounding noise.
  scale = max(float(jnp.max(jnp.abs(g))) for g in jax.tree_util.tree_leaves(grads_x))
  for (path, gx), gp in zip(jax.tree_util.tree_leaves_with_path(grads_x), jax.tree_util.tree_leaves(grads_p)):
    np.testing.assert_allclose(gp, gx, atol=1e-5 * scale, rtol=1e-4, err_msg=jax.tree_util.keystr(path))
