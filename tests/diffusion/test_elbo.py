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


# A data distribution p(x0) over V**length canvases instead of one fixed x0: the bound averaged over p(x0) is
# >= H(p), with equality iff the reverse rates are the exact time reversal's. In this parameterization the rate
# from x_t to x_t with token l set to j is ∝ xbar_θ,j / xbar_θ,i, and the exact one has the same form with p_θ at
# position l the posterior of x0_l given the OTHER noisy tokens x_t^{-l} (p_t(x^{l<-j}) / p_t(x) =
# E[q(j | x0_l)] / E[q(i | x0_l)], x0_l ~ p(x0_l | x_t^{-l})). So that context-only posterior makes the bound H(p)
# (the prior term is 0: alpha(1) = 0), the full posterior p(x0_l | x_t) does not, and dividing the full one by
# the own token's likelihood (Bayes, `losses.context_only_logits`) gives the context-only one back.


def canvases(length):
  return np.array(list(itertools.product(range(V), repeat=length)))  # [S, length]


def data_distribution(length, seed):
  return np.random.default_rng(seed).dirichlet(np.ones(V ** length))  # full support: every posterior is defined


def token_posteriors(p0_S, states_SxL, alpha):
  """(full, context-only) posteriors of each clean token, [S (x_t), L, V], by enumerating x0 in float64:
  p(x0_l | x_t) ∝ Σ_{x0: x0_l = j} p(x0) Π_m q(x_t,m | x0_m); the context-only one leaves out the factor m = l."""
  n_tokens = states_SxL.shape[1]
  lik = alpha * np.eye(V) + (1 - alpha) / V  # lik[x0 token, x_t token]
  per_token = lik[states_SxL[:, None, :], states_SxL[None, :, :]]  # [S (x0), S (x_t), L]
  full, context = [], []
  for l in range(n_tokens):
    by_x0_l = np.eye(V)[states_SxL[:, l]]  # [S (x0), V]
    others = np.prod(np.where(np.arange(n_tokens) == l, 1.0, per_token), axis=-1)
    full.append((p0_S[:, None] * per_token.prod(-1)).T @ by_x0_l)
    context.append((p0_S[:, None] * others).T @ by_x0_l)
  normalize = lambda w: np.stack(w, 1) / np.stack(w, 1).sum(-1, keepdims=True)
  return normalize(full), normalize(context)


def log_t_quadrature(points=96, t0=1e-7):
  """Gauss-Legendre nodes and weights for ∫_{t0}^1 dt in s = log t, where f(t) dt = f(e^s) e^s ds is smooth: the
  integrand's log(1/t) growth becomes s·e^s. Each node is moved to where alpha = 1 - t is a float32 (by < 6e-8),
  so the float32 integrand and the float64 posteriors and weights see the same alpha."""
  nodes, weights = np.polynomial.legendre.leggauss(points)
  lo = math.log(t0)
  s = lo + (nodes + 1) / 2 * -lo
  alpha = np.float32(1 - np.exp(s)).astype(np.float64)
  return 1 - alpha, weights * -lo / 2 * np.exp(s)


def data_bound(p0_S, length, model, points=96, t0=1e-7):
  """∫_0^1 Σ_{x0} p(x0) Σ_{x_t} q(x_t | x0) Σ_l f_l dt, f = `uniform_elbo_per_token`, with the model's logits a
  table indexed by x_t, one per t: model(full, context, alpha) -> [S, L, V] logits. The piece [0, t0] is
  t0·f(t0): the integrand is c·log(1/t) + b there, so this leaves out c·t0 <= length·t0 = 2e-7 nats."""
  states = canvases(length)
  s = len(states)
  t_values, weights = log_t_quadrature(points, t0)
  logits, x0, x_t, alpha, mass = [], [], [], [], []
  for t in t_values:
    table_SxLxV = np.asarray(model(*token_posteriors(p0_S, states, 1 - t), 1 - t), np.float64)
    lik = (1 - t) * np.eye(V) + t / V  # lik[x0 token, x_t token]
    q = lik[states[:, None, :], states[None, :, :]].prod(-1)  # [S (x0), S (x_t)]: q(x_t | x0)
    logits.append(np.tile(table_SxLxV, (s, 1, 1)))
    x0.append(np.repeat(states, s, 0))
    x_t.append(np.tile(states, (s, 1)))
    alpha.append(np.full(s * s, 1 - t))
    mass.append((p0_S[:, None] * q).ravel())  # row x0 * s + x_t, as the repeat / tile above
  f = losses.uniform_elbo_per_token(jnp.asarray(np.concatenate(logits), jnp.float32),
                                    jnp.asarray(np.concatenate(x0)), jnp.asarray(np.concatenate(x_t)),
                                    jnp.asarray(np.concatenate(alpha), jnp.float32),
                                    -jnp.ones(len(t_values) * s * s, jnp.float32))
  f_t = (np.asarray(f, np.float64).sum(-1) * np.concatenate(mass)).reshape(len(t_values), s * s).sum(-1)
  return f_t @ weights + t0 * f_t[0]


def context_only(full, context, alpha):
  return np.log(context)


def full_posterior(full, context, alpha):
  return np.log(full)


def bayes_converted(full, context, alpha):
  states = canvases(full.shape[1])
  return losses.context_only_logits(jnp.asarray(np.log(full), jnp.float32), jnp.asarray(states),
                                    jnp.full(len(states), alpha, jnp.float32))


@pytest.mark.parametrize("length,seed", [(1, 0), (2, 0), (2, 1)])
def test_the_bound_is_the_entropy_for_the_context_only_posterior_and_loose_for_the_full_one(length, seed):
  p0 = data_distribution(length, seed)
  entropy = -np.sum(p0 * np.log(p0))
  # 1e-5 nats: float32 rounding of the integrand, the quadrature (in float64, doubling the nodes moves it by
  # < 3e-8) and the left-out [0, t0] (<= 2e-7) land within 4e-7 of H here; room, and 1e4 times under the gap.
  assert data_bound(p0, length, context_only) == pytest.approx(entropy, abs=1e-5)
  assert data_bound(p0, length, bayes_converted) == pytest.approx(entropy, abs=1e-5)
  # the full posterior is what a flat cross-entropy trains toward: 0.36 nats (L = 1) and 0.90 (L = 2) too many
  assert data_bound(p0, length, full_posterior) > entropy + 0.1


def test_the_full_and_context_only_posteriors_differ_and_the_tables_are_consistent():
  """The tables the test above feeds are what they claim: at mid noise the two posteriors differ, and at L = 1
  the context-only one is the marginal p(x0) whatever x_t."""
  p0 = data_distribution(1, 0)
  full, context = token_posteriors(p0, canvases(1), 0.5)
  np.testing.assert_allclose(context, np.broadcast_to(p0, (V, 1, V)), atol=1e-12)
  assert np.abs(full - context).max() > 0.05
  p0 = data_distribution(2, 0)
  full, context = token_posteriors(p0, canvases(2), 0.5)
  # token 0 given the other noisy token k: ∝ Σ_{x0_1} p(x0_0, x0_1) q(k | x0_1), a matrix product
  expected = (p0.reshape(V, V) @ (0.5 * np.eye(V) + 0.5 / V))[:, canvases(2)[:, 1]].T
  np.testing.assert_allclose(context[:, 0], expected / expected.sum(-1, keepdims=True), atol=1e-12)


@pytest.mark.parametrize("alpha", [0.0, 0.3, 0.9, 1 - 2.0 ** -20])
def test_context_only_logits_is_bayes_division_by_the_own_token_likelihood(alpha):
  rng = np.random.default_rng(7)
  b, n, v = 4, 5, 6
  logits = rng.normal(0, 2, (b, n, v))
  x_t, x0 = rng.integers(0, v, (b, n)), rng.integers(0, v, (b, n))
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  divided = probs / (alpha * np.eye(v)[x_t] + (1 - alpha) / v)  # p_j / q(x_t | x0 = j), in float64
  divided /= divided.sum(-1, keepdims=True)
  alpha_B = jnp.full(b, alpha, jnp.float32)
  converted = losses.context_only_logits(jnp.asarray(logits, jnp.float32), jnp.asarray(x_t), alpha_B)
  np.testing.assert_allclose(jax.nn.softmax(converted, -1), divided, rtol=1e-5, atol=1e-7)
  elbo_of = lambda lg: losses.uniform_elbo_per_token(jnp.asarray(lg, jnp.float32), jnp.asarray(x0),
                                                     jnp.asarray(x_t), alpha_B, -jnp.ones(b, jnp.float32))
  np.testing.assert_allclose(elbo_of(converted), elbo_of(np.log(divided)), rtol=1e-4, atol=1e-5)


def test_training_losses_read_the_denoiser_as_named():
  """diffusion.loss: flat_ce is -log p(x0); elbo reads the logits as the context-only posterior; elbo_full divides
  the full posterior by the own token's likelihood first (numpy, float64), as the held-out bound of a flat-CE model."""
  rng = np.random.default_rng(11)
  b, n, v = 3, 4, 5
  logits = rng.normal(0, 2, (b, n, v))
  x_t, x0 = rng.integers(0, v, (b, n)), rng.integers(0, v, (b, n))
  alpha = np.array([0.2, 0.7, 0.99])
  dalpha = -np.ones(b)
  probs = np.exp(logits) / np.exp(logits).sum(-1, keepdims=True)
  divided = probs / (alpha[:, None, None] * np.eye(v)[x_t] + (1 - alpha[:, None, None]) / v)
  divided /= divided.sum(-1, keepdims=True)
  args = (jnp.asarray(x0), jnp.asarray(x_t), jnp.asarray(alpha, jnp.float32), jnp.asarray(dalpha, jnp.float32))
  loss = lambda name: np.asarray(losses.denoiser_token_loss(name, jnp.asarray(logits, jnp.float32), *args))
  elbo_of = lambda lg: np.asarray(losses.uniform_elbo_per_token(jnp.asarray(lg, jnp.float32), *args))
  np.testing.assert_allclose(loss("flat_ce"), -np.log(np.take_along_axis(probs, x0[..., None], -1)[..., 0]),
                             rtol=1e-5)
  np.testing.assert_allclose(loss("elbo"), elbo_of(logits), rtol=1e-6)
  np.testing.assert_allclose(loss("elbo_full"), elbo_of(np.log(divided)), rtol=1e-4, atol=1e-5)
  assert np.abs(loss("elbo_full") - loss("elbo")).max() > 0.1  # the two readings differ
  with pytest.raises(ValueError, match="unknown diffusion loss"):
    losses.denoiser_token_loss("mse", jnp.asarray(logits, jnp.float32), *args)


def test_context_only_logits_at_alpha_one_drops_the_own_token_without_nan():
  logits = jnp.zeros((1, 2, 3))
  out = np.asarray(losses.context_only_logits(logits, jnp.array([[1, 2]]), jnp.ones(1)))
  assert np.isneginf(out[0, 0, 1]) and np.isneginf(out[0, 1, 2])
  assert np.isfinite(np.delete(out[0, 0], 1)).all() and np.isfinite(np.delete(out[0, 1], 2)).all()
