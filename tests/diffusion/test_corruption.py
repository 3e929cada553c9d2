"""The forward process's marginals: a token survives with probability alpha + (1 - alpha)/V."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma.diffusion import corruption, schedules


def test_marginals_match_alpha():
  v, n = 10, 200_000
  x0 = jnp.full((4, n), 3, jnp.int32)
  alpha = jnp.asarray([0.0, 0.3, 0.7, 1.0])
  xt, resampled = corruption.corrupt(jax.random.key(0), x0, alpha, v)
  xt = np.asarray(xt)
  for row, a in enumerate(np.asarray(alpha)):
    keep = (xt[row] == 3).mean()
    expected = a + (1 - a) / v
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert abs(keep - expected) < 5 * sigma + 1e-9, (a, keep, expected)
    # Replaced tokens are uniform over the vocabulary, the original id included.
    counts = np.bincount(xt[row][np.asarray(resampled[row])], minlength=v)
    if counts.sum():
      np.testing.assert_allclose(counts / counts.sum(), np.full(v, 1 / v), atol=0.01)


def test_t_range_and_schedules():
  t = corruption.sample_t(jax.random.key(1), 10_000, eps=1e-4)
  assert float(t.min()) >= 1e-4 and float(t.max()) <= 1 - 1e-4
  for name in schedules.SCHEDULES:
    a, da = schedules.alpha_and_derivative(name, jnp.asarray([0.0, 0.5, 1.0]))
    np.testing.assert_allclose([a[0], a[2]], [1.0, 0.0], atol=1e-6)
    assert float(da[1]) < 0


def test_ordered_corruption_takes_the_highest_ranks_in_the_same_numbers():
  b, n, v = 6, 81, 13
  x0 = jnp.asarray(np.random.default_rng(0).integers(3, 13, (b, n)), jnp.int32)
  rank = jnp.asarray(np.random.default_rng(1).integers(0, 12, (b, n)), jnp.float32)
  alpha = jnp.asarray([0.0, 0.2, 0.5, 0.5, 0.8, 1.0])
  fractions = []
  for seed in range(200):
    xt, resampled = corruption.corrupt_in_order(jax.random.key(seed), x0, alpha, v, rank)
    xt, resampled, r = np.asarray(xt), np.asarray(resampled), np.asarray(rank)
    np.testing.assert_array_equal(xt[~resampled], np.asarray(x0)[~resampled])
    for row in range(b):  # every resampled token ranks at least as high as every kept one
      if resampled[row].any() and (~resampled[row]).any():
        assert r[row][resampled[row]].min() >= r[row][~resampled[row]].max()
    fractions.append(resampled.mean(1))
  # As many resampled tokens as independent coins give: a fraction 1 - alpha on average.
  mean = np.mean(fractions, 0)
  sigma = np.sqrt(np.asarray(alpha) * (1 - np.asarray(alpha)) / (n * 200))
  assert (np.abs(mean - (1 - np.asarray(alpha))) <= 5 * sigma + 1e-9).all(), mean
  # Ties break at random: among equal ranks, which ones are resampled varies from draw to draw.
  tied = jnp.zeros((1, n), jnp.float32)
  picks = {tuple(np.asarray(corruption.corrupt_in_order(jax.random.key(s), x0[:1], jnp.asarray([0.5]), v,
                                                         tied)[1][0])) for s in range(5)}
  assert len(picks) == 5


def test_tilted_noise_levels_have_density_proportional_to_t_to_the_tilt():
  # Kolmogorov-Smirnov against the CDF F(t) = t^(1+g) (the density (1+g) t^g), derived independently of the
  # sampler's inverse-CDF draw; at 40,000 draws the 0.1% critical distance is 1.95 / sqrt(n) ~ 0.0098.
  n = 40_000
  grid = np.linspace(0.01, 0.99, 99)
  for g in (-0.5, 0.0, 1.0, 2.5):
    t = np.sort(np.asarray(corruption.sample_t(jax.random.key(3), n, eps=1e-4, tilt=g)))
    assert t.min() >= 1e-4 and t.max() <= 1 - 1e-4
    empirical = np.searchsorted(t, grid) / n
    assert np.abs(empirical - grid ** (1 + g)).max() < 0.0098, g
  heavy = lambda g: float(np.mean(np.asarray(corruption.sample_t(jax.random.key(4), n, tilt=g)) > 0.7))
  assert heavy(1.0) > heavy(0.0) + 0.15  # 0.51 vs 0.30 draws with over 70% noise
  light = lambda g: float(np.mean(np.asarray(corruption.sample_t(jax.random.key(4), n, tilt=g)) < 1 / 16))
  assert light(-0.5) > light(0.0) + 0.15  # 0.25 vs 0.06 draws with under 1/16 noise


def test_tilt_ramps_linearly_then_holds():
  np.testing.assert_allclose([float(corruption.tilt_at(s, 2.0, 100)) for s in (0, 25, 100, 400)], [0, 0.5, 2, 2])
  assert float(corruption.tilt_at(0, 2.0, 0)) == 2.0  # no ramp: the whole tilt from the first step
  np.testing.assert_allclose(float(corruption.tilt_at(50, -0.5, 100)), -0.25)  # toward light noise
  for bad in ((-1.0, 10), (1.0, -5)):
    with pytest.raises(ValueError, match="t_tilt"):
      corruption.tilt_at(0, *bad)
