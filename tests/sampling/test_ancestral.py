"""The ancestral sampler (SamplerConfig.update="ancestral"): its reverse step against the sum over x0 written out
with the forward process's transition matrices; with the exact posterior of a known data distribution it draws
that distribution; inside `generate` it is per row, deterministic and, at one step near temperature 0, the
released sampler's arg-max canvas; and its knobs come from the checkpoint's training config."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma import model
from dgemma.config import GLOBAL, LOCAL, tiny_moe
from dgemma.diffusion import schedules
from dgemma.sampling import SamplerConfig, ancestral, generate, sampler_config

ANCESTRAL = dict(update="ancestral", adaptive_stopping=False)


def _transition(alpha: float, v: int) -> np.ndarray:
  """M[a, b] = q(next = b | previous = a): keep with probability alpha, else a uniform token."""
  return alpha * np.eye(v) + (1.0 - alpha) / v * np.ones((v, v))


@pytest.mark.parametrize("denoiser_output", ["full", "context"])
@pytest.mark.parametrize("alpha_t, alpha_s", [(0.0, 0.25), (0.3, 0.6), (0.9, 1.0)])
def test_reverse_step_is_the_sum_over_x0_of_the_forward_posterior(denoiser_output, alpha_t, alpha_s):
  v, c = 6, 5
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, c, v)) * 2.0
  canvas = rng.integers(0, v, (2, c))
  got = np.asarray(ancestral.reverse_probs(jnp.asarray(logits, jnp.float32), jnp.asarray(canvas), alpha_t, alpha_s,
                                           denoiser_output))
  q0s, qst, q0t = _transition(alpha_s, v), _transition(alpha_t / alpha_s, v), _transition(alpha_t, v)
  np.testing.assert_allclose(q0s @ qst, q0t, atol=1e-12)  # s then t is the forward process from 0 to t
  for b in range(2):
    for pos in range(c):
      i = canvas[b, pos]
      p = np.exp(logits[b, pos] - logits[b, pos].max())
      p /= p.sum()
      if denoiser_output == "context":  # p(x0 | x_t) = p(x0 | others) · q(x_t,l = i | x0), normalised
        p = p * q0t[:, i] / np.sum(p * q0t[:, i])
      # q(x_s = k | x_t = i, x0 = j) = q(x_s = k | x0 = j) q(x_t = i | x_s = k) / q(x_t = i | x0 = j)
      posterior_jk = q0s * qst[:, i][None, :] / q0t[:, i][:, None]
      np.testing.assert_allclose(posterior_jk.sum(1), 1.0, atol=1e-12)
      np.testing.assert_allclose(got[b, pos], p @ posterior_jk, atol=2e-6)


@pytest.mark.parametrize("denoiser_output", ["full", "context"])
@pytest.mark.parametrize("step_index, temperature", [(0, 1.0), (2, 0.7), (3, 1.0)])
def test_the_step_draws_the_closed_form_and_returns_the_softmax(denoiser_output, step_index, temperature):
  """The step samples the mixture without writing p(x_s | x_t) out: its draws must follow reverse_probs (tested
  above against the sum over x0) at every step, the last included, and its second output must be the softmax of
  the tempered logits (the self-conditioning signal), for either reading of the denoiser."""
  v, n, num_steps = 6, 60_000, 4
  rng = np.random.default_rng(1)
  logits_V = rng.normal(size=v) * 1.5
  logits = jnp.broadcast_to(jnp.asarray(logits_V, jnp.float32), (1, n, v))  # n copies of one position
  canvas = jnp.full((1, n), 2, jnp.int32)
  drawn, probs = ancestral.step(jax.random.key(7)[None], logits, canvas, jnp.int32(step_index), num_steps,
                                "linear", denoiser_output, temperature)
  alpha_t, alpha_s = ancestral.noise_levels("linear", jnp.int32(step_index), num_steps)
  expected = np.asarray(ancestral.reverse_probs(logits[:, :1] / temperature, canvas[:, :1], alpha_t, alpha_s,
                                                denoiser_output))[0, 0]
  frequencies = np.bincount(np.asarray(drawn).ravel(), minlength=v) / n
  np.testing.assert_allclose(frequencies, expected, atol=0.01)  # ~5 standard errors of the largest cell
  softmax = np.exp(logits_V / temperature - np.max(logits_V / temperature))
  np.testing.assert_allclose(np.asarray(probs[0, :3]), np.tile(softmax / softmax.sum(), (3, 1)), rtol=1e-5)


def test_the_cpu_kernel_and_xla_draw_the_same_canvas():
  """generate passes the CPU kernel where it runs; it computes acceptance.analyse's draw, so the step must not
  depend on which one did."""
  from dgemma.cpu import token_stats as cpu_kernel
  from dgemma.sampling.generate import _token_stats
  if cpu_kernel.resolve("auto", 64) != "cpu":
    pytest.skip("the CPU kernel does not run here")
  rng = np.random.default_rng(2)
  logits = jnp.asarray(rng.normal(size=(2, 16, 64)) * 3, jnp.float32)
  canvas = jnp.asarray(rng.integers(0, 64, (2, 16)), jnp.int32)
  keys = jax.random.split(jax.random.key(3), 2)
  for reading in ("full", "context"):
    got = [ancestral.step(keys, logits, canvas, jnp.int32(1), 4, "cosine", reading, 0.8,
                          functools.partial(_token_stats, impl, probs_dtype=jnp.float32)) for impl in ("cpu", "xla")]
    np.testing.assert_array_equal(np.asarray(got[0][0]), np.asarray(got[1][0]))
    np.testing.assert_allclose(np.asarray(got[0][1]), np.asarray(got[1][1]), rtol=1e-5, atol=1e-7)


def _exact_posterior_logits(pi: np.ndarray, canvas: jax.Array, alpha_t: jax.Array) -> jax.Array:
  """log p(x0 = j | x_t) for tokens drawn independently from pi: pi_j · q(x_t = i | x0 = j), up to a constant."""
  v = pi.shape[0]
  likelihood = alpha_t * jax.nn.one_hot(canvas, v) + (1.0 - alpha_t) / v
  return jnp.log(jnp.asarray(pi, jnp.float32)) + jnp.log(likelihood)


@pytest.mark.parametrize("num_steps, schedule", [(1, "linear"), (5, "linear"), (5, "cosine")])
def test_with_the_exact_posterior_it_draws_the_data_distribution(num_steps, schedule):
  """For tokens drawn independently from pi, p(x0 | x_t) is known in closed form; reverse steps that read it
  must end with tokens distributed as pi, at any number of steps. Reading it as the context-only posterior must
  not (the check can fail)."""
  pi = np.array([0.55, 0.25, 0.12, 0.05, 0.03])
  v, n = pi.shape[0], 40_000
  draws = {}
  for reading in ("full", "context"):
    canvas = jax.random.randint(jax.random.key(1), (1, n), 0, v)  # x_1: uniform
    for k in range(num_steps):
      alpha_t, _ = ancestral.noise_levels(schedule, jnp.int32(k), num_steps)
      logits = _exact_posterior_logits(pi, canvas, alpha_t)
      canvas, _ = ancestral.step(jax.random.key(100 + k)[None], logits, canvas, jnp.int32(k), num_steps, schedule,
                                 reading)
    draws[reading] = np.bincount(np.asarray(canvas).ravel(), minlength=v) / n
  np.testing.assert_allclose(draws["full"], pi, atol=0.012)  # ~5 standard errors of the largest cell
  if num_steps > 1:
    assert np.abs(draws["context"] - pi).max() > 0.03


def test_noise_levels_run_from_one_to_zero():
  for schedule in ("linear", "cosine", "sine"):
    a_first, _ = ancestral.noise_levels(schedule, jnp.int32(0), 4)
    _, a_last = ancestral.noise_levels(schedule, jnp.int32(3), 4)
    assert float(a_first) == pytest.approx(0.0, abs=1e-6) and float(a_last) == 1.0
    t_alpha, _ = ancestral.noise_levels(schedule, jnp.int32(1), 4)
    assert float(t_alpha) == pytest.approx(float(schedules.get(schedule)(0.75)), abs=1e-6)


@pytest.fixture(scope="module")
def tiny():
  config = tiny_moe(num_layers=2, layer_types=(LOCAL, GLOBAL), stop_ids=(1,))
  params = model.init_params(config, jax.random.key(0))
  return config, jax.tree.map(lambda x: x * 6 if x.ndim >= 2 else x, params)


def _prompt():
  rng = np.random.default_rng(0)
  return rng.integers(3, 64, (3, 6)), np.ones((3, 6), bool)


def test_one_step_near_temperature_zero_is_the_released_samplers_argmax(tiny):
  """One step from t = 1 to 0 draws x0 from the tempered softmax of the first pass: near temperature 0 its
  arg-max, which is what the released sampler returns after one step (the same starting canvas)."""
  config, params = tiny
  prompt, valid = _prompt()
  common = dict(max_denoising_steps=1, max_new_tokens=24, schedule="constant", t_max=1e-6)
  released = generate(params, config, prompt, valid, jax.random.key(3), SamplerConfig(**common))
  exact = generate(params, config, prompt, valid, jax.random.key(3), SamplerConfig(**common, **ANCESTRAL))
  np.testing.assert_array_equal(np.asarray(exact.tokens), np.asarray(released.tokens))


def test_every_step_runs_rows_are_independent_and_the_key_decides(tiny):
  config, params = tiny
  prompt, valid = _prompt()
  sampler = SamplerConfig(max_denoising_steps=6, max_new_tokens=24, schedule="constant", t_max=1.0,
                          stop_ids=(), **ANCESTRAL)
  keys = jnp.stack([jax.random.key(s) for s in (10, 11, 12)])
  out = generate(params, config, prompt, valid, keys, sampler)
  np.testing.assert_array_equal(np.asarray(out.steps_per_canvas), 6)  # no stop: every step of every canvas
  again = generate(params, config, prompt, valid, keys, sampler)
  np.testing.assert_array_equal(np.asarray(again.tokens), np.asarray(out.tokens))
  other = generate(params, config, prompt, valid, jnp.stack([jax.random.key(s) for s in (20, 11, 22)]), sampler)
  a, b = np.asarray(out.tokens), np.asarray(other.tokens)
  np.testing.assert_array_equal(a[1], b[1])  # row 1 kept its key: the same tokens
  assert not np.array_equal(a[[0, 2]], b[[0, 2]])


def test_knobs_refused_and_read_from_the_training_config():
  with pytest.raises(ValueError, match="needs adaptive_stopping=False"):
    SamplerConfig(update="ancestral")
  with pytest.raises(ValueError, match="update must be one of"):
    SamplerConfig(update="greedy")
  with pytest.raises(ValueError, match="unknown noise schedule"):
    SamplerConfig(noise_schedule="exp", **ANCESTRAL)
  trained = {"train_config": {"diffusion": {"schedule": "cosine", "loss": "elbo"}}}
  s = sampler_config(trained, **ANCESTRAL)
  assert (s.noise_schedule, s.denoiser_output) == ("cosine", "context")
  assert sampler_config({"train_config": {"diffusion": {"loss": "flat_ce"}}}).denoiser_output == "full"
  assert sampler_config(trained, denoiser_output="full").denoiser_output == "full"  # a flag wins
  assert sampler_config(None) == SamplerConfig()  # nothing recorded: the official recipe's (linear, full)


def test_the_last_step_never_draws_a_token_the_denoiser_rules_out():
  """At s = 0 the draw is from p(x0 | x_t) itself: tokens with no mass (a -inf logit) never come out, even the one
  already on the canvas."""
  v, n = 8, 20_000
  logits = jnp.where(jnp.arange(v) % 2 == 0, 0.0, -jnp.inf) * jnp.ones((1, n, v))
  canvas = jnp.ones((1, n), jnp.int32)  # an odd token, ruled out
  drawn = np.asarray(ancestral.step(jax.random.key(0)[None], logits, canvas, jnp.int32(3), 4, "linear", "full")[0])
  assert set(np.unique(drawn)) == {0, 2, 4, 6}
