"""Each piece of the sampler against transformers' own class on identical inputs."""

import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import GenerationConfig
from transformers.generation import EosTokenCriteria, StoppingCriteriaList
from transformers.models.diffusion_gemma.generation_diffusion_gemma import (
    DiffusionGemmaGenerationMixin, EntropyBoundSampler, EntropyBoundSamplerConfig,
    LinearTemperatureScheduleLogitsProcessor, StableAndConfidentStoppingCriteria)

from dgemma.sampling import acceptance, schedules, stopping


def _logits(seed, b, c, v):
  """Rows with a spread of sharpness, so that entropies range from ~0 to ~log V."""
  rng = np.random.default_rng(seed)
  scale = np.exp(rng.uniform(-1.0, 3.5, (b, c, 1)))
  return (rng.standard_normal((b, c, v)) * scale).astype(np.float32)


def test_entropy_matches_torch_categorical():
  logits = _logits(0, 3, 16, 50)
  logits[0, 0, :7] = -np.inf  # masked tokens contribute nothing (and no NaN)
  ours = np.asarray(acceptance.entropy(jnp.asarray(logits)))
  categorical = lambda dtype: torch.distributions.Categorical(logits=torch.tensor(logits, dtype=dtype)).entropy()
  # torch's own formula in float64 is exact to ~1e-14, which leaves ours' float32 rounding.
  np.testing.assert_allclose(ours, categorical(torch.float64).numpy(), rtol=1e-5, atol=1e-6)
  # In float32 torch rounds log Z at the logits' magnitude: usually within ~4 ulps of the row's largest logit, but
  # one CI run (not reproducible alone) was 12-26 ulps off (2.5e-5) where ours matched float64 to 1e-7.
  largest = np.where(np.isfinite(logits), np.abs(logits), 0.0).max(-1)
  torch_error = 64 * np.spacing(largest.astype(np.float32)).astype(np.float64)
  assert (np.abs(ours - categorical(torch.float32).numpy()) <= torch_error + 1e-6).all()
  x = logits.astype(np.float64)
  logp = x - x.max(-1, keepdims=True)
  logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
  finite = np.where(np.isfinite(logp), logp, 0.0)
  exact = -(np.exp(logp) * finite).sum(-1)
  np.testing.assert_allclose(ours, exact, rtol=1e-4, atol=1e-7)


@pytest.mark.parametrize("bound", [0.1, 1.0, 5.0])
def test_acceptance_mask_matches_accept_canvas(bound):
  b, c, v = 4, 24, 50
  logits = _logits(1, b, c, v)
  sampler = EntropyBoundSampler(EntropyBoundSamplerConfig(entropy_bound=bound), c, v, max_denoising_steps=48)
  # current canvas 0 and candidates 1: the accepted canvas is the acceptance mask.
  accepted = sampler.accept_canvas(torch.zeros(b, c, dtype=torch.long), torch.ones(b, c, dtype=torch.long),
                                   torch.tensor(logits), cur_step=10)
  theirs = accepted.numpy().astype(bool)
  ours = np.asarray(acceptance.entropy_bounded_accept(acceptance.entropy(jnp.asarray(logits)), bound))
  np.testing.assert_array_equal(ours, theirs)
  assert theirs.any(axis=1).all() and not theirs.all()  # non-trivial: some accepted, some not, in every case


def test_acceptance_worked_example():
  """Spec §5.1 d: entropies [0.001, 0.666, 0.001, 1.099] accept positions 0-2."""
  h = jnp.asarray([[0.001, 0.666, 0.001, 1.099]])
  np.testing.assert_array_equal(acceptance.entropy_bounded_accept(h, 0.1), [[True, True, True, False]])


def test_acceptance_with_tied_entropies_follows_a_stable_sort():
  """Trained models give many exactly equal entropies (zeros above all): ties go in position order."""
  rng = np.random.default_rng(11)
  # Binary fractions: every partial sum is exact in float32, so sums that land on the bound exactly count too.
  h = rng.choice(np.array([0.0, 0.0, 1 / 32, 1 / 16, 1 / 4], np.float32), size=(50, 40))
  for bound in (0.0, 1 / 16, 0.1, 0.5):
    expected = np.zeros(h.shape, bool)
    for row, values in enumerate(h):  # brute force: walk the stably sorted positions, summing what came before
      below = 0.0
      for position in np.argsort(values, kind="stable"):
        expected[row, position] = below <= bound
        below += float(values[position])
    np.testing.assert_array_equal(np.asarray(acceptance.entropy_bounded_accept(jnp.asarray(h), bound)), expected)


def test_renoise_keeps_accepted_and_replaces_the_rest():
  accept = jnp.asarray([[True, False, True]])
  out = acceptance.renoise(accept, jnp.asarray([[5, 6, 7]]), jnp.asarray([[50, 60, 70]]))
  np.testing.assert_array_equal(out, [[5, 60, 7]])


@pytest.mark.parametrize("num_steps", [48, 7])
def test_linear_temperatures_match_hf_processor(num_steps):
  processor = LinearTemperatureScheduleLogitsProcessor(t_min=0.4, t_max=0.8, max_denoising_steps=num_steps)
  scores = _logits(2, 1, 4, 30)
  for remaining in range(num_steps, 0, -1):
    # HF's generate turns the step into an int32 tensor before calling the processors.
    step = torch.tensor(remaining, dtype=torch.int32)
    ours = np.float32(schedules.temperature("linear", 0.8, 0.4, jnp.int32(remaining), num_steps))
    one_over = processor(None, torch.ones(1), step).numpy()[0]
    assert one_over == np.float32(1.0) / ours, (remaining, one_over, ours)  # the same float32 temperature
    theirs = processor(None, torch.tensor(scores), step).numpy()
    # XLA rewrites x / t as x * (1 / t): at most one ulp from torch's true division.
    np.testing.assert_array_max_ulp(np.asarray(jnp.asarray(scores) / ours), theirs, maxulp=1)


def test_schedule_endpoints_and_shapes():
  n = 10
  temps = {name: [float(schedules.temperature(name, 0.8, 0.4, jnp.int32(r), n)) for r in range(n, 0, -1)]
           for name in schedules.SCHEDULES}
  np.testing.assert_allclose(temps["linear"][0], 0.8, rtol=1e-6)
  np.testing.assert_allclose(temps["linear"][-1], 0.44, rtol=1e-6)  # never quite t_min
  np.testing.assert_allclose(temps["cosine"][0], 0.8, rtol=1e-6)
  assert all(a > b for a, b in zip(temps["cosine"], temps["cosine"][1:]))
  assert temps["cosine"][-1] < temps["linear"][-1]  # cosine spends its last steps closer to t_min
  assert temps["constant"] == [pytest.approx(0.8)] * n


@pytest.mark.parametrize("bad", [dict(schedule="exp"), dict(t_max=0.4, t_min=0.4), dict(t_min=-0.1),
                                 dict(schedule="constant", t_max=0.0)])
def test_schedule_rejects_bad_values(bad):
  args = dict(schedule="linear", t_max=0.8, t_min=0.4) | bad
  with pytest.raises(ValueError):
    schedules.check(args["schedule"], args["t_max"], args["t_min"])


@pytest.mark.parametrize("threshold", [0, 1, 2])
def test_stop_decisions_match_stable_and_confident(threshold):
  rng = np.random.default_rng(3)
  b, c, v = 5, 6, 8
  criteria = StableAndConfidentStoppingCriteria(stability_threshold=threshold, confidence_threshold=0.005)
  history = stopping.init_history(threshold, b, c)
  argmax = rng.integers(0, v, (b, c))
  decisions = []
  for step in range(8):
    # Rows change their argmax canvas now and then, and alternate between confident and unsure logits.
    change = rng.random(b) < 0.3
    argmax = np.where(change[:, None], rng.integers(0, v, (b, c)), argmax)
    sharp = rng.random(b) < 0.7
    logits = rng.standard_normal((b, c, v)).astype(np.float32) * np.where(sharp, 1.0, 0.05)[:, None, None]
    logits[np.arange(b)[:, None], np.arange(c)[None], argmax] += np.where(sharp, 30.0, 0.0)[:, None]
    theirs = criteria(torch.tensor(argmax), torch.tensor(logits)).numpy()
    entropy = acceptance.entropy(jnp.asarray(logits))
    ours, history = stopping.stable_and_confident(history, jnp.asarray(argmax), entropy, 0.005)
    np.testing.assert_array_equal(np.asarray(ours), theirs, err_msg=f"step {step}")
    decisions.append(theirs)
  decisions = np.array(decisions)
  assert decisions.any() and not decisions.all()


def test_eos_truncation_matches_finalize_canvas():
  rng = np.random.default_rng(4)
  b, c, prompt_len = 6, 10, 3
  stop_ids, pad = (1, 7, 50), 0
  canvas = rng.integers(2, 64, (b, c))
  canvas[canvas == 7] = 8
  canvas[canvas == 50] = 51
  canvas[0, 4] = 1  # one stop token
  canvas[1, [2, 6]] = [7, 50]  # two: only the first counts
  canvas[2, 0] = 50  # at the start
  canvas[3, 9] = 1  # at the end
  canvas[4, 3] = 7  # but the row finished in an earlier canvas
  finished_before = np.array([False, False, False, False, True, False])
  input_ids = torch.tensor(np.concatenate([rng.integers(2, 64, (b, prompt_len)), canvas], axis=1))
  eos = torch.tensor(stop_ids)
  theirs_ids, theirs_finished = DiffusionGemmaGenerationMixin._finalize_canvas(
      input_ids.clone(), torch.tensor(finished_before), GenerationConfig(pad_token_id=pad, eos_token_id=list(stop_ids)),
      StoppingCriteriaList([EosTokenCriteria(eos)]), c, eos)
  ours, finished = stopping.truncate_at_stop(jnp.asarray(canvas), jnp.asarray(finished_before), stop_ids, pad)
  np.testing.assert_array_equal(np.asarray(ours), theirs_ids[:, prompt_len:].numpy())
  np.testing.assert_array_equal(np.asarray(finished), theirs_finished.numpy())
  np.testing.assert_array_equal(np.asarray(finished), [True, True, True, True, True, False])


def test_argmax_takes_the_first_of_tied_maxima():
  v = 4096
  logits = np.zeros((2, 3, v), np.float32)
  logits[0, 0, [70, 3000]] = 5.0  # tie across blocks
  logits[0, 1, [65, 66]] = 5.0  # tie inside a block
  logits[1, 2, v - 1] = 1.0
  logits[1, 0] = np.random.default_rng(5).standard_normal(v)
  np.testing.assert_array_equal(np.asarray(acceptance.argmax(jnp.asarray(logits))), np.argmax(logits, axis=-1))


@pytest.mark.parametrize("vocab", [13, 96, 4096])
def test_inverse_cdf_sampling_follows_the_softmax(vocab):
  rng = np.random.default_rng(6)
  logits = (rng.standard_normal(vocab) * 2.0).astype(np.float32)
  logits[::3] = -np.inf  # zero-probability tokens must never come out
  n = 5000
  u = jnp.asarray(rng.random((1, n), dtype=np.float32))
  samples = np.asarray(acceptance.sample_categorical(jnp.broadcast_to(jnp.asarray(logits), (1, n, vocab)), u))[0]
  probs = np.exp(logits - logits.max())
  probs /= probs.sum()
  counts = np.bincount(samples, minlength=vocab)
  assert counts[::3].sum() == 0
  big = probs > 0.02  # frequent tokens: within 5 standard deviations of the expected count
  sd = np.sqrt(n * probs[big] * (1 - probs[big]))
  assert np.all(np.abs(counts[big] - n * probs[big]) < 5 * sd + 1)
  # Kolmogorov-Smirnov over token ids: 2/sqrt(n) is beyond the 99.9% quantile for a correct sampler.
  assert np.max(np.abs(np.cumsum(counts) / n - np.cumsum(probs))) < 2 / np.sqrt(n)


def test_sampling_at_near_zero_temperature_is_argmax():
  logits = _logits(7, 2, 8, 4096) / 1e-6
  u = jnp.asarray(np.random.default_rng(8).random((2, 8), dtype=np.float32))
  np.testing.assert_array_equal(np.asarray(acceptance.sample_categorical(jnp.asarray(logits), u)),
                                np.argmax(logits, -1))
  np.testing.assert_array_equal(np.asarray(acceptance.entropy(jnp.asarray(logits))), 0.0)


def test_analyse_applies_the_temperature_as_hf_divides_the_logits():
  """`analyse(logits, temperature=t)` (the tempered logits never written out) gives what HF computes from
  `logits / t`: torch's entropy and softmax, and the same arg-max and inverse-CDF draw; per-row t too."""
  logits = _logits(9, 3, 16, 4096)
  logits[0, 0, :5] = -np.inf
  u = jnp.asarray(np.random.default_rng(10).random((3, 16), dtype=np.float32))
  for t in (0.8, np.array([0.4, 0.63, 1.7], np.float32).reshape(3, 1, 1)):
    tempered = torch.tensor(logits) / torch.tensor(t)
    stats = acceptance.analyse(jnp.asarray(logits), u, with_probs=True, temperature=jnp.asarray(t))
    np.testing.assert_allclose(np.asarray(stats.entropy), torch.distributions.Categorical(logits=tempered).entropy(),
                               rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(np.asarray(stats.probs), torch.softmax(tempered, -1).numpy(), rtol=1e-5, atol=1e-8)
    np.testing.assert_array_equal(np.asarray(stats.argmax), tempered.argmax(-1).numpy())
    divided = acceptance.analyse(jnp.asarray(logits / t), u)
    np.testing.assert_array_equal(np.asarray(stats.sample), np.asarray(divided.sample))


def test_block_size_divides_the_vocabulary():
  for v in (13, 64, 4096, 262144, 1000):
    k = acceptance.block_size(v)
    assert v % k == 0
  assert acceptance.block_size(262144) == 512 and acceptance.block_size(4096) == 64
