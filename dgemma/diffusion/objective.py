"""The block-diffusion training objective (spec §4.2-4.4), one function from a batch to a loss.

Per example: draw t and corrupt every canvas; pick one canvas s among the non-empty ones; encode
[prompt ‖ clean canvases] causally (cache + AR logits); denoise the noisy canvas s against the cache seen
up to slot P + s·C (prompt and clean canvases < s); self-condition; score.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from dgemma.config import ModelConfig
from dgemma.diffusion import chunked, corruption, losses, schedules
from dgemma.diffusion.config import ObjectiveConfig
from dgemma.model.cache import init_cache
from dgemma.model.transformer import DiffusionGemma

Batch = dict[str, Array]  # prompt [B,P] int, canvas [B,N·C] int, canvas_mask [B,N·C] bool; optional noise_rank [B,N·C]


def select_canvas(rng: jax.Array, canvas_mask_BxNC: Bool[Array, "B NC"], canvas_len: int) -> Int[Array, "B"]:
  """s ~ U{0..n_valid-1} per example, n_valid = max(1, number of canvases holding any target token)."""
  b, nc = canvas_mask_BxNC.shape
  n_valid = jnp.maximum(jnp.sum(jnp.any(canvas_mask_BxNC.reshape(b, nc // canvas_len, canvas_len), -1), -1), 1)
  return jnp.floor(jax.random.uniform(rng, (b,)) * n_valid).astype(jnp.int32)


def self_conditioning_rows(rng: jax.Array, batch_size: int, prob: float) -> Int[Array, "K"]:
  """The rows of a batch trained with self-conditioning: a random round(prob·B) of them (at least one).

  A fixed count instead of an independent coin per row keeps the shape static, so the no-signal first pass
  runs on those rows only, not on the whole batch (half the extra cost at prob 0.5)."""
  k = min(batch_size, max(1, round(prob * batch_size)))
  return jnp.sort(jax.random.permutation(rng, batch_size)[:k])


def take_canvas(x_BxNC: Array, s_B: Int[Array, "B"], canvas_len: int) -> Array:
  b, nc = x_BxNC.shape
  return x_BxNC.reshape(b, nc // canvas_len, canvas_len)[jnp.arange(b), s_B]


def loss_fn(params: dict, config: ModelConfig, objective: ObjectiveConfig, batch: Batch,
            rng: jax.Array, step: int | jax.Array = 0, *,
            position_features: Int[Array, "L F"] | None = None) -> tuple[jax.Array, dict[str, Array]]:
  """Total loss and per-step metrics. `objective` holds the knobs (validated when it was built); `step` (the
  training step) matters only to a noise-level curriculum (`t_tilt_steps`). `position_features`: the model's
  feature table (config.num_position_features > 0)."""
  model = DiffusionGemma(config)
  prompt, canvas, canvas_mask = batch["prompt"], batch["canvas"], batch["canvas_mask"]
  b, p = prompt.shape
  c = config.canvas_length
  if canvas.shape[1] % c:
    raise ValueError(f"canvas array of length {canvas.shape[1]} is not a whole number of canvases of {c}")
  t_rng, noise_rng, s_rng, sc_rng = jax.random.split(rng, 4)
  # noise_draws = k: each example is denoised at k independent noise levels against one encoding of its
  # prompt, so the encoder's forward and backward are shared by k denoiser rows.
  draws = objective.noise_draws
  repeat = (lambda x: jnp.repeat(x, draws, axis=0)) if draws > 1 else (lambda x: x)
  clean, clean_mask = canvas, canvas_mask  # what the encoder reads: b rows
  canvas, canvas_mask = repeat(canvas), repeat(canvas_mask)  # what the denoiser scores: b·k rows
  bd = b * draws

  # 1. Noise level and corruption of every canvas.
  tilt = corruption.tilt_at(step, objective.t_tilt, objective.t_tilt_steps)
  t = corruption.sample_t(t_rng, bd, objective.t_eps, tilt)
  alpha, dalpha = schedules.alpha_and_derivative(objective.schedule, t)
  x_t, _ = corruption.corrupt(noise_rng, canvas, alpha, config.vocab_size)
  if objective.ordered_noise_prob > 0:  # corrupt late-deduced tokens first (batch["noise_rank"])
    if "noise_rank" not in batch:
      raise ValueError("diffusion.ordered_noise_prob > 0 needs a task whose batches carry 'noise_rank'")
    order_rng, pick_rng = jax.random.split(jax.random.fold_in(noise_rng, 1))
    x_ordered, _ = corruption.corrupt_in_order(order_rng, canvas, alpha, config.vocab_size,
                                               repeat(batch["noise_rank"]))
    x_t = jnp.where(jax.random.bernoulli(pick_rng, objective.ordered_noise_prob, (bd, 1)), x_ordered, x_t)
  s = select_canvas(s_rng, canvas_mask, c)

  # 2. Encoder: causal pass over [prompt ‖ clean canvases] builds the cache and the AR logits.
  full = jnp.concatenate([prompt, clean], axis=1)
  valid = jnp.concatenate([prompt != config.pad_id, clean_mask], axis=1)
  want_ar = objective.ar_loss_weight > 0
  # Without the AR loss only what the denoiser reads is encoded: the last canvas is never context.
  enc_len = full.shape[1] if want_ar else full.shape[1] - c
  # With loss_chunk_tokens the model returns final hidden states and every loss makes its logits a chunk at a time.
  chunk = objective.loss_chunk_tokens
  enc_out, cache = model.apply({"params": params}, full[:, :enc_len], init_cache(config, b, enc_len),
                               valid[:, :enc_len], want_ar, position_features, return_hidden=chunk > 0,
                               method=DiffusionGemma.encode)
  metrics, total = {}, 0.0
  if want_ar:
    ar_mask = valid[:, :-1] & valid[:, 1:]
    if objective.ar_targets == "canvas":  # an AR baseline is given the prompt, as the denoiser is: no loss on it
      ar_mask = ar_mask & (jnp.arange(full.shape[1] - 1) >= p - 1)[None, :]
    if chunk:
      logits_of = _logits_of(model, params)
      ar_tokens = chunked.map_token_chunks(lambda h, y: losses.token_cross_entropy(logits_of(h)[None], y[None])[0],
                                           chunk, chunked.flatten_tokens(enc_out[:, :-1]),
                                           chunked.flatten_tokens(full[:, 1:]))
      ar_per_token = ar_tokens.reshape(b, -1)
    else:
      ar_per_token = losses.token_cross_entropy(enc_out[:, :-1], full[:, 1:])
    ar_B = losses.masked_mean(ar_per_token, ar_mask)
    metrics["ar_loss"] = jnp.mean(ar_B)
    total = objective.ar_loss_weight * metrics["ar_loss"]
  if objective.diffusion_loss_weight == 0:  # a purely autoregressive run: the denoiser is never called
    metrics["loss"] = total
    return total, metrics

  # 3. Denoiser on canvas s, seeing the prompt and the clean canvases before s.
  if not objective.cache_gradient:
    cache = jax.lax.stop_gradient(cache)
  cache = jax.tree_util.tree_map(repeat, cache).with_end(p + s * c)
  xt_s, x0_s, mask_s = take_canvas(x_t, s, c), take_canvas(canvas, s, c), take_canvas(canvas_mask, s, c)
  if chunk:
    per_token, correct = _chunked_denoiser(model, params, objective, xt_s, x0_s, cache, alpha, dalpha, sc_rng, bd,
                                           position_features)
  else:
    per_token, correct = _denoiser(model, params, objective, xt_s, x0_s, cache, alpha, dalpha, sc_rng, bd,
                                   position_features)
  diffusion_B = losses.masked_mean(per_token, mask_s)
  metrics["diffusion_loss"] = jnp.mean(diffusion_B)  # unweighted: comparable across runs and noise bins
  metrics["diffusion_accuracy"] = jnp.mean(losses.masked_mean(correct, mask_s))
  total = total + objective.diffusion_loss_weight * metrics["diffusion_loss"]
  metrics["loss"] = total
  if objective.t_tilt != 0:
    metrics["t_tilt"] = tilt
  metrics["loss_by_t_sum"], metrics["loss_by_t_count"] = losses.noise_bin_stats(diffusion_B, t,
                                                                                 objective.num_noise_bins)
  return total, metrics


def _denoiser(model: DiffusionGemma, params: dict, objective: ObjectiveConfig, xt_s, x0_s, cache, alpha, dalpha,
              sc_rng, bd: int, position_features) -> tuple[Array, Array]:
  """Steps 3 and 4 of `loss_fn` from the whole [B, C, V] logits: (loss, correct) per token of canvas s."""
  denoise = lambda canvas, cache, sc_logits=None, sc_mask=None: model.apply(
      {"params": params}, canvas, cache, sc_logits, sc_mask, position_features=position_features,
      method=DiffusionGemma.denoise)
  if objective.self_cond_prob > 0:
    # The no-signal first pass (as the sampler's first step) runs only on the rows that will use it; with
    # self_cond_passes > 1 each further pass reads its predecessor's logits, as the sampler's later steps do.
    # Every pass before the scored one is behind a stop-gradient (spec §3).
    rows = self_conditioning_rows(sc_rng, bd, objective.self_cond_prob)
    xt_k, cache_k = xt_s[rows], jax.tree_util.tree_map(lambda x: x[rows], cache)
    signal_k = jax.lax.stop_gradient(denoise(xt_k, cache_k))
    for _ in range(1, objective.self_cond_passes):
      signal_k = jax.lax.stop_gradient(denoise(xt_k, cache_k, signal_k, jnp.ones((xt_k.shape[0],), bool)))
    fed = jnp.zeros((bd,) + signal_k.shape[1:], signal_k.dtype).at[rows].set(signal_k)
    use_sc = jnp.zeros((bd,), bool).at[rows].set(True)
    logits = denoise(xt_s, cache, fed, use_sc)
  else:
    logits = denoise(xt_s, cache)

  # 4. Losses per token of canvas s, by diffusion.loss (flat_ce: the official recipe's unweighted CE).
  per_token = losses.denoiser_token_loss(objective.loss, logits, x0_s, xt_s, alpha, dalpha)
  return per_token, (jnp.argmax(logits, -1) == x0_s).astype(jnp.float32)


def _logits_of(model: DiffusionGemma, params: dict):
  """hidden [N, D] -> logits [N, V], exactly as the model makes them (tied unembedding, dtype, final softcap)."""
  return lambda h_NxD: model.apply({"params": params}, h_NxD, method=DiffusionGemma.logits_from_hidden)


def _chunked_denoiser(model: DiffusionGemma, params: dict, objective: ObjectiveConfig, xt_s, x0_s, cache, alpha,
                      dalpha, sc_rng, bd: int, position_features) -> tuple[Array, Array]:
  """`_denoiser` from the denoiser's hidden states, `objective.loss_chunk_tokens` tokens at a time: the same
  self-conditioning rows and passes, the same per-token losses, without [B, C, V] logits. The self-conditioning
  input is the soft embedding softmax(logits) @ E · sqrt(D), [B, C, D], itself computed chunk by chunk."""
  chunk = objective.loss_chunk_tokens
  logits_of = _logits_of(model, params)
  denoise = lambda canvas, cache, sc_embeds=None, sc_mask=None: model.apply(
      {"params": params}, canvas, cache, position_features=position_features, self_conditioning_mask=sc_mask,
      self_conditioning_embeds=sc_embeds, return_hidden=True, method=DiffusionGemma.denoise)

  def soft_embeds(h_KxCxD):
    """softmax(logits) @ E · sqrt(D) of a no-gradient pass's hidden states: as in `_denoiser`, no gradient reaches
    the logits, but the scored pass's product with E is differentiated (so E's gradient is the same)."""
    def fn(h):
      logits = jax.lax.stop_gradient(logits_of(h))
      return model.apply({"params": params}, logits, method=DiffusionGemma.soft_embeds)
    flat = chunked.map_token_chunks(fn, chunk, chunked.flatten_tokens(jax.lax.stop_gradient(h_KxCxD)))
    return flat.reshape(h_KxCxD.shape[:2] + flat.shape[1:])

  if objective.self_cond_prob > 0:  # as in _denoiser, each pass fed the soft embedding of its predecessor's logits
    rows = self_conditioning_rows(sc_rng, bd, objective.self_cond_prob)
    xt_k, cache_k = xt_s[rows], jax.tree_util.tree_map(lambda x: x[rows], cache)
    hidden_k = jax.lax.stop_gradient(denoise(xt_k, cache_k))
    for _ in range(1, objective.self_cond_passes):
      signal_k = jax.lax.stop_gradient(soft_embeds(hidden_k))
      hidden_k = jax.lax.stop_gradient(denoise(xt_k, cache_k, signal_k, jnp.ones((xt_k.shape[0],), bool)))
    signal_k = soft_embeds(hidden_k)
    fed = jnp.zeros((bd,) + signal_k.shape[1:], signal_k.dtype).at[rows].set(signal_k)
    use_sc = jnp.zeros((bd,), bool).at[rows].set(True)
    hidden = denoise(xt_s, cache, fed, use_sc)
  else:
    hidden = denoise(xt_s, cache)

  c = xt_s.shape[1]
  per_row = lambda v_B: jnp.repeat(v_B, c)  # a row's noise level for each of its tokens

  def token_losses(h, x0, xt, a, da):
    logits = logits_of(h)[:, None]  # [n, 1, V]: each token its own row (the losses are per token)
    per_token = losses.denoiser_token_loss(objective.loss, logits, x0[:, None], xt[:, None], a, da)[:, 0]
    return per_token, (jnp.argmax(logits[:, 0], -1) == x0).astype(jnp.float32)

  per_token, correct = chunked.map_token_chunks(
      token_losses, chunk, chunked.flatten_tokens(hidden), x0_s.reshape(-1), xt_s.reshape(-1), per_row(alpha),
      per_row(dalpha))
  return per_token.reshape(bd, c), correct.reshape(bd, c)
