"""The forward process's marginals: a token survives with probability alpha + (1 - alpha)/V."""

import jax
import jax.numpy as jnp
import numpy as np

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
