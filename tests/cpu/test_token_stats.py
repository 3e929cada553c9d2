"""The sampler's CPU kernel (dgemma/cpu/token_stats.cc) against its XLA reference `acceptance.analyse`, a
float64 inverse CDF and the sampler's other path end to end; and how SamplerConfig chooses it."""

import dataclasses
import importlib
import warnings

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import tiny_moe
from dgemma.cpu import token_stats as cpu_kernel
from dgemma.sampling import SamplerConfig, acceptance, generate

pytestmark = pytest.mark.skipif(jax.default_backend() != "cpu", reason="a CPU kernel")


@pytest.fixture(scope="module")
def kernel():
  try:
    cpu_kernel.load()
  except cpu_kernel.KernelUnavailable as e:
    pytest.skip(f"kernel unavailable here: {e}")


def _logits(shape, seed, scale=3.0):
  """Softcapped random logits with the awkward cases: -inf entries, a row of exact ties at the top, a sharp row."""
  rng = np.random.default_rng(seed)
  x = (30 * np.tanh(rng.normal(size=shape) * scale / 30)).astype(np.float32)
  x[0, 0, ::7] = -np.inf
  x[0, 1, :] = 0.0
  x[0, 1, [5, 9, shape[-1] - 1]] = 2.5  # three tied maxima: the first is the arg-max
  x[-1, -1, 3] = 80.0
  return x


@pytest.mark.parametrize("shape,temperature", [((2, 40, 4096), "per_row"), ((3, 5, 64), 0.6), ((2, 3, 48), 1.0),
                                               ((2, 6, 128), "per_position"), ((1, 20, 262144), 0.8)])
@pytest.mark.parametrize("probs_dtype", [None, jnp.float32, jnp.bfloat16])
def test_matches_reference(kernel, shape, temperature, probs_dtype):
  logits = _logits(shape, seed=shape[-1])
  uniform = np.random.default_rng(1).random(shape[:-1]).astype(np.float32)
  if temperature == "per_row":
    temp = jnp.linspace(0.4, 0.8, shape[0])[:, None, None]
  elif temperature == "per_position":
    temp = jnp.linspace(0.3, 1.2, shape[0] * shape[1]).reshape(shape[0], shape[1], 1)
  else:
    temp = temperature
  ref = acceptance.analyse(jnp.asarray(logits), jnp.asarray(uniform), with_probs=True, temperature=temp)
  got = jax.jit(lambda l, u: cpu_kernel.token_stats(l, u, temp, probs_dtype))(logits, uniform)
  np.testing.assert_array_equal(got.argmax, ref.argmax)
  assert int(got.argmax[0, 1]) == 5
  np.testing.assert_allclose(got.entropy, ref.entropy, rtol=2e-5, atol=2e-6)
  if probs_dtype is None:
    assert got.probs is None
  else:
    assert got.probs.dtype == probs_dtype
    want = np.asarray(ref.probs.astype(probs_dtype).astype(jnp.float32))
    got_probs = np.asarray(got.probs.astype(jnp.float32))
    if probs_dtype == jnp.bfloat16:  # the same rounding nearly everywhere, one unit in the last place at most
      assert np.mean(got_probs == want) > 0.99
      np.testing.assert_allclose(got_probs, want, rtol=2.0 ** -7, atol=1e-30)
    else:  # both exps are within ~1 ulp; the normalising sums, in different orders, differ by up to ~sqrt(V) ulp
      np.testing.assert_allclose(got_probs, want, rtol=2e-6 if shape[-1] <= 4096 else 1e-5, atol=1e-30)
  # The same draw but where the target is within rounding of a cumulative boundary (the sums run in another order;
  # with 262,144 tokens of ~4e-6 mass each, at a few percent of positions): there, both draws are valid.
  differ = np.asarray(got.sample != ref.sample)
  assert differ.mean() < (0.1 if shape[-1] > 10_000 else 0.03)
  for sample in (got.sample, ref.sample):
    _check_inverse_cdf(logits[differ], np.broadcast_to(np.asarray(temp), shape[:-1] + (1,))[differ],
                       uniform[differ], np.asarray(sample)[differ])


def _check_inverse_cdf(logits_NxV, temp_Nx1, uniform_N, sample_N):
  """Brute force in float64: each sample s satisfies cdf[s - 1] <= u <= cdf[s] up to float32 rounding, and has
  float32 mass."""
  logits_NxV = np.asarray(logits_NxV, np.float32)
  p32 = np.asarray(acceptance.analyse(jnp.asarray(logits_NxV)[None], with_probs=True,
                                      temperature=jnp.asarray(temp_Nx1, jnp.float32)[None]).probs)[0]
  z = (logits_NxV.astype(np.float64) - logits_NxV.max(-1, keepdims=True)) / np.asarray(temp_Nx1, np.float64)
  p = np.exp(z) / np.exp(z).sum(-1, keepdims=True)
  cdf = np.cumsum(p, axis=-1)
  for r, s in enumerate(sample_N):
    assert p32[r, s] > 0, (r, s)
    lo = cdf[r, s - 1] if s > 0 else 0.0
    assert lo - 1e-5 <= uniform_N[r] <= cdf[r, s] + 1e-5, (r, s, lo, uniform_N[r], cdf[r, s])


@pytest.mark.parametrize("vocab", [16, 64, 4096])
def test_sample_is_the_inverse_cdf(kernel, vocab):
  rng = np.random.default_rng(vocab)
  rows, temp = 300, 0.7
  logits = (rng.normal(size=(1, rows, vocab)) * 4).astype(np.float32)
  logits[0, :50, vocab // 2:] = -np.inf  # mass only in the first half
  uniform = rng.random((1, rows)).astype(np.float32)
  uniform[0, :5] = np.float32(1 - 2 ** -24)  # the largest uniform below 1
  sample = np.asarray(cpu_kernel.token_stats(jnp.asarray(logits), jnp.asarray(uniform), temp).sample)[0]
  _check_inverse_cdf(logits[0], np.full((rows, 1), temp), uniform[0], sample)


def test_rows_do_not_depend_on_the_batch(kernel):
  """The rows are shared out between threads in chunks: 37 rows at once give what each row gives alone."""
  logits = _logits((1, 37, 256), seed=3)
  uniform = np.random.default_rng(4).random((1, 37)).astype(np.float32)
  fn = jax.jit(lambda l, u: cpu_kernel.token_stats(l, u, 0.5, jnp.float32))
  whole = fn(logits, uniform)
  for r in range(37):
    one = fn(logits[:, r:r + 1], uniform[:, r:r + 1])
    for name in ("argmax", "entropy", "sample", "probs"):
      np.testing.assert_array_equal(getattr(one, name)[:, 0], getattr(whole, name)[:, r])


def test_broken_rows(kernel):
  """Rows with a NaN (first or later), a +inf or only -inf logits: NaN entropy (so that the step accepts nothing
  there), and an arg-max and a sample that are still token ids; the other rows are unaffected. The same for the
  reference."""
  logits = _logits((1, 6, 64), seed=5)
  logits[0, 1, 10] = np.nan
  logits[0, 2, 0] = np.nan
  logits[0, 3, 7] = np.inf
  logits[0, 4, :] = -np.inf
  for stats in (cpu_kernel.token_stats(jnp.asarray(logits), jnp.full((1, 6), 0.5), 1.0),
                acceptance.analyse(jnp.asarray(logits), jnp.full((1, 6), 0.5))):
    entropy = np.asarray(stats.entropy)[0]
    assert np.isnan(entropy[1:5]).all() and not np.isnan(entropy[[0, 5]]).any()
    assert not np.asarray(acceptance.entropy_bounded_accept(stats.entropy, 0.1))[0, 1:5].any()
    for ids in (stats.argmax, stats.sample):
      assert ((np.asarray(ids) >= 0) & (np.asarray(ids) < 64)).all()


def test_temperature_shapes(kernel):
  """A scalar, [B, 1, 1] or [B, C, 1], as for the reference; a [B] temperature is refused, not read as a scalar."""
  logits, uniform = jnp.asarray(_logits((2, 3, 64), seed=6)), jnp.full((2, 3), 0.3)
  per_row = cpu_kernel.token_stats(logits, uniform, jnp.array([0.5, 0.9])[:, None, None]).entropy
  assert np.allclose(per_row[0], cpu_kernel.token_stats(logits, uniform, 0.5).entropy[0])
  assert np.allclose(per_row[1], cpu_kernel.token_stats(logits, uniform, 0.9).entropy[1])
  with pytest.raises(ValueError):
    cpu_kernel.token_stats(logits, uniform, jnp.array([0.5, 0.9]))


def _model():
  config = tiny_moe(canvas_length=16)  # vocabulary 64
  params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, model.init_params(config, jax.random.key(0)))
  return config, params


@pytest.mark.parametrize("matmul_dtype", [None, "bfloat16"])
def test_generate_with_the_kernel_matches_xla(kernel, matmul_dtype):
  """Both paths of the sampler on one model, at near-zero temperature (every step's sample is its arg-max and
  everything is accepted): identical tokens and steps. (At the default temperatures the paths agree as far as
  test_matches_reference shows; this random model, its weights scaled up, turns a one-ulp difference in the
  self-conditioning probabilities into a different draw within a few steps.)"""
  config, params = _model()
  if matmul_dtype:
    config = config.replace(matmul_dtype=matmul_dtype)
  prompt = np.random.default_rng(0).integers(3, 64, (3, 8)).astype(np.int32)
  cold = SamplerConfig(max_denoising_steps=6, max_new_tokens=32, t_max=2e-4, t_min=1e-4, stop_ids=())
  outs = {impl: generate(params, config, prompt, None, jax.random.key(1), dataclasses.replace(cold, token_stats=impl))
          for impl in ("cpu", "xla")}
  np.testing.assert_array_equal(outs["cpu"].tokens, outs["xla"].tokens)
  np.testing.assert_array_equal(outs["cpu"].steps_per_canvas, outs["xla"].steps_per_canvas)


def test_choice(kernel):
  config, _ = _model()
  assert SamplerConfig().resolve(config).token_stats == "cpu"
  assert SamplerConfig(token_stats="xla").resolve(config).token_stats == "xla"
  odd = config.replace(vocab_size=50)
  assert SamplerConfig().resolve(odd).token_stats == "xla"  # not a multiple of 16: the kernel does not apply
  with pytest.raises(ValueError, match="multiple of 16, got 50"):
    SamplerConfig(token_stats="cpu").resolve(odd)
  with pytest.raises(ValueError, match="token_stats must be one of"):
    SamplerConfig(token_stats="gpu")


def test_no_compiler(monkeypatch, tmp_path):
  """Without a compiler: 'auto' warns once, naming the reason, and runs XLA; 'cpu' is a one-line error; the build
  is tried once."""
  module = importlib.reload(cpu_kernel)  # a fresh module: nothing built or registered in its caches
  try:
    _check_no_compiler(module, monkeypatch, tmp_path)
  finally:
    importlib.reload(cpu_kernel)  # the failure is cached per process: later tests start afresh


def _check_no_compiler(module, monkeypatch, tmp_path):
  monkeypatch.setenv("CXX", "no-such-compiler-dgemma")
  monkeypatch.setenv("DGEMMA_CACHE_DIR", str(tmp_path))
  builds, library_path = [], module._library_path
  monkeypatch.setattr(module, "_library_path", lambda: (builds.append(1), library_path())[1])
  with pytest.raises(module.KernelUnavailable, match="no C\\+\\+ compiler 'no-such-compiler-dgemma'"):
    module.load()
  with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    assert module.resolve("auto", 64) == "xla"
    assert module.resolve("auto", 64) == "xla"
  messages = [str(w.message) for w in caught if "CPU kernel is unavailable" in str(w.message)]
  assert len(messages) == 1 and "no-such-compiler-dgemma" in messages[0]
  with pytest.raises(ValueError, match="token_stats='cpu': no C\\+\\+ compiler"):
    module.resolve("cpu", 64)
  assert len(builds) == 1  # tried once per process, not on every sampler call
  assert list(tmp_path.iterdir()) == []
