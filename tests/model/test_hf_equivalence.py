"""Our model against transformers' DiffusionGemma on the same random checkpoint (float32, CPU)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dgemma import model
from dgemma.checkpoints import load_hf, save_hf
from tests.hf_reference import hf_logits, random_hf_model, to_np

TOL = 1e-4


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
  hf = random_hf_model(seed=0)
  path = tmp_path_factory.mktemp("hf") / "tiny"
  hf.save_pretrained(path)
  config, params = load_hf(str(path))
  return hf, config, params, path


def _close(name, ours, theirs):
  err = float(np.max(np.abs(np.asarray(ours) - theirs)))
  print(f"{name}: max abs diff {err:.2e}")
  assert err < TOL, f"{name}: max abs diff {err}"


def _prefill(hf, config, params, tokens, mask):
  enc = hf.model.encoder(input_ids=torch.tensor(tokens), attention_mask=torch.tensor(mask))
  cache = model.init_cache(config, tokens.shape[0], 32)
  logits, cache = model.encode(params, config, jnp.asarray(tokens), cache, jnp.asarray(mask, bool))
  return enc, logits, cache


def test_config_from_hf(checkpoint):
  hf, config, _, _ = checkpoint
  assert config.layer_types == ("local", "local", "global", "local", "global")
  assert (config.global_head_dim, config.global_num_kv_heads) == (16, 1)
  assert (config.num_experts, config.top_k_experts, config.expert_hidden) == (6, 2, 12)


def test_encoder_prefill_and_append(checkpoint):
  hf, config, params, _ = checkpoint
  rng = np.random.default_rng(0)
  prompt = rng.integers(3, 64, (2, 7))  # longer than the sliding window (4)
  enc, logits, cache = _prefill(hf, config, params, prompt, np.ones_like(prompt))
  _close("prefill logits", logits, to_np(hf_logits(hf, enc.last_hidden_state)))
  canvas = rng.integers(0, 64, (2, 6))
  enc2 = hf.model.encoder(input_ids=torch.tensor(canvas), cache=enc.cache)
  logits2, cache2 = model.encode(params, config, jnp.asarray(canvas), cache)
  _close("appended canvas logits", logits2, to_np(hf_logits(hf, enc2.last_hidden_state)))
  np.testing.assert_array_equal(np.asarray(cache2.end), [13, 13])


@pytest.mark.parametrize("with_sc", ["none", "logits", "masked"])
def test_denoiser(checkpoint, with_sc):
  hf, config, params, _ = checkpoint
  rng = np.random.default_rng(1)
  prompt = rng.integers(3, 64, (3, 7))
  enc, _, cache = _prefill(hf, config, params, prompt, np.ones_like(prompt))
  canvas = rng.integers(0, 64, (3, 6))
  kwargs, ours_kwargs = {}, {}
  if with_sc != "none":
    sc = rng.normal(size=(3, 6, 64)).astype(np.float32) * 3
    kwargs["self_conditioning_logits"] = torch.tensor(sc)
    ours_kwargs["self_conditioning_logits"] = jnp.asarray(sc)
  if with_sc == "masked":
    kwargs["self_conditioning_mask"] = torch.tensor([True, False, True])
    ours_kwargs["self_conditioning_mask"] = jnp.asarray([True, False, True])
  theirs = hf(cache=enc.cache, decoder_input_ids=torch.tensor(canvas), **kwargs).logits
  ours = model.denoise(params, config, jnp.asarray(canvas), cache, **ours_kwargs)
  _close(f"denoiser logits (sc={with_sc})", ours, to_np(theirs))


def test_right_padded_batch(checkpoint):
  hf, config, params, _ = checkpoint
  rng = np.random.default_rng(2)
  prompt = rng.integers(3, 64, (2, 8))
  mask = np.ones_like(prompt)
  mask[0, 5:] = 0
  prompt[0, 5:] = 0
  enc, logits, cache = _prefill(hf, config, params, prompt, mask)
  real = mask.astype(bool)
  _close("padded prefill logits (real tokens)", np.asarray(logits)[real],
         to_np(hf_logits(hf, enc.last_hidden_state))[real])
  canvas = rng.integers(0, 64, (2, 6))
  dec_mask = torch.tensor(np.concatenate([mask, np.ones((2, 6), mask.dtype)], axis=1))
  theirs = hf(cache=enc.cache, decoder_input_ids=torch.tensor(canvas), decoder_attention_mask=dec_mask).logits
  ours = model.denoise(params, config, jnp.asarray(canvas), cache)
  _close("padded denoiser logits", ours, to_np(theirs))


def test_export_round_trip(checkpoint, tmp_path):
  from transformers import DiffusionGemmaForBlockDiffusion
  hf, config, params, _ = checkpoint
  save_hf(str(tmp_path / "export"), config, params)
  config2, params2 = load_hf(str(tmp_path / "export"))
  assert config2 == config
  assert jax.tree.all(jax.tree.map(lambda a, b: bool(jnp.array_equal(a, b)), params, params2))
  reloaded = DiffusionGemmaForBlockDiffusion.from_pretrained(tmp_path / "export").eval()
  rng = np.random.default_rng(3)
  prompt = torch.tensor(rng.integers(3, 64, (2, 7)))
  canvas = torch.tensor(rng.integers(0, 64, (2, 6)))
  a = hf(input_ids=prompt, decoder_input_ids=canvas).logits
  b = reloaded(input_ids=prompt, decoder_input_ids=canvas).logits
  assert torch.equal(a, b), float((a - b).abs().max())
