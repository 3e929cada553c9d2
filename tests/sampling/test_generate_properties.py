"""Properties of the jitted sampler: rows are independent, it compiles once per shape, it is deterministic
given its key, the step accounting is consistent, and bad input fails with one clear line."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import GLOBAL, LOCAL, tiny_moe
from dgemma.sampling import SamplerConfig, generate, sampler_config
from dgemma.model.transformer import DiffusionGemma
from dgemma.sampling.generate import _generate, _prepare, cache_buckets

STEPS = 10
# Low temperature on a model with large weights: rows settle and stop after different numbers of steps, so
# frozen rows and early exits are exercised, while sampling still matters at the unsure positions.
SAMPLER = SamplerConfig(max_denoising_steps=STEPS, max_new_tokens=24, t_max=0.03, t_min=0.015,
                        return_trajectory=True)


@pytest.fixture(scope="module")
def tiny():
  config = tiny_moe(num_layers=2, layer_types=(LOCAL, GLOBAL), stop_ids=(1,))
  params = model.init_params(config, jax.random.key(0))
  params = jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, params)
  return config, params


def _batch(seed):
  rng = np.random.default_rng(seed)
  prompt = rng.integers(3, 64, (4, 6))
  valid = np.ones_like(prompt, bool)
  valid[2, 4:] = False
  return np.where(valid, prompt, 0), valid


def _keys(*seeds):
  return jnp.stack([jax.random.key(s) for s in seeds])


def test_rows_are_independent_and_compile_once(tiny):
  config, params = tiny
  prompt_a, valid_a = _batch(0)
  prompt_b, valid_b = _batch(1)
  # Rows 1 and 2 are shared (same prompt, same key); rows 0 and 3 differ.
  prompt_b[1:3], valid_b[1:3] = prompt_a[1:3], valid_a[1:3]
  out_a = generate(params, config, prompt_a, valid_a, _keys(10, 11, 12, 13), SAMPLER)
  size = _generate._cache_size()
  out_b = generate(params, config, prompt_b, valid_b, _keys(20, 11, 12, 23), SAMPLER)
  assert _generate._cache_size() == size  # new values, same shapes: no recompilation
  for field in ("tokens", "steps_per_canvas", "tokens_per_forward", "trajectory"):
    a, b = np.asarray(getattr(out_a, field)), np.asarray(getattr(out_b, field))
    np.testing.assert_array_equal(a[1:3], b[1:3], err_msg=field)
    assert not np.array_equal(a[[0, 3]], b[[0, 3]]), field  # the other rows did change
  steps = np.asarray(out_a.steps_per_canvas)
  assert len(set(steps.ravel().tolist())) > 2  # rows stopped after different numbers of steps


def test_deterministic_given_the_key_and_row_keys_from_one_key(tiny):
  config, params = tiny
  prompt, valid = _batch(0)
  key = jax.random.key(5)
  first = generate(params, config, prompt, valid, key, SAMPLER)
  again = generate(params, config, prompt, valid, key, SAMPLER)
  per_row = generate(params, config, prompt, valid, jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(4)),
                     SAMPLER)
  for out in (again, per_row):
    np.testing.assert_array_equal(np.asarray(out.tokens), np.asarray(first.tokens))


def test_dense_moe_samples_the_same_tokens(tiny):
  """moe_impl is chosen through the model config; the dense experts give the same samples as ragged_dot.

  The two are the same function up to float rounding (tests/model/test_moe_dense.py), but sampling is not
  continuous: a draw that falls within rounding of a category boundary, or two entropies within rounding of
  each other, can flip one token and with it the rest of that row. So over 8 keys x 4 rows, nearly every row
  must come out identical; a different function would match almost none.
  """
  config, params = tiny
  prompt, valid = _batch(3)
  same_rows = 0
  for seed in range(8):
    xla = generate(params, config, prompt, valid, jax.random.key(seed), SAMPLER)
    dense = generate(params, config.replace(moe_impl="dense"), prompt, valid, jax.random.key(seed), SAMPLER)
    same = np.ones(prompt.shape[0], bool)
    for field in ("tokens", "steps_per_canvas", "trajectory"):
      a, b = np.asarray(getattr(dense, field)), np.asarray(getattr(xla, field))
      same &= (a == b).reshape(a.shape[0], -1).all(axis=1)
    same_rows += int(same.sum())
  assert same_rows >= 30, f"only {same_rows} of 32 rows sampled the same tokens"


@pytest.mark.parametrize("stop_ids", [(1,), (1, 2, 3, 4, 5)])  # more stop ids: rows also finish early
def test_step_accounting_and_trajectory(tiny, stop_ids):
  config, params = tiny
  prompt, valid = _batch(2)
  out = generate(params, config, prompt, valid, jax.random.key(3), dataclasses.replace(SAMPLER, stop_ids=stop_ids))
  tokens = np.asarray(out.tokens).reshape(4, 3, 8)
  steps = np.asarray(out.steps_per_canvas)
  traj = np.asarray(out.trajectory)
  assert ((steps >= 0) & (steps <= STEPS)).all()
  for row in range(4):
    for i in range(3):
      if steps[row, i] == 0:  # a canvas the row did not take part in is all pad
        assert (tokens[row, i] == config.pad_id).all()
        continue
      last = traj[row, i, steps[row, i] - 1]
      # The committed canvas is the row's last argmax canvas, truncated after its first stop token.
      stop = np.flatnonzero(np.isin(last, stop_ids))
      expected = last.copy()
      if stop.size:
        expected[stop[0] + 1:] = config.pad_id
      np.testing.assert_array_equal(tokens[row, i], expected)
  # The trajectory holds a canvas exactly for the steps each row ran: -1 after a row stopped (while other rows went
  # on) and in the canvases after the one it finished in, never its frozen or starting canvas.
  ran = np.arange(STEPS)[None, None, :] < steps[:, :, None]
  np.testing.assert_array_equal((traj >= 0).all(-1), ran)
  np.testing.assert_array_equal((traj == -1).all(-1), ~ran)
  assert ((steps > 0) & (steps < STEPS)).any()  # rows stopped while others went on
  if len(stop_ids) > 1:
    assert (steps[:, 1:] == 0).any()  # and rows finished before the last canvas
  nonpad = (np.asarray(out.tokens) != config.pad_id).sum(1)
  np.testing.assert_allclose(np.asarray(out.tokens_per_forward), nonpad / steps.sum(1), rtol=1e-6)


def test_without_adaptive_stopping_every_step_runs(tiny):
  config, params = tiny
  prompt, valid = _batch(0)
  sampler = SamplerConfig(max_denoising_steps=4, max_new_tokens=8, t_max=0.03, t_min=0.015,
                          adaptive_stopping=False, stop_ids=())
  out = generate(params, config, prompt, valid, jax.random.key(0), sampler)
  np.testing.assert_array_equal(np.asarray(out.steps_per_canvas), np.full((4, 1), 4))
  np.testing.assert_allclose(np.asarray(out.tokens_per_forward),
                             (np.asarray(out.tokens) != config.pad_id).sum(1) / 4, rtol=1e-6)


def test_sampler_config_defaults_are_the_reference():
  s = SamplerConfig()
  assert (s.max_denoising_steps, s.entropy_bound, s.t_max, s.t_min) == (48, 0.1, 0.8, 0.4)
  assert (s.stability_threshold, s.confidence_threshold, s.max_new_tokens) == (1, 0.005, 256)
  resolved = s.resolve(tiny_moe(canvas_length=256))
  assert resolved.canvas_length == 256 and resolved.stop_ids == (1, 106, 50)


@pytest.mark.parametrize("bad, message", [
    (dict(max_denoising_steps=0), "max_denoising_steps must be a positive integer"),
    (dict(entropy_bound=-1.0), "entropy_bound must be > 0"),
    (dict(t_max=0.3, t_min=0.4), "t_max must be > t_min"),
    (dict(schedule="exp"), "unknown temperature schedule"),
    (dict(stability_threshold=-1), "stability_threshold must be an integer >= 0"),
    (dict(confidence_threshold=0.0), "confidence_threshold must be > 0"),
    (dict(max_new_tokens=0), "max_new_tokens must be a positive integer"),
])
def test_bad_sampler_knobs(bad, message):
  with pytest.raises(ValueError, match=message):
    SamplerConfig(**bad)


def test_sampler_config_takes_flags_then_the_checkpoints_defaults_then_the_reference():
  recorded = {"sampler": {"t_max": 1.2, "t_min": 1.0, "entropy_bound": 0.3}}
  s = sampler_config(recorded, t_max=None, t_min=0.9, max_denoising_steps=12)
  assert (s.t_max, s.t_min, s.entropy_bound, s.max_denoising_steps) == (1.2, 0.9, 0.3, 12)
  assert (s.schedule, s.stability_threshold) == ("linear", 1)  # recorded nowhere: the reference's
  assert sampler_config(None) == sampler_config({}) == SamplerConfig()
  with pytest.raises(ValueError, match="unknown sampler defaults \\['temperature'\\]"):
    sampler_config({"sampler": {"temperature": 1.0}})
  with pytest.raises(ValueError, match="t_max must be > t_min"):  # a recorded pair checked like flags
    sampler_config(recorded, t_max=0.5)
  restarts = {"sampler": {"restart_after": 16}}
  assert sampler_config(restarts).restart_after == 16
  fixed = sampler_config(restarts, adaptive_stopping=False)  # fixed steps: the recorded restarts (need stops) go
  assert (fixed.adaptive_stopping, fixed.restart_after) == (False, 0)
  with pytest.raises(ValueError, match="restart_after > 0 needs adaptive_stopping"):  # both asked for
    sampler_config(restarts, adaptive_stopping=False, restart_after=8)


def test_bad_inputs(tiny):
  config, params = tiny
  prompt, valid = _batch(0)
  key = jax.random.key(0)
  with pytest.raises(ValueError, match="shape \\[batch, length\\]"):
    generate(params, config, prompt[0], None, key, SAMPLER)
  with pytest.raises(ValueError, match="outside \\[0, 64\\)"):
    generate(params, config, prompt + 100, None, key, SAMPLER)
  with pytest.raises(ValueError, match="prompt_valid has shape"):
    generate(params, config, prompt, valid[:, :3], key, SAMPLER)
  with pytest.raises(ValueError, match="needs 30 tokens of context, more than max_cache_len=20"):
    generate(params, config, prompt, valid, key, SAMPLER, max_cache_len=20)
  with pytest.raises(ValueError, match="rng must be one key or 4 keys"):
    generate(params, config, prompt, valid, _keys(1, 2), SAMPLER)
  with pytest.raises(ValueError, match="rng must be a JAX random key"):
    generate(params, config, prompt, valid, np.zeros(2, np.float32), SAMPLER)


@pytest.mark.parametrize("max_new_tokens", [8, 24])  # one canvas of 8, three
def test_cache_has_no_slots_for_the_last_canvas(tiny, max_new_tokens):
  """The last canvas is never committed, so the cache holds the prompt and the canvases before it: a denoising
  step attends over every slot of the cache it reads, and a slot never written would be work for nothing. Slots
  for it would change nothing (the same tokens; compared with the one step loop that reads the whole cache)."""
  config, params = tiny
  prompt, valid = _batch(3)
  sampler = SamplerConfig(max_denoising_steps=4, max_new_tokens=max_new_tokens, t_max=0.03, t_min=0.015,
                          cache_per_canvas=False)
  args, static = _prepare(config, sampler, prompt, valid, jax.random.key(3), None, None)
  c = config.canvas_length
  n = max_new_tokens // c
  assert static["cache_len"] == prompt.shape[1] + (n - 1) * c
  tight = _generate(params, *args, **static)
  roomy = _generate(params, *args, **dict(static, cache_len=prompt.shape[1] + n * c))
  np.testing.assert_array_equal(tight.tokens, roomy.tokens)
  np.testing.assert_array_equal(tight.steps_per_canvas, roomy.steps_per_canvas)


def test_cache_buckets_cover_what_each_canvas_needs_and_at_most_twice_that():
  """Brute force over canvas counts: canvas i (in bucket i.bit_length()) reads every slot written before it, the
  prompt's and i canvases', and no more than 2i - 1 canvases' (doubling); the last bucket is the whole cache."""
  p, c = 5, 7
  for n in range(1, 40):
    lengths = cache_buckets(p, c, n)
    assert len(lengths) == (n - 1).bit_length() + 1
    assert lengths[-1] == p + (n - 1) * c and list(lengths) == sorted(set(lengths))
    for i in range(n):
      length = lengths[i.bit_length()]
      assert p + i * c <= length <= p + max(2 * i - 1, 0) * c


def test_cache_per_canvas_defaults_to_on_except_with_the_pallas_attention_kernel():
  """The Pallas kernel skips key blocks past the written end itself, so the buckets would only cost compile time."""
  config = tiny_moe()
  assert SamplerConfig().resolve(config).cache_per_canvas is True
  assert SamplerConfig().resolve(config.replace(attention_impl="pallas")).cache_per_canvas is False
  assert SamplerConfig(cache_per_canvas=True).resolve(config.replace(attention_impl="pallas")).cache_per_canvas
  assert not SamplerConfig(cache_per_canvas=False).resolve(config).cache_per_canvas


@pytest.mark.parametrize("max_new_tokens", [24, 40])
def test_each_canvas_reads_the_cache_of_its_bucket(tiny, monkeypatch, max_new_tokens):
  """With cache_per_canvas (the default) the denoiser is compiled once per bucket, over that many slots; at run time
  canvas i (i canvases already committed) runs the loop of bucket i.bit_length(); the tokens are those of the single
  step loop over the whole cache (cache_per_canvas=False)."""
  config, params = tiny
  prompt, valid = _batch(4)
  c, p = config.canvas_length, prompt.shape[1]
  n = max_new_tokens // c
  traced, ran = [], []
  original = DiffusionGemma.denoise

  def recording(self, canvas, cache, *args, **kwargs):
    traced.append(cache.capacity)
    jax.debug.callback(lambda end, capacity=cache.capacity: ran.append((capacity, int(end[0]))), cache.end)
    return original(self, canvas, cache, *args, **kwargs)

  monkeypatch.setattr(DiffusionGemma, "denoise", recording)
  buckets = cache_buckets(p, c, n)
  assert len(buckets) == (3 if n == 3 else 4)
  outs = {}
  for per_canvas in (True, False):
    traced.clear()
    ran.clear()
    _generate.clear_cache()  # so that this run traces the denoiser (the recording) afresh
    sampler = SamplerConfig(max_denoising_steps=3, max_new_tokens=max_new_tokens, t_max=0.03, t_min=0.015,
                            stop_ids=(), cache_per_canvas=per_canvas)
    outs[per_canvas] = generate(params, config, prompt, valid, _keys(5, 6, 7, 8), sampler)
    jax.effects_barrier()
    assert sorted(traced) == (list(buckets) if per_canvas else [p + (n - 1) * c])
    canvases_run = sorted({(end - p) // c for _, end in ran})
    assert canvases_run == list(range(n))
    for capacity, end in ran:
      i = (end - p) // c
      assert capacity == (buckets[i.bit_length()] if per_canvas else p + (n - 1) * c), (i, capacity)
  np.testing.assert_array_equal(outs[True].tokens, outs[False].tokens)
  np.testing.assert_array_equal(outs[True].steps_per_canvas, outs[False].steps_per_canvas)
  assert np.all(np.asarray(outs[True].steps_per_canvas) > 0)  # every canvas ran


def test_without_self_conditioning_the_branch_is_never_read(tiny):
  """self_conditioning=False: the self-conditioning weights do not matter (every step is a first step); with
  it on they do."""
  config, params = tiny
  prompt, valid = _batch(0)
  keys = _keys(1, 2, 3, 4)
  scrambled = dict(params, self_conditioning=jax.tree.map(
      lambda x: x * 3.0 + 0.5, params["self_conditioning"]))
  off = SamplerConfig(max_denoising_steps=STEPS, max_new_tokens=24, t_max=0.03, t_min=0.015,
                      self_conditioning=False)
  a = generate(params, config, prompt, valid, keys, off)
  b = generate(scrambled, config, prompt, valid, keys, off)
  np.testing.assert_array_equal(np.asarray(a.tokens), np.asarray(b.tokens))
  np.testing.assert_array_equal(np.asarray(a.steps_per_canvas), np.asarray(b.steps_per_canvas))
  on = [generate(p, config, prompt, valid, keys, SAMPLER) for p in (params, scrambled)]
  assert not np.array_equal(np.asarray(on[0].tokens), np.asarray(on[1].tokens))
