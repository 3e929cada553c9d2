"""attention_impl chosen per mode and layer kind: every mixture gives the all-XLA numbers (Pallas in interpret
mode off GPU, small tiles so the masks span several blocks)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import GLOBAL, LOCAL, parse_attention_impl, tiny_moe
from pallas_kernels import attention as attention_kernels

XLA = tiny_moe()
TOL = dict(atol=2e-5, rtol=2e-5)


def test_parse_single_and_per_kind_specs():
  assert set(parse_attention_impl("pallas").values()) == {"pallas"}
  got = parse_attention_impl("local=pallas,denoise=pallas,encode.global=xla,denoise.global=xla")
  assert got == {("encode", LOCAL): "pallas", ("encode", GLOBAL): "xla",
                 ("denoise", LOCAL): "pallas", ("denoise", GLOBAL): "xla"}
  assert parse_attention_impl("denoise.local=pallas") == {
      ("encode", LOCAL): "xla", ("encode", GLOBAL): "xla", ("denoise", LOCAL): "pallas", ("denoise", GLOBAL): "xla"}
  assert XLA.replace(attention_impl="global=pallas").attention_for(GLOBAL, "denoise") == "pallas"
  assert XLA.attention_for(LOCAL, "encode") == "xla"  # the default: today's behaviour


@pytest.mark.parametrize("spec, message", [
    ("cudnn", "attention_impl must be 'xla', 'pallas' or 'selector=impl,...', got 'cudnn'"),
    ("local=flash", "attention_impl entry 'local=flash': the implementation must be 'xla' or 'pallas'"),
    ("middle=xla", "attention_impl entry 'middle=xla': the selector must be local, global, encode, denoise"),
    ("global.denoise=xla", "the selector must be local, global, encode, denoise or mode.kind"),
    ("local=xla,local=pallas", "attention_impl names 'local' twice"),
    ("", "attention_impl must be a non-empty string"),
])
def test_bad_specs_are_one_line_errors(spec, message):
  with pytest.raises(ValueError, match=message.replace(".", r"\.").replace("(", r"\(")) as e:
    XLA.replace(attention_impl=spec)
  assert "\n" not in str(e.value)


def test_relation_bias_refuses_any_pallas_layer():
  from dgemma.config import small_dense
  base = small_dense(vocab_size=16, width=16, num_heads=2, num_layers=2, learned_positions=4,
                     num_position_features=1, relation_bias=True)
  with pytest.raises(ValueError, match="attention_impl='xla'"):
    base.replace(attention_impl="denoise.global=pallas")


@pytest.fixture(scope="module")
def params():
  return model.init_params(XLA, jax.random.key(0))


def _pass(config, params, prompt, canvas, sc_logits):
  """Prefill, denoise a canvas, commit it, denoise again: both modes, both layer kinds."""
  cache = model.init_cache(config, prompt.shape[0], 24)
  prompt_logits, cache = model.encode(params, config, prompt, cache)
  first = model.denoise(params, config, canvas, cache, sc_logits)
  commit_logits, cache = model.encode(params, config, canvas, cache)
  second = model.denoise(params, config, canvas, cache, first)
  return prompt_logits, commit_logits, first, second


@pytest.mark.parametrize("spec", ["local=pallas,global=xla", "denoise=pallas", "encode.global=pallas"])
def test_mixed_choices_match_all_xla(params, spec, monkeypatch):
  monkeypatch.setattr(attention_kernels, "default_block_sizes",
                      lambda h: attention_kernels.BlockSizes(block_q=4, block_k=4, block_q_bwd=4, block_k_bwd=8))
  calls, kernel = [], attention_kernels.attention
  monkeypatch.setattr(attention_kernels, "attention",
                      lambda q, *a, **k: calls.append(q.shape[-1]) or kernel(q, *a, **k))
  rng = np.random.default_rng(0)
  prompt, canvas = (jnp.asarray(rng.integers(3, XLA.vocab_size, (2, 8)), jnp.int32) for _ in range(2))
  sc_logits = jax.random.normal(jax.random.key(1), (2, 8, XLA.vocab_size))
  want = _pass(XLA, params, prompt, canvas, sc_logits)
  got = _pass(XLA.replace(attention_impl=spec), params, prompt, canvas, sc_logits)
  # The kernel ran on exactly the layers the spec names (head dim 8: local layers, 16: global).
  want_dims = {"local=pallas,global=xla": {8}, "denoise=pallas": {8, 16}, "encode.global=pallas": {16}}[spec]
  assert set(calls) == want_dims
  for g, w in zip(got, want):
    assert float(jnp.abs(w).max()) > 0.1
    np.testing.assert_allclose(g, w, **TOL)
