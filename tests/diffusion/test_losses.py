"""Loss functions against brute-force expectations."""

import jax
import jax.numpy as jnp
import numpy as np

from dgemma.diffusion import losses, schedules


def test_cross_entropy_matches_numpy():
  rng = np.random.default_rng(0)
  logits = rng.normal(size=(2, 3, 5)).astype(np.float32)
  targets = rng.integers(0, 5, (2, 3))
  exact = logits.astype(np.float64)  # the reference in float64: only our float32 rounding is compared
  expected = -np.log(np.exp(exact) / np.exp(exact).sum(-1, keepdims=True))
  expected = np.take_along_axis(expected, targets[..., None], -1)[..., 0]
  np.testing.assert_allclose(losses.token_cross_entropy(jnp.asarray(logits), jnp.asarray(targets)), expected,
                             rtol=1e-5)


def test_masked_mean():
  values = jnp.asarray([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
  mask = jnp.asarray([[True, False, True], [False, False, False]])
  np.testing.assert_allclose(losses.masked_mean(values, mask), [2.0, 0.0])


def _posterior(z_t, x, a_s, a_t, v):
  """q(z_s | z_t, x) for uniform-state diffusion with a probability vector x (exact enumeration)."""
  a_ts = a_t / a_s
  trans = a_ts * np.eye(v) + (1 - a_ts) / v  # trans[z_s, z_t] = q(z_t | z_s)
  prior = a_s * x + (1 - a_s) / v  # q(z_s | x)
  post = trans[:, z_t] * prior
  return post / post.sum()


def test_uniform_elbo_is_the_limit_of_the_discrete_time_kl_sum():
  """The continuous-time integrand, integrated over t, equals the T -> infinity limit of the discrete
  diffusion ELBO Σ_steps E_{z_t} KL(q(z_s|z_t,x0) || q(z_s|z_t,p_θ)), computed by enumeration."""
  v, x0 = 5, 2
  rng = np.random.default_rng(0)
  table = rng.normal(size=(v, v)) * 2  # the model's logits as a function of z_t
  p_theta = np.exp(table) / np.exp(table).sum(-1, keepdims=True)
  t0, t1, steps = 0.2, 0.8, 4000
  alpha = lambda t: np.cos(0.5 * np.pi * t)  # cosine schedule
  grid = np.linspace(t0, t1, steps + 1)
  onehot = np.eye(v)[x0]
  discrete = 0.0
  for s, t in zip(grid[:-1], grid[1:]):
    q_t = alpha(t) * onehot + (1 - alpha(t)) / v
    for z in range(v):
      post_true = _posterior(z, onehot, alpha(s), alpha(t), v)
      post_model = _posterior(z, p_theta[z], alpha(s), alpha(t), v)
      discrete += q_t[z] * np.sum(post_true * np.log(post_true / post_model))
  # Continuous: midpoint rule over t of E_{z_t}[integrand].
  mids = 0.5 * (grid[:-1] + grid[1:])
  a, da = schedules.alpha_and_derivative("cosine", jnp.asarray(mids, jnp.float32))
  per_z = np.stack([np.asarray(losses.uniform_elbo_per_token(
      jnp.broadcast_to(jnp.asarray(table[z], jnp.float32), (len(mids), 1, v)),
      jnp.full((len(mids), 1), x0), jnp.full((len(mids), 1), z), a, da)[:, 0]) for z in range(v)])  # [v, T]
  q = np.asarray(a)[None, :] * (np.arange(v) == x0)[:, None] + (1 - np.asarray(a))[None, :] / v
  continuous = float(np.sum(q * np.asarray(per_z)) * (t1 - t0) / steps)
  np.testing.assert_allclose(continuous, discrete, rtol=2e-3)


def test_uniform_elbo_zero_for_perfect_model_and_nonnegative():
  v = 7
  x0 = jax.random.randint(jax.random.key(0), (8, 5), 0, v)
  xt = jax.random.randint(jax.random.key(1), (8, 5), 0, v)
  a, da = schedules.alpha_and_derivative("linear", jax.random.uniform(jax.random.key(2), (8,), minval=.01, maxval=.99))
  perfect = 50.0 * jax.nn.one_hot(x0, v)
  assert float(jnp.abs(losses.uniform_elbo_per_token(perfect, x0, xt, a, da)).max()) < 1e-3
  random_logits = 3 * jax.random.normal(jax.random.key(3), (8, 5, v))
  assert float(losses.uniform_elbo_per_token(random_logits, x0, xt, a, da).min()) >= -1e-5


def test_noise_bin_stats():
  loss = jnp.asarray([1.0, 2.0, 3.0, 4.0])
  t = jnp.asarray([0.05, 0.07, 0.55, 0.999])
  sums, counts = losses.noise_bin_stats(loss, t, 10)
  np.testing.assert_allclose(sums, [3.0, 0, 0, 0, 0, 3.0, 0, 0, 0, 4.0])
  np.testing.assert_allclose(counts, [2, 0, 0, 0, 0, 1, 0, 0, 0, 1])
