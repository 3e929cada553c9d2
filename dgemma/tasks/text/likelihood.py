"""Held-out likelihood of a text model (docs/text.md, "Held-out likelihood"): the uniform-state ELBO in bits per
response token on fixed stratified noise levels (`dgemma.diffusion.elbo`), or for an objective=ar model the exact
NLL of the same tokens by teacher forcing through the causal encoder. Used by scripts/eval_text.py and by the
text task's in-training evaluation."""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Iterable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from dgemma.config import ModelConfig
from dgemma.diffusion import elbo, losses
from dgemma.model.cache import init_cache
from dgemma.model.transformer import DiffusionGemma
from dgemma.tasks.text import decoding

BATCH_KEYS = ("prompt", "canvas", "canvas_mask")


@dataclasses.dataclass(frozen=True)
class Settings:
  """What the numbers depend on besides the weights and the data: same settings, comparable numbers."""
  mode: str = "diffusion"  # or "ar"
  num_t: int = 16
  draws: int = 1
  seed: int = 0
  schedule: str = "linear"
  t_eps: float = 1e-4
  denoiser_output: str = "full"  # how the bound reads the denoiser (elbo.DENOISER_OUTPUTS); the recipe's flat CE: full
  # Further denoiser passes at the same x_t, each fed its predecessor's logits as the self-conditioning signal (as
  # training's self-conditioning rows are). Still a function of x_t and the context alone, so the bound stays a
  # bound; 0: one pass without a signal.
  self_cond_passes: int = 0

  def __post_init__(self):
    if self.mode not in ("diffusion", "ar"):
      raise ValueError(f"likelihood mode must be 'diffusion' or 'ar', got {self.mode!r}")
    if self.denoiser_output not in elbo.DENOISER_OUTPUTS:
      raise ValueError(f"--denoiser_output must be one of {elbo.DENOISER_OUTPUTS}, got {self.denoiser_output!r}")
    if self.mode == "ar" and self.self_cond_passes:
      raise ValueError("--self_cond_passes is for the diffusion bound; an AR model's NLL reads the causal encoder")
    for name, least in (("num_t", 1), ("draws", 1), ("self_cond_passes", 0)):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ValueError(f"--{name} must be >= {least}, got {value}")


def settings_from(diffusion: dict, mode: str = "auto", denoiser_output: str = "auto", **kw) -> Settings:
  """Settings from a training config's `diffusion` section: mode auto is 'ar' for an objective=ar run
  (decoding.mode); denoiser_output auto is what the run's loss trains: 'context' for loss=elbo, else 'full' (the
  recipe's flat cross-entropy, loss=elbo_full; also a checkpoint without a training config, as HF's)."""
  if denoiser_output == "auto":
    denoiser_output = elbo.denoiser_output_for(diffusion.get("loss", "flat_ce"))
  return Settings(mode=decoding.mode(diffusion, mode), schedule=diffusion.get("schedule", "linear"),
                  t_eps=float(diffusion.get("t_eps", 1e-4)), denoiser_output=denoiser_output, **kw)


def text_bytes(encoder, canvas: np.ndarray, mask: np.ndarray) -> int:
  """UTF-8 bytes of the text that an example's scored response tokens spell: the tokens under the mask decoded
  with the special ids (PAD, EOS, BOS, the stop ids that end a turn) dropped. Bits per byte compare runs whose
  tokenizers differ, where bits per token do not."""
  lay = encoder.layout
  special = {lay.pad_id, lay.eos_id, encoder.tokenizer.bos_id, *lay.stop_ids}
  ids = [int(t) for t in canvas[mask] if int(t) not in special]
  return len(encoder.tokenizer.decode(ids).encode("utf-8"))


def batches(encoder, batch_size: int, limit: int = 0) -> Iterator[dict[str, np.ndarray]]:
  """The examples in record order (those the encoder drops are skipped), `batch_size` at a time, each with the
  bytes of response text it scores (`text_bytes`); the last batch may be smaller."""
  n = len(encoder.records) if not limit else min(limit, len(encoder.records))
  rows = []
  for i in range(n):
    example = encoder(i)
    if example is not None:
      rows.append(example)
    if rows and (len(rows) == batch_size or i == n - 1):
      batch = {k: np.stack([r[k] for r in rows]) for k in BATCH_KEYS}
      batch["text_bytes"] = np.array([text_bytes(encoder, r["canvas"], r["canvas_mask"]) for r in rows], np.int64)
      yield batch
      rows = []


class Scorer:
  """The model's jitted encode and denoise, compiled once per shape, weights as an argument."""

  def __init__(self, config: ModelConfig, position_features=None):
    self.config = config
    model = DiffusionGemma(config)
    pf = None if position_features is None else jnp.asarray(position_features)

    @functools.partial(jax.jit, static_argnums=3)
    def encode(params, tokens, valid, want_logits):
      return model.apply({"params": params}, tokens, init_cache(config, tokens.shape[0], tokens.shape[1]), valid,
                         want_logits, pf, method=DiffusionGemma.encode)

    @functools.partial(jax.jit, static_argnums=4)
    def denoise(params, canvas, cache, end, self_cond_passes=0):
      def one_pass(signal):
        return model.apply({"params": params}, canvas, cache.with_end(end), signal, position_features=pf,
                           method=DiffusionGemma.denoise)
      logits = one_pass(None)
      for _ in range(self_cond_passes):
        logits = one_pass(logits)
      return logits

    self.encode, self.denoise = encode, denoise


def evaluate(scorer: Scorer, params, batch_iter: Iterable[dict], s: Settings) -> dict:
  """The numbers (docs/text.md). Example i's noise comes from fold_in(key(seed), i): batching does not change it."""
  config = scorer.config
  c = config.canvas_length
  key = jax.random.key(s.seed)
  elbo_rows, ce_rows, tokens, nll_rows, text_bytes_rows = [], [], [], [], []
  first = 0
  for batch in batch_iter:
    prompt, canvas, mask = (jnp.asarray(batch[k]) for k in BATCH_KEYS)
    b, p = prompt.shape
    full = jnp.concatenate([prompt, canvas], 1)
    valid = jnp.concatenate([prompt != config.pad_id, mask], 1)
    tokens.append(np.asarray(jnp.sum(mask, 1)))
    if "text_bytes" in batch:
      text_bytes_rows.append(np.asarray(batch["text_bytes"]))
    keys_B = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(first, first + b))
    first += b
    if s.mode == "ar":  # response token j predicted from the prompt and the response before it
      logits, _ = scorer.encode(params, full, valid, True)
      ce = losses.token_cross_entropy(logits[:, :-1], full[:, 1:])
      target = jnp.concatenate([jnp.zeros((b, p - 1), bool), mask], 1)
      nll_rows.append(np.asarray(jnp.sum(ce * target, 1), np.float64))
      continue
    n_canvases = canvas.shape[1] // c
    enc = p + (n_canvases - 1) * c  # the last canvas is never context
    _, cache = scorer.encode(params, full[:, :enc], valid[:, :enc], False)
    e_BxK, ce_BxK = np.zeros((b, s.num_t)), np.zeros((b, s.num_t))
    for j in range(n_canvases):  # canvas j against the prompt and the clean canvases before it
      x0, m = canvas[:, j * c:(j + 1) * c], mask[:, j * c:(j + 1) * c]
      if not bool(jnp.any(m)):
        continue
      end = jnp.full((b,), p + j * c, jnp.int32)
      keys_j = jax.vmap(lambda k: jax.random.fold_in(k, j))(keys_B)
      e, ce = elbo.strata_sums(lambda x_t: scorer.denoise(params, x_t, cache, end, s.self_cond_passes), x0, m,
                               config.vocab_size, s.schedule, s.num_t, keys_j, s.t_eps, s.draws, s.denoiser_output)
      e_BxK += np.asarray(e, np.float64)
      ce_BxK += np.asarray(ce, np.float64)
    elbo_rows.append(e_BxK)
    ce_rows.append(ce_BxK)
  if not tokens:
    raise ValueError("no examples to evaluate")
  tokens_B = np.concatenate(tokens).astype(np.float64)
  if tokens_B.sum() == 0:
    raise ValueError("the examples hold no response tokens")
  if s.mode == "ar":
    nll_B = np.concatenate(nll_rows)
    ratio, n = nll_B.sum() / tokens_B.sum(), len(nll_B)
    se = math.sqrt(n / (n - 1) * np.sum((nll_B - ratio * tokens_B) ** 2)) / tokens_B.sum() if n > 1 else float("nan")
    out = {"mode": "ar", "nll_bits_per_token": ratio / math.log(2), "stderr_bits_per_token": se / math.log(2),
           "num_examples": n, "num_tokens": int(tokens_B.sum())}
    return {**out, **_per_byte(out["nll_bits_per_token"], tokens_B, text_bytes_rows)}
  out = elbo.summarize(np.concatenate(elbo_rows), np.concatenate(ce_rows), tokens_B)
  return {"mode": "diffusion", "t": [float(t) for t in np.asarray(elbo.stratified_t(s.num_t, s.t_eps))],
          "draws": s.draws, "seed": s.seed, "schedule": s.schedule, "denoiser_output": s.denoiser_output,
          "self_cond_passes": s.self_cond_passes, **out, **_per_byte(out["bits_per_token"], tokens_B, text_bytes_rows)}


def _per_byte(bits_per_token: float, tokens_B: np.ndarray, text_bytes_rows: list) -> dict:
  """The same total bits over the bytes of text the tokens spell (batches without a byte count: nothing)."""
  if not text_bytes_rows:
    return {}
  num_bytes = int(np.concatenate(text_bytes_rows).sum())
  if num_bytes == 0:
    return {"num_text_bytes": 0}
  return {"num_text_bytes": num_bytes, "bits_per_byte": bits_per_token * float(tokens_B.sum()) / num_bytes}


def scalars(out: dict) -> dict[str, float]:
  """The numbers as eval/* scalars (TensorBoard)."""
  if out["mode"] == "ar":
    scores = {"eval/ar_nll_bits_per_token": out["nll_bits_per_token"],
              "eval/ar_nll_stderr": out["stderr_bits_per_token"]}
    if "bits_per_byte" in out:
      scores["eval/ar_nll_bits_per_byte"] = out["bits_per_byte"]
    return scores
  scores = {"eval/elbo_bits_per_token": out["bits_per_token"], "eval/elbo_stderr": out["stderr_bits_per_token"]}
  if "bits_per_byte" in out:
    scores["eval/elbo_bits_per_byte"] = out["bits_per_byte"]
  for t, e, ce in zip(out["t"], out["elbo_integrand_bits_by_t"], out["cross_entropy_bits_by_t"]):
    scores[f"eval/elbo_bits_t{t:.3f}"] = e
    scores[f"eval/ce_bits_t{t:.3f}"] = ce
  return scores
