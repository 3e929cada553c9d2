"""Block-diffusion generation (spec §5): every canvas and every denoising step in one jitted program.

    out = generate(params, config, prompt_BxP, prompt_valid_BxP, jax.random.key(0), SamplerConfig())
    out.tokens  # [B, num_canvases * C], pad after the first stop token

Per canvas and batch row: a uniform random canvas; then up to `max_denoising_steps` steps of denoise ->
temperature -> sample candidates -> entropy-bounded acceptance -> renoise -> self-condition on the tempered
logits, with a per-row adaptive stop (rows that stop are frozen while the others continue). The argmax canvas
of the last step is truncated after its first stop token, committed to the KV cache through the encoder, and
the next canvas starts, until every row has stopped or `max_new_tokens` are reached. The semantics are
Hugging Face's `DiffusionGemmaGenerationMixin.generate`; randomness is per row (a row's result does not
depend on the rest of its batch), so the random draws differ from torch's.

Not in the references: `restart_after` = k > 0 restarts a row that has not stopped after k steps of its current
attempt (a fresh random canvas, no self-conditioning signal, an empty stop history, the temperature schedule
started again); `max_denoising_steps` caps all attempts together. The stop rule is the model's own judgement, so
this is test-time compute without any checker. Attempt j of a row draws exactly what a plain run (restart_after=0,
max_denoising_steps=k) draws with that row's key folded with RESTART_SALT + j (attempt 0: the row's own key).

Both loops are `lax.while_loop`s: one jit compilation per (model config, sampler config, shapes). With several
canvases, canvas i's steps read only the cache slots written before it, rounded up to doubling buckets
(`cache_buckets`): the program holds one copy of the step loop per bucket and `lax.switch` runs the canvas's
(`cache_per_canvas=False`: one step loop over the whole cache).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import time
from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from dgemma.config import ModelConfig
from dgemma.model.cache import KVCache, init_cache
from dgemma.model.transformer import DiffusionGemma
from dgemma.cpu import token_stats as cpu_kernel
from dgemma.cpu.threefry import use_unrolled_threefry_on_cpu
from dgemma.sampling import acceptance, schedules, stopping

use_unrolled_threefry_on_cpu()  # same random bits; the rolled CPU form costs ~0.1 ms per denoising step


@dataclasses.dataclass(frozen=True)
class SamplerConfig:
  """Sampler knobs; the defaults are the released model's (HF `generation_config.json`).

  `canvas_length=None` and `stop_ids=None` take the model config's values. Hashable: jit specialises on it.
  """

  max_denoising_steps: int = 48
  entropy_bound: float = 0.1
  t_max: float = 0.8
  t_min: float = 0.4
  schedule: str = "linear"  # "linear" (HF), "cosine" or "constant" (t_max throughout)
  adaptive_stopping: bool = True
  stability_threshold: int = 1
  confidence_threshold: float = 0.005
  max_new_tokens: int = 256
  canvas_length: int | None = None
  stop_ids: tuple[int, ...] | None = None
  return_trajectory: bool = False  # also return the argmax canvas of every step
  # False: every step denoises without the previous logits, as the first one does. For models trained
  # without self-conditioning (self_cond_prob=0), whose self-conditioning layers never learned anything.
  self_conditioning: bool = True
  # 0 (the references): one attempt. k > 0: a row that has not stopped after k steps of its attempt starts a new
  # one (module docstring); each attempt's temperature schedule spans min(k, steps left in the budget).
  restart_after: int = 0
  # How much of the KV cache a canvas's denoising steps read (the same tokens either way, up to summation order).
  # True: the prompt and the canvases before it, rounded up: canvases {0}, {1}, {2, 3}, {4..7}, ... share a bucket,
  # which reads the prompt and 0, 1, 3, 7, ... canvases; one copy of the step loop per bucket, 1 + ceil(log2 n) of
  # them for n canvases, and each canvas of a bucket but the last copies that much of the cache once. False: the
  # whole cache for every canvas, one step loop (the least compile time; early canvases then attend over slots not
  # yet written, hidden by the mask). None (the default): True unless the model's attention is the Pallas kernel
  # (attention_impl="pallas"), which already skips key blocks past the written end, so that the buckets would save
  # little there and cost compile time.
  cache_per_canvas: bool | None = None
  # How the step's vocabulary-wide work (arg-max, entropy, sample, self-conditioning probabilities) runs: "cpu",
  # one C++ kernel (`cpu_kernel`; ~0.3 ms less per step on the benchmark's model); "xla", `acceptance.analyse`;
  # "auto", the kernel on a single CPU device where it builds (with a warning naming the reason where it does not)
  # and the vocabulary is a multiple of 16, else XLA. The same tokens up to float32 rounding.
  token_stats: str = "auto"

  def __post_init__(self):
    if self.stop_ids is not None:
      object.__setattr__(self, "stop_ids", tuple(int(t) for t in self.stop_ids))
    for name in ("max_denoising_steps", "max_new_tokens"):
      value = getattr(self, name)
      if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if self.canvas_length is not None and (isinstance(self.canvas_length, bool) or self.canvas_length < 1):
      raise ValueError(f"canvas_length must be a positive integer, got {self.canvas_length!r}")
    if isinstance(self.restart_after, bool) or not isinstance(self.restart_after, (int, np.integer)) \
        or self.restart_after < 0:
      raise ValueError(f"restart_after must be an integer >= 0, got {self.restart_after!r}")
    if self.restart_after and not self.adaptive_stopping:
      raise ValueError("restart_after > 0 needs adaptive_stopping: without a stop no attempt ever ends early")
    if isinstance(self.stability_threshold, bool) or self.stability_threshold < 0:
      raise ValueError(f"stability_threshold must be an integer >= 0, got {self.stability_threshold!r}")
    if not self.entropy_bound > 0:
      raise ValueError(f"entropy_bound must be > 0, got {self.entropy_bound!r}")
    if not self.confidence_threshold > 0:
      raise ValueError(f"confidence_threshold must be > 0, got {self.confidence_threshold!r}")
    schedules.check(self.schedule, self.t_max, self.t_min)
    if self.token_stats not in cpu_kernel.IMPLS:
      raise ValueError(f"token_stats must be one of {cpu_kernel.IMPLS}, got {self.token_stats!r}")

  def resolve(self, config: ModelConfig) -> "SamplerConfig":
    """This config with the model's canvas length and stop ids, the cache layout for its attention and the
    implementation of the token statistics for this backend filled in where unset."""
    return dataclasses.replace(
        self, token_stats=cpu_kernel.resolve(self.token_stats, config.vocab_size),
        canvas_length=self.canvas_length or config.canvas_length,
        stop_ids=config.stop_ids if self.stop_ids is None else self.stop_ids,
        cache_per_canvas=(config.attention_impl != "pallas" if self.cache_per_canvas is None
                          else self.cache_per_canvas))

  def num_canvases(self, canvas_length: int) -> int:
    return math.ceil(self.max_new_tokens / canvas_length)


# The knobs a checkpoint may record as its own sampling defaults (HF keeps them in generation_config.json).
RECORDABLE = ("max_denoising_steps", "entropy_bound", "t_max", "t_min", "schedule", "adaptive_stopping",
              "stability_threshold", "confidence_threshold", "restart_after")
RESTART_SALT = 1_000_003  # attempt j >= 1 of a row draws from fold_in(row key, RESTART_SALT + j)


def cache_buckets(prompt_len: int, canvas_len: int, num_canvases: int) -> tuple[int, ...]:
  """The cache lengths that canvases' denoising steps read with `cache_per_canvas`: bucket k >= 1 holds canvases
  2^(k-1) .. 2^k - 1 and reads the slots of the prompt and of 2^k - 1 canvases (at most num_canvases - 1, all
  that are ever committed); bucket 0, canvas 0, reads the prompt's. Canvas i is in bucket i.bit_length()."""
  top = max(num_canvases - 1, 0).bit_length()
  return tuple(prompt_len + min(2 ** k - 1, num_canvases - 1) * canvas_len for k in range(top + 1))


def sampler_config(metadata: dict | None = None, **overrides) -> SamplerConfig:
  """The sampler for a checkpoint: each knob from `overrides` where given (None: not given), else from the
  checkpoint's recorded defaults (`metadata["sampler"]`, written by train.py from the config's `sampler`
  section), else SamplerConfig's (the released model's). Turning adaptive stopping off drops recorded restarts
  (they need stops); asking for both is an error."""
  recorded = dict((metadata or {}).get("sampler") or {})
  unknown = sorted(set(recorded) - set(RECORDABLE))
  if unknown:
    raise ValueError(f"checkpoint records unknown sampler defaults {unknown}; known: {list(RECORDABLE)}")
  if overrides.get("adaptive_stopping") is False and overrides.get("restart_after") is None:
    recorded.pop("restart_after", None)  # a fixed-steps run asked for: the recorded restarts need stops, so none
  return SamplerConfig(**{**recorded, **{k: v for k, v in overrides.items() if v is not None}})


def self_conditioning_for(metadata: dict | None, choice: str = "auto") -> bool:
  """Whether to self-condition when sampling a checkpoint with this metadata. choice "on" / "off" decides;
  "auto": yes unless its training run recorded that the self-conditioning branch never trained
  (`"self_conditioning": false`, written by train.py for self_cond_prob=0 from scratch). Released
  checkpoints carry no such record and use it."""
  if choice not in ("auto", "on", "off"):
    raise ValueError(f"self-conditioning choice must be auto, on or off, got {choice!r}")
  if choice != "auto":
    return choice == "on"
  return bool((metadata or {}).get("self_conditioning", True))


@flax.struct.dataclass
class GenerateOutput:
  tokens: Int[Array, "B T"]  # T = num_canvases * C; pad after a row's first stop token and in unrun canvases
  steps_per_canvas: Int[Array, "B N"]  # denoiser passes counted for each row and canvas (0: not run / done)
  tokens_per_forward: Float[Array, "B"]  # HF's metric: non-pad generated tokens / counted denoiser passes
  trajectory: Int[Array, "B N S C"] | None = None  # argmax canvas after each step; -1 where no step ran


@flax.struct.dataclass
class _StepState:
  step: Int[Array, ""]
  canvas: Int[Array, "B C"]
  argmax: Int[Array, "B C"]
  # [B, C, V] the previous step's tempered logits in the embedding dtype, or (float32 models) their softmax, which
  # the step computes anyway (in bf16 with bf16 matmuls, the copy the network multiplies); [B, C, 0] when
  # self-conditioning is off
  sc_signal: Array
  finished: Bool[Array, "B"]
  history: Int[Array, "S B C"]
  steps: Int[Array, "B"]
  trajectory: Int[Array, "B N C"]
  # Restarts (restart_after > 0; otherwise unused): the attempt of each row, its step within the attempt, the
  # attempt's length and its step keys (raw key data, so that rows can swap them with jnp.where).
  attempt: Int[Array, "B"]
  attempt_step: Int[Array, "B"]
  attempt_len: Int[Array, "B"]
  attempt_keys: Array


@flax.struct.dataclass
class _CanvasState:
  index: Int[Array, ""]
  cache: KVCache
  tokens: Int[Array, "B N C"]
  steps: Int[Array, "B N"]
  finished: Bool[Array, "B"]
  trajectory: Int[Array, "B N S C"]


def _per_row(fn, keys_B, *args):
  return jax.vmap(fn)(keys_B, *args)


@functools.partial(jax.jit, static_argnames=("config", "sampler", "cache_len"))
def _generate(params: dict, prompt_BxP: Array, valid_BxP: Array, rng: Array,
              initial_BxNxC: Array | None, *, config: ModelConfig, sampler: SamplerConfig,
              cache_len: int) -> GenerateOutput:
  s = sampler
  model = DiffusionGemma(config)
  variables = {"params": params}
  b = prompt_BxP.shape[0]
  row_keys_B = row_keys(rng, b)
  c, n_steps, vocab = s.canvas_length, s.max_denoising_steps, config.vocab_size
  n_canvases = s.num_canvases(c)
  sc_dtype = jnp.dtype(config.param_dtype)  # HF casts the self-conditioning logits to the embedding dtype
  sc_probs = s.self_conditioning and signal_is_probabilities(config)
  # With bf16 matmuls the network multiplies a bf16 copy of them: carry that copy, so that the step writes it in
  # the pass that normalises them (half the bytes, and no separate cast in the network; the same numbers).
  carried_dtype = jnp.bfloat16 if sc_probs and config.matmul_dtype == "bfloat16" else sc_dtype
  traj_steps = n_steps if s.return_trajectory else 0

  # E.T for the self-conditioning product, taken here once: the step reads it in place (Embedder.encode_probs).
  sc_table = model.apply(variables, method=DiffusionGemma.embedding_table_transposed) if sc_probs else None

  def encode(tokens, cache, valid):
    return model.apply(variables, tokens, cache, valid, False, method=DiffusionGemma.encode)[1]

  restart = s.restart_after > 0
  key_impl = jax.random.key_impl(row_keys_B)
  random_canvas = lambda keys_B: _per_row(lambda k: jax.random.randint(k, (c,), 0, vocab, jnp.int32), keys_B)

  def denoise_canvas(cache: KVCache, canvas0: Array, keys_B: Array, done_B: Array, attempt_keys: Callable):
    """`attempt_keys(attempt_B)`: (initial-canvas keys, step keys) of each row's attempt (restarts only)."""
    first_len = min(s.restart_after, n_steps) if restart else n_steps

    def cond(st: _StepState):
      return (st.step < n_steps) & ~jnp.all(st.finished)

    def body(st: _StepState) -> _StepState:
      steps = st.steps + (~st.finished).astype(jnp.int32)  # counted before the pass, as HF
      # Without restarts every row is in its one attempt, and the per-row quantities are the step's own.
      if restart:
        k_B, keys = st.attempt_step, jax.random.wrap_key_data(st.attempt_keys, impl=key_impl)
        # (A finished row's attempt step keeps counting; at least 1 step left keeps its discarded temperature > 0.)
        temp = schedules.temperature(s.schedule, s.t_max, s.t_min, jnp.maximum(st.attempt_len - k_B, 1),
                                     st.attempt_len)
        temp = jnp.broadcast_to(temp, (b,))[:, None, None]  # (the constant schedule gives a scalar)
      else:
        k_B, keys = jnp.broadcast_to(st.step, (b,)), keys_B
        temp = schedules.temperature(s.schedule, s.t_max, s.t_min, n_steps - st.step, n_steps)
      if s.self_conditioning:
        has_sc = k_B > 0  # the first step of an attempt has no self-conditioning signal
        signal = (dict(self_conditioning_probs=st.sc_signal, self_conditioning_table=sc_table) if sc_probs
                  else dict(self_conditioning_logits=st.sc_signal))
        raw = model.apply(variables, st.canvas, cache, self_conditioning_mask=has_sc, **signal,
                          method=DiffusionGemma.denoise)
      else:  # every step denoises as the first one does
        raw = model.apply(variables, st.canvas, cache, method=DiffusionGemma.denoise)
      step_keys = _per_row(jax.random.fold_in, keys, k_B)
      sample_keys, noise_keys = jnp.moveaxis(_per_row(jax.random.split, step_keys), 1, 0)
      uniform = _per_row(lambda k: jax.random.uniform(k, (c,)), sample_keys)
      noise = _per_row(lambda k: jax.random.randint(k, (c,), 0, vocab, jnp.int32), noise_keys)
      if s.token_stats == "cpu":  # the probabilities come out in the carried dtype
        stats = cpu_kernel.token_stats(raw, uniform, temp, probs_dtype=carried_dtype if sc_probs else None)
      else:
        stats = acceptance.analyse(raw, uniform, with_probs=sc_probs, temperature=temp)
      accept = acceptance.entropy_bounded_accept(stats.entropy, s.entropy_bound)
      canvas = acceptance.renoise(accept, stats.sample, noise)
      # Rows that already stopped keep their canvas and argmax. (HF also keeps their self-conditioning
      # logits; those only feed the frozen rows' own discarded passes, so they are simply overwritten.)
      frozen = st.finished[:, None]
      argmax = jnp.where(frozen, st.argmax, stats.argmax)
      canvas = jnp.where(frozen, st.canvas, canvas)
      if not s.self_conditioning:
        sc_signal = st.sc_signal  # (the empty placeholder)
      else:
        sc_signal = stats.probs.astype(carried_dtype) if sc_probs else (raw / temp).astype(sc_dtype)
      finished, history = st.finished, st.history
      if s.adaptive_stopping:
        stop, history = stopping.stable_and_confident(history, argmax, stats.entropy, s.confidence_threshold)
        finished = finished | stop
      trajectory = st.trajectory
      if traj_steps:
        ran = jnp.where(frozen, -1, argmax)  # -1 for rows that had stopped before this step
        trajectory = jax.lax.dynamic_update_slice(trajectory, ran[:, None], (0, st.step, 0))
      attempt, attempt_step, attempt_len, attempt_keys_data = (st.attempt, st.attempt_step + 1, st.attempt_len,
                                                              st.attempt_keys)
      if restart:  # rows whose attempt ran out without a stop start the next one, if the budget has steps left
        again = ~finished & (attempt_step >= st.attempt_len) & (st.step + 1 < n_steps)
        attempt = attempt + again.astype(jnp.int32)
        init_keys, next_keys = attempt_keys(attempt)
        canvas = jnp.where(again[:, None], random_canvas(init_keys), canvas)
        history = jnp.where(again[None, :, None], -1, history)
        attempt_step = jnp.where(again, 0, attempt_step)
        attempt_len = jnp.where(again, jnp.minimum(s.restart_after, n_steps - (st.step + 1)), attempt_len)
        attempt_keys_data = jnp.where(again[:, None], jax.random.key_data(next_keys), attempt_keys_data)
      return _StepState(step=st.step + 1, canvas=canvas, argmax=argmax, sc_signal=sc_signal,
                        finished=finished, history=history, steps=steps, trajectory=trajectory,
                        attempt=attempt, attempt_step=attempt_step, attempt_len=attempt_len,
                        attempt_keys=attempt_keys_data)

    init = _StepState(
        step=jnp.int32(0), canvas=canvas0, argmax=canvas0,
        sc_signal=jnp.zeros((b, c, vocab if s.self_conditioning else 0), carried_dtype), finished=done_B,
        history=stopping.init_history(s.stability_threshold if s.adaptive_stopping else 0, b, c),
        steps=jnp.zeros((b,), jnp.int32), trajectory=jnp.full((b, traj_steps, c), -1, jnp.int32),
        attempt=jnp.zeros((b,), jnp.int32), attempt_step=jnp.zeros((b,), jnp.int32),
        attempt_len=jnp.full((b,), first_len, jnp.int32), attempt_keys=jax.random.key_data(keys_B))
    final = jax.lax.while_loop(cond, body, init)
    return final.argmax, final.steps, final.trajectory

  def canvas_cond(st: _CanvasState):
    return (st.index < n_canvases) & ~jnp.all(st.finished)

  def canvas_body(st: _CanvasState) -> _CanvasState:
    def attempt_keys(attempt_B):  # (initial-canvas keys, step keys) of this canvas, per row and attempt
      salted = _per_row(jax.random.fold_in, row_keys_B, RESTART_SALT + attempt_B)
      base = jax.random.wrap_key_data(jnp.where((attempt_B == 0)[:, None], jax.random.key_data(row_keys_B),
                                                jax.random.key_data(salted)), impl=key_impl)
      keys = _per_row(jax.random.fold_in, base, jnp.broadcast_to(st.index, (b,)))
      init, step = jnp.moveaxis(_per_row(jax.random.split, keys), 1, 0)
      return init, step

    keys = _per_row(jax.random.fold_in, row_keys_B, jnp.broadcast_to(st.index, (b,)))
    init_keys, step_keys = jnp.moveaxis(_per_row(jax.random.split, keys), 1, 0)
    if initial_BxNxC is None:
      canvas0 = random_canvas(init_keys)
    else:
      canvas0 = jax.lax.dynamic_index_in_dim(initial_BxNxC, st.index, axis=1, keepdims=False)
    # The step loop compiled once per bucket; this canvas runs its bucket's, over that prefix of the cache. (One
    # bucket, as with one canvas: lax.switch just calls it.)
    lengths = cache_buckets(prompt_BxP.shape[1], c, n_canvases) if s.cache_per_canvas else (cache_len,)
    if lengths[-1] > cache_len:
      raise ValueError(f"the cache has {cache_len} slots but the last canvas reads {lengths[-1]}")

    def over_prefix(length):
      return lambda cache, *rest: denoise_canvas(cache.prefix(length), *rest, attempt_keys)

    bucket = jnp.asarray([i.bit_length() for i in range(n_canvases)], jnp.int32)[st.index]
    argmax, steps, trajectory = jax.lax.switch(bucket, [over_prefix(length) for length in lengths], st.cache,
                                               canvas0, step_keys, st.finished)
    committed, finished = stopping.truncate_at_stop(argmax, st.finished, s.stop_ids, config.pad_id)
    more = (st.index + 1 < n_canvases) & ~jnp.all(finished)
    # Committed canvases are all-valid context, pads included, as HF's decoder mask of ones. The last canvas is
    # never committed, so the cache has no slots for it (and with one canvas, nothing to commit at all).
    cache = st.cache
    if n_canvases > 1:
      cache = jax.lax.cond(more, lambda cache: encode(committed, cache, None), lambda cache: cache, cache)
    return _CanvasState(
        index=st.index + 1, cache=cache,
        tokens=jax.lax.dynamic_update_slice(st.tokens, committed[:, None], (0, st.index, 0)),
        steps=jax.lax.dynamic_update_slice(st.steps, steps[:, None], (0, st.index)),
        finished=finished,
        trajectory=jax.lax.dynamic_update_slice(st.trajectory, trajectory[:, None], (0, st.index, 0, 0)))

  cache = encode(prompt_BxP, init_cache(config, b, cache_len), valid_BxP)
  init = _CanvasState(
      index=jnp.int32(0), cache=cache,
      tokens=jnp.full((b, n_canvases, c), config.pad_id, jnp.int32),
      steps=jnp.zeros((b, n_canvases), jnp.int32),
      finished=jnp.zeros((b,), bool),
      trajectory=jnp.full((b, n_canvases, traj_steps, c), -1, jnp.int32))
  final = jax.lax.while_loop(canvas_cond, canvas_body, init)
  tokens = final.tokens.reshape(b, n_canvases * c)
  passes = jnp.maximum(jnp.sum(final.steps, axis=1), 1)
  tpf = jnp.sum(tokens != config.pad_id, axis=1) / passes
  return GenerateOutput(tokens=tokens, steps_per_canvas=final.steps, tokens_per_forward=tpf,
                        trajectory=final.trajectory if s.return_trajectory else None)


def signal_is_probabilities(config: ModelConfig) -> bool:
  """Whether the sampler self-conditions on the softmax it computes anyway (with the transposed embedding table)
  rather than on the logits. HF casts the self-conditioning logits to the embedding dtype; in float32 that cast is
  the identity, so that softmax is the signal's own and the network skips a second vocabulary-wide one. (bf16:
  the logits, cast.)"""
  return jnp.dtype(config.param_dtype) == jnp.float32


def row_keys(rng: jax.Array, batch: int) -> jax.Array:
  """Per-row keys: a single key gives fold_in(rng, row), so row b's draws do not depend on the batch size;
  an array of `batch` keys is used as is. (Traced inside the jitted samplers: run eagerly it costs ~1.5 ms of
  op-by-op dispatch per call.)"""
  check_rng(rng, batch)
  key = rng if jnp.issubdtype(rng.dtype, jax.dtypes.prng_key) else jax.random.wrap_key_data(rng)
  if key.shape == ():
    return jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(batch))
  return key


def check_rng(rng: jax.Array, batch: int) -> None:
  """One-line error unless `rng` is one key or `batch` keys (typed, or raw uint32 key data)."""
  typed = jnp.issubdtype(rng.dtype, jax.dtypes.prng_key)
  shape = rng.shape if typed else rng.shape[:-1]
  if not typed and (rng.ndim == 0 or rng.dtype != jnp.uint32):
    raise ValueError(f"rng must be a JAX random key (jax.random.key) or raw uint32 key data, got "
                     f"{rng.dtype} of shape {rng.shape}")
  if shape not in ((), (batch,)):
    raise ValueError(f"rng must be one key or {batch} keys (one per row), got key shape {shape}")


def _check_ids(name: str, ids: np.ndarray, vocab_size: int) -> None:
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f"{name} has token ids outside [0, {vocab_size}): min {ids.min()}, max {ids.max()}")


def _prepare(config: ModelConfig, sampler_config: SamplerConfig, prompt_tokens, prompt_valid, rng,
             initial_canvases, max_cache_len: int | None) -> tuple[tuple, dict]:
  """Checks the inputs on the host; returns the jitted function's (array args, static args)."""
  sampler = sampler_config.resolve(config)
  prompt = np.asarray(prompt_tokens)
  if prompt.ndim != 2 or prompt.shape[1] == 0 or prompt.shape[0] == 0:
    raise ValueError(f"prompt_tokens must have shape [batch, length] with both > 0, got {prompt.shape}")
  if not np.issubdtype(prompt.dtype, np.integer):
    raise ValueError(f"prompt_tokens must be integer token ids, got dtype {prompt.dtype}")
  _check_ids("prompt_tokens", prompt, config.vocab_size)
  _check_ids("stop_ids", np.asarray(sampler.stop_ids, np.int64), config.vocab_size)  # else they never match
  b, p = prompt.shape
  valid = np.ones((b, p), bool) if prompt_valid is None else np.asarray(prompt_valid, bool)
  if valid.shape != (b, p):
    raise ValueError(f"prompt_valid has shape {valid.shape}, expected {(b, p)}")
  c = sampler.canvas_length
  n = sampler.num_canvases(c)
  needed = p + n * c
  if max_cache_len is not None and needed > max_cache_len:
    raise ValueError(f"a prompt of {p} tokens plus {n} canvas(es) of {c} tokens needs {needed} tokens of context, "
                     f"more than max_cache_len={max_cache_len}")
  initial = None
  if initial_canvases is not None:
    initial = np.asarray(initial_canvases)
    if initial.shape != (b, n, c):
      raise ValueError(f"initial_canvases has shape {initial.shape}, expected {(b, n, c)}")
    _check_ids("initial_canvases", initial, config.vocab_size)
    initial = initial.astype(np.int32)
  check_rng(rng, b)
  # NumPy arrays: the compiled call transfers them itself; jnp.asarray would dispatch a conversion each (~0.8 ms
  # of host time per call in all, ~0.3% of a 48-step sampler call on the benchmark's model).
  args = (prompt.astype(np.int32), valid, rng, initial)
  # Slots for the prompt and every canvas but the last, which is never committed: a denoising step attends over
  # every slot of the cache it is given (the mask hides the unwritten ones), so a slot that is never written would
  # be work for nothing in every bucket (one canvas after a 32-token prompt, the benchmark's model: 96 keys
  # instead of 160, ~0.2 ms of a ~3.9 ms step).
  return args, dict(config=config, sampler=sampler, cache_len=p + (n - 1) * c)


def generate(params: dict, config: ModelConfig, prompt_tokens: Int[Array, "B P"],
             prompt_valid: Bool[Array, "B P"] | None, rng: jax.Array,
             sampler_config: SamplerConfig = SamplerConfig(), *,
             initial_canvases: Int[Array, "B N C"] | None = None,
             max_cache_len: int | None = None) -> GenerateOutput:
  """Generates after right-padded prompts (`prompt_valid` False on pads; None: all valid).

  `rng` is one key (row b uses fold_in(rng, b)) or one key per row. `initial_canvases` replaces the uniform
  random starting canvas of every canvas (HF's `decoder_input_ids` does so for the first; restarted attempts
  still start from random ones);
  `max_cache_len` makes a prompt that does not fit fail with a clear error.
  """
  args, static = _prepare(config, sampler_config, prompt_tokens, prompt_valid, rng, initial_canvases,
                          max_cache_len)
  return _generate(params, *args, **static)


def compile_generate(params: dict, config: ModelConfig, prompt_tokens: Int[Array, "B P"],
                     prompt_valid: Bool[Array, "B P"] | None, rng: jax.Array,
                     sampler_config: SamplerConfig = SamplerConfig(), *,
                     max_cache_len: int | None = None) -> tuple[Callable[..., GenerateOutput], float]:
  """Ahead-of-time compilation for inputs shaped like these: (run, compile seconds), so that callers can
  report compile time apart. `run(prompt_tokens, prompt_valid, rng)` takes inputs of the same shapes."""
  args, static = _prepare(config, sampler_config, prompt_tokens, prompt_valid, rng, None, max_cache_len)
  start = time.perf_counter()
  compiled = _generate.lower(params, *args, **static).compile()
  seconds = time.perf_counter() - start

  def run(prompt_tokens, prompt_valid, rng) -> GenerateOutput:
    new_args, new_static = _prepare(config, sampler_config, prompt_tokens, prompt_valid, rng, None,
                                    max_cache_len)
    if new_static != static:
      raise ValueError("inputs differ in shape from the ones this sampler was compiled for")
    return compiled(params, *new_args)

  return run, seconds
