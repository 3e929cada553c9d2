"""The held-out ELBO against brute force on a tiny vocabulary: a fixed "model" (a random table of logits indexed
by the whole noisy canvas x_t), every x_t enumerated, the discrete-time bound and the exact likelihood of the
discrete-time generative model computed by matrix products, independently of the integrand's closed form."""

import itertools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma.diffusion import elbo, losses

V, L = 3, 2
X0 = np.array([2, 0])
STATES = np.array(list(itertools.product(range(V), repeat=L)))  # [S, L], S = V**L
INDEX = V ** np.arange(L)[::-1]  # state tuple -> row of STATES


def table(seed, perfect=False):
  if perfect:  # all mass on x0 whatever x_t: the bound is 0
    return np.broadcast_to(30.0 * np.eye(V)[X0], (len(STATES), L, V)).copy()
  return np.random.default_rng(seed).normal(0, 1.5, (len(STATES), L, V))


def denoiser(logits_SxLxV):
  tab = jnp.asarray(logits_SxLxV, jnp.float32)
  return lambda x_t_BxL: tab[x_t_BxL @ jnp.asarray(INDEX)]


def q_states(alpha):
  """q(x_t = each state | x0), the product over tokens of alpha·onehot + (1 - alpha)/V."""
  per_token = alpha * np.eye(V)[X0] + (1 - alpha) / V  # [L, V]
  return np.prod(per_token[np.arange(L), STATES], axis=1)


def exact_integrand(logits, t_values):
  """E_{x_t}[Σ_l integrand] at each t, the expectation as a sum over all V**L states."""
  s, nt = len(STATES), len(t_values)
  t = np.repeat(t_values, s)
  alpha, dalpha = 1.0 - t, -np.ones_like(t)  # the linear schedule
  x_t = np.tile(STATES, (nt, 1))
  probs_logits = np.tile(logits, (nt, 1, 1))
  f = losses.uniform_elbo_per_token(jnp.asarray(probs_logits, jnp.float32), jnp.tile(jnp.asarray(X0), (nt * s, 1)),
                                    jnp.asarray(x_t), jnp.asarray(alpha, jnp.float32), jnp.asarray(dalpha, jnp.float32))
  f = np.asarray(f, np.float64).sum(1).reshape(nt, s)
  return np.array([f[i] @ q_states(1.0 - tv) for i, tv in enumerate(t_values)])


def continuous_bound(logits, points=4000):
  t = (np.arange(points) + 0.5) / points
  return exact_integrand(logits, t).mean()


def posterior(x_t_token, vec_V, alpha_t, alpha_s):
  """q(x_s | x_t, x0 ~ vec): ∝ q(x_t | x_s) · (alpha_s vec + (1 - alpha_s)/V), for one token."""
  a_ts = alpha_t / alpha_s
  forward = a_ts * (np.arange(V) == x_t_token) + (1 - a_ts) / V
  w = forward * (alpha_s * vec_V + (1 - alpha_s) / V)
  return w / w.sum()


def discrete_time(logits, steps):
  """(NELBO, exact NLL) of the `steps`-step generative model p_θ(x_s|x_t) = Π_l q(x_s^l | x_t, x0^l ~ p_θ)."""
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  onehot = np.eye(V)[X0]
  nelbo = 0.0
  dist = np.full(len(STATES), 1.0 / len(STATES))  # x_1 is uniform: the prior, KL 0
  for i in range(steps, 0, -1):
    alpha_t, alpha_s = 1 - i / steps, 1 - (i - 1) / steps
    q = q_states(alpha_t)
    trans = np.ones((len(STATES), len(STATES)))  # p_θ(x_s = col | x_t = row)
    for r, x_t in enumerate(STATES):
      per_token = [posterior(x_t[l], probs[r, l], alpha_t, alpha_s) for l in range(L)]
      trans[r] = np.prod([per_token[l][STATES[:, l]] for l in range(L)], axis=0)
      for l in range(L):
        if i == 1:  # reconstruction: -log p_θ(x0 | x_{1/T})
          nelbo += q[r] * -math.log(per_token[l][X0[l]])
        else:
          true = posterior(x_t[l], onehot[l], alpha_t, alpha_s)
          nz = true > 0
          nelbo += q[r] * np.sum(true[nz] * np.log(true[nz] / per_token[l][nz]))
    dist = dist @ trans
  return nelbo, -math.log(dist[X0 @ INDEX])


@pytest.mark.parametrize("seed", [0, 1])
def test_the_continuous_bound_is_the_limit_of_the_discrete_time_bound_and_bounds_the_likelihood(seed):
  logits = table(seed)
  bound = continuous_bound(logits)
  nelbo_t, nll_t = discrete_time(logits, 2000)
  assert nll_t <= nelbo_t  # the discrete-time ELBO, exactly
  assert bound == pytest.approx(nelbo_t, rel=5e-3)  # the T -> infinity limit
  assert nll_t < bound  # the fine-step model's exact NLL is under the continuous bound
  assert bound > 0


def test_a_perfect_model_has_bound_zero_and_a_uniform_one_l_log_v():
  assert abs(continuous_bound(table(0, perfect=True))) < 1e-6
  uniform = np.zeros((len(STATES), L, V))  # x_1 uniform stays uniform: p(x) = V**-L exactly
  assert continuous_bound(uniform) == pytest.approx(L * math.log(V), rel=1e-4)
  assert discrete_time(uniform, 50)[1] == pytest.approx(L * math.log(V))


def test_the_midpoint_rule_over_strata_converges_to_the_integral():
  logits = table(0)
  truth = continuous_bound(logits)
  errors = [abs(exact_integrand(logits, np.asarray(elbo.stratified_t(k))).mean() - truth) for k in (4, 16, 64)]
  # The integrand grows like log(1/t) as t -> 0, so the midpoint rule's error falls about as 1/K, not 1/K^2.
  assert errors[0] > 3 * errors[1] > 9 * errors[2] and errors[2] < 5e-3 * truth


def test_the_sampled_strata_match_the_exact_expectation():
  """Many identical rows: each stratum's Monte-Carlo mean comes close to the enumeration's expectation."""
  logits, k, rows = table(0), 8, 4000
  x0 = jnp.tile(jnp.asarray(X0), (rows, 1))
  sums, ce = elbo.strata_sums(denoiser(logits), x0, jnp.ones((rows, L), bool), V, "linear", k, jax.random.key(3))
  exact = exact_integrand(logits, np.asarray(elbo.stratified_t(k)))
  mean, sem = np.asarray(sums).mean(0), np.asarray(sums).std(0) / math.sqrt(rows)
  assert np.all(np.abs(mean - exact) < 5 * sem + 1e-6)
  out = elbo.summarize(sums, ce, np.full(rows, L))
  assert out["num_t"] == k and out["num_tokens"] == rows * L
  assert out["bits_per_token"] == pytest.approx(exact.mean() / L / math.log(2), abs=5 * out["stderr_bits_per_token"])
  assert out["elbo_integrand_bits_by_t"] == pytest.approx((mean / L / math.log(2)).tolist(), rel=1e-4)


def test_the_estimate_is_deterministic_and_strata_do_not_depend_on_the_call():
  logits = table(1)
  x0, mask = jnp.tile(jnp.asarray(X0), (16, 1)), jnp.ones((16, L), bool)
  a = elbo.strata_sums(denoiser(logits), x0, mask, V, "linear", 16, jax.random.key(0))
  b = elbo.strata_sums(denoiser(logits), x0, mask, V, "linear", 16, jax.random.key(0))
  assert all(np.array_equal(x, y) for x, y in zip(a, b))
  c = elbo.strata_sums(denoiser(logits), x0, mask, V, "linear", 16, jax.random.key(1))
  assert not np.array_equal(a[0], c[0])
  # one key per example: an example's noise does not depend on the rows beside it
  keys = jax.vmap(lambda i: jax.random.fold_in(jax.random.key(0), i))(jnp.arange(16))
  whole = elbo.strata_sums(denoiser(logits), x0, mask, V, "linear", 16, keys)[0]
  half = elbo.strata_sums(denoiser(logits), x0[8:], mask[8:], V, "linear", 16, keys[8:])[0]
  assert np.array_equal(np.asarray(whole)[8:], np.asarray(half))


def test_masked_tokens_only_and_bad_k():
  logits = table(0)
  x0 = jnp.tile(jnp.asarray(X0), (4, 1))
  full = elbo.strata_sums(denoiser(logits), x0, jnp.ones((4, L), bool), V, "linear", 4, jax.random.key(0))[0]
  first = elbo.strata_sums(denoiser(logits), x0, jnp.array([[True, False]] * 4), V, "linear", 4,
                           jax.random.key(0))[0]
  assert np.all(np.asarray(first) <= np.asarray(full) + 1e-6)
  with pytest.raises(ValueError, match="positive integer"):
    elbo.stratified_t(0)
  with pytest.raises(ValueError, match="no target tokens"):
    elbo.summarize(np.zeros((2, 3)), np.zeros((2, 3)), np.zeros(2))
