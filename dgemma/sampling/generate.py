"""Block-diffusion generation (spec §5): every canvas and every denoising step in one jitted program.

    out = generate(params, config, prompt_BxP, prompt_valid_BxP, jax.random.key(0), SamplerConfig())
    out.tokens  # [B, num_canvases * C], pad after the first stop token

Per canvas and batch row: a uniform random canvas; then up to `max_denoising_steps` steps of denoise ->
temperature -> sample candidates -> entropy-bounded acceptance -> renoise -> self-condition on the tempered
logits, with a per-row adaptive stop (rows that stop are frozen while the others continue). The argmax canvas
of the last step is truncated after its first stop token, committed to the KV cache through the encoder, and
the next canvas starts, until every row has stopped or `max_new_tokens` are reached. The semantics are
Hugging Face's `DiffusionGemmaGenerationMixin.generate`; randomness is per row (a row's result does not
depend on the rest of its batch), so the random draws differ from torch's. `restart_after` > 0 (not in the
references) gives a row that does not stop new attempts at its canvas: dgemma/sampling/restarts.py.
`update="ancestral"` (not in the references) replaces sample -> accept -> renoise by the exact reverse step of the
noise process (dgemma/sampling/ancestral.py): every step runs, and the last step's canvas is the sample.

Read top to bottom: `_step` (one denoising step), `_denoise_canvas` (the step loop), `_next_canvas` (one canvas:
its keys, its step loop over its part of the cache, the commit) and `_generate` (the prefill and the canvas loop).
Both loops are `lax.while_loop`s: one jit compilation per (model config, sampler config, shapes). With several
canvases, canvas i's steps read only the cache slots written before it, rounded up to doubling buckets
(`cache_buckets`): the program holds one copy of the step loop per bucket and `lax.switch` runs the canvas's
(`cache_per_canvas=False`: one step loop over the whole cache).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from typing import Callable

import flax.struct
import jax
import jax.numpy as jnp
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from dgemma.config import ModelConfig
from dgemma.model import position_features as position_features_lib
from dgemma.model.cache import KVCache, init_cache
from dgemma.model.transformer import DiffusionGemma
from dgemma.cpu import token_stats as cpu_kernel
from dgemma.cpu.threefry import use_unrolled_threefry_on_cpu
from dgemma.sampling import acceptance, ancestral, restarts, schedules, stopping
from dgemma.sampling.config import RECORDABLE, SamplerConfig, sampler_config, self_conditioning_for  # noqa: F401
from dgemma.sampling.randomness import check_rng, per_row, row_keys, split_per_row, uniform_tokens
from dgemma.sampling.restarts import RESTART_SALT  # noqa: F401 (the public name of attempt j's salt)

use_unrolled_threefry_on_cpu()  # the same random bits as the rolled form, which XLA:CPU runs slower


def cache_buckets(prompt_len: int, canvas_len: int, num_canvases: int) -> tuple[int, ...]:
  """The cache lengths that canvases' denoising steps read with `cache_per_canvas`: bucket k >= 1 holds canvases
  2^(k-1) .. 2^k - 1 and reads the slots of the prompt and of 2^k - 1 canvases (at most num_canvases - 1, all
  that are ever committed); bucket 0, canvas 0, reads the prompt's. Canvas i is in bucket i.bit_length()."""
  top = max(num_canvases - 1, 0).bit_length()
  return tuple(prompt_len + min(2 ** k - 1, num_canvases - 1) * canvas_len for k in range(top + 1))


def signal_is_probabilities(config: ModelConfig) -> bool:
  """Whether the sampler self-conditions on the softmax it computes anyway (with the transposed embedding table)
  rather than on the logits. HF casts the self-conditioning logits to the embedding dtype; in float32 that cast is
  the identity, so that softmax is the signal's own and the network skips a second vocabulary-wide one. (bf16:
  the logits, cast.)"""
  return jnp.dtype(config.param_dtype) == jnp.float32


@flax.struct.dataclass
class GenerateOutput:
  tokens: Int[Array, "B T"]  # T = num_canvases * C; pad after a row's first stop token and in unrun canvases
  steps_per_canvas: Int[Array, "B N"]  # denoiser passes counted for each row and canvas (0: not run / done)
  tokens_per_forward: Float[Array, "B"]  # HF's metric: non-pad generated tokens / counted denoiser passes
  trajectory: Int[Array, "B N S C"] | None = None  # argmax canvas after each step; -1 where no step ran


@dataclasses.dataclass(frozen=True)
class _Denoiser:
  """What every step of one call reads and none changes: the network, the sampler's knobs (resolved) and the
  form the self-conditioning signal is carried in."""
  config: ModelConfig
  sampler: SamplerConfig
  variables: dict
  sc_probs: bool  # the signal is the softmax of the tempered logits (signal_is_probabilities), else the logits
  sc_dtype: jnp.dtype  # HF casts the self-conditioning logits to the embedding dtype
  # With bf16 matmuls the network multiplies a bf16 copy of the probabilities: carry that copy, so that the step
  # writes it in the pass that normalises them (half the bytes, and no separate cast in the network).
  carried_dtype: jnp.dtype
  sc_table: Array | None  # E.T for the probabilities' product, taken once: the step reads it in place
  position_features: Array | None  # the model's feature table (config.num_position_features > 0)
  on_step: Callable | None = None  # a host callback after every step (streaming.py); None: not in the program

  @classmethod
  def make(cls, params: dict, config: ModelConfig, sampler: SamplerConfig,
           position_features: Array | None = None, on_step: Callable | None = None) -> "_Denoiser":
    variables = {"params": params}
    sc_dtype = jnp.dtype(config.param_dtype)
    sc_probs = sampler.self_conditioning and signal_is_probabilities(config)
    sc_table = (DiffusionGemma(config).apply(variables, method=DiffusionGemma.embedding_table_transposed)
                if sc_probs else None)
    return cls(config=config, sampler=sampler, variables=variables, sc_probs=sc_probs, sc_dtype=sc_dtype,
               carried_dtype=jnp.bfloat16 if sc_probs and config.matmul_dtype == "bfloat16" else sc_dtype,
               sc_table=sc_table, position_features=position_features, on_step=on_step)

  def encode(self, tokens: Array, cache: KVCache, valid: Array | None) -> KVCache:
    return DiffusionGemma(self.config).apply(self.variables, tokens, cache, valid, False, self.position_features,
                                             method=DiffusionGemma.encode)[1]

  def denoise(self, canvas_BxC: Array, cache: KVCache, sc_signal: Array, has_sc_B: Bool[Array, "B"]) -> Array:
    """The logits of one denoiser pass; rows with `has_sc_B` False (and every row with self-conditioning off)
    denoise without the signal, as the first step does."""
    model = DiffusionGemma(self.config)
    if not self.sampler.self_conditioning:
      return model.apply(self.variables, canvas_BxC, cache, position_features=self.position_features,
                         method=DiffusionGemma.denoise)
    signal = (dict(self_conditioning_probs=sc_signal, self_conditioning_table=self.sc_table) if self.sc_probs
              else dict(self_conditioning_logits=sc_signal))
    return model.apply(self.variables, canvas_BxC, cache, self_conditioning_mask=has_sc_B, **signal,
                       position_features=self.position_features, method=DiffusionGemma.denoise)


@flax.struct.dataclass
class _Canvas:
  """What the steps of one canvas read and none changes."""
  index: Int[Array, ""]
  cache: KVCache  # the part of the cache this canvas's bucket reads
  step_keys: jax.Array  # [B] each row's step keys at this canvas
  row_keys: jax.Array  # [B] each row's own key (restarts derive their attempts' keys from it)


@flax.struct.dataclass
class _StepState:
  """The step loop's state (one canvas)."""
  step: Int[Array, ""]
  canvas: Int[Array, "B C"]
  argmax: Int[Array, "B C"]
  # [B, C, V] the previous step's tempered logits in the embedding dtype, or (float32 models) their softmax, which
  # the step computes anyway (in bf16 with bf16 matmuls, the copy the network multiplies); [B, C, 0] when
  # self-conditioning is off
  sc_signal: Array
  finished: Bool[Array, "B"]
  history: Int[Array, "S B C"]  # the stop rule's previous argmax canvases
  steps: Int[Array, "B"]  # denoiser passes counted per row
  trajectory: Int[Array, "B S C"]  # argmax canvas after each step ([B, 0, C] unless return_trajectory)
  attempts: restarts.Attempts | None  # restart_after > 0 only


def _token_stats(impl: str, logits_BxCxV, uniform_BxC, temperature, probs_dtype=None) -> acceptance.TokenStats:
  """acceptance.analyse, or the CPU kernel that computes the same (SamplerConfig.token_stats, resolved)."""
  if impl == "cpu":
    return cpu_kernel.token_stats(logits_BxCxV, uniform_BxC, temperature, probs_dtype=probs_dtype)
  return acceptance.analyse(logits_BxCxV, uniform_BxC, with_probs=probs_dtype is not None, temperature=temperature)


def _step(d: _Denoiser, cv: _Canvas, st: _StepState) -> _StepState:
  """One denoising step of the canvas: rows that have stopped are carried along unchanged."""
  s = d.sampler
  b, c = st.canvas.shape
  n = s.max_denoising_steps
  steps = st.steps + (~st.finished).astype(jnp.int32)  # counted before the pass, as HF
  if st.attempts is None:  # every row is in its one attempt: the per-row quantities are the step's own
    k_B, keys_B = jnp.broadcast_to(st.step, (b,)), cv.step_keys
    temp = schedules.temperature(s.schedule, s.t_max, s.t_min, n - st.step, n)
  else:
    k_B, keys_B, temp = restarts.position(s, st.attempts, jax.random.key_impl(cv.row_keys))
  raw = d.denoise(st.canvas, cv.cache, st.sc_signal, k_B > 0)  # an attempt's first step has no signal
  sample_keys, noise_keys = split_per_row(per_row(jax.random.fold_in, keys_B, k_B))
  if s.update == "ancestral":  # (no stop rule: every step runs, so no entropy)
    canvas, probs = ancestral.step(sample_keys, raw, st.canvas, st.step, n, s.noise_schedule, s.denoiser_output,
                                   temp, functools.partial(_token_stats, s.token_stats, probs_dtype=jnp.float32))
    estimate, entropy = canvas, None  # the canvas is the estimate: at the last step, x_0
  else:
    uniform = per_row(lambda k: jax.random.uniform(k, (c,)), sample_keys)
    noise = uniform_tokens(noise_keys, c, d.config.vocab_size)
    # (the probabilities come out of the CPU kernel in the carried dtype)
    stats = _token_stats(s.token_stats, raw, uniform, temp, probs_dtype=d.carried_dtype if d.sc_probs else None)
    accept = acceptance.entropy_bounded_accept(stats.entropy, s.entropy_bound)
    canvas = acceptance.renoise(accept, stats.sample, noise)
    estimate, entropy, probs = stats.argmax, stats.entropy, stats.probs
  # Rows that already stopped keep their canvas and argmax. (HF also keeps their self-conditioning logits; those
  # only feed the frozen rows' own discarded passes, so they are simply overwritten.)
  frozen = st.finished[:, None]
  argmax = jnp.where(frozen, st.argmax, estimate)
  canvas = jnp.where(frozen, st.canvas, canvas)
  if not s.self_conditioning:
    sc_signal = st.sc_signal  # (the empty placeholder)
  else:
    sc_signal = probs.astype(d.carried_dtype) if d.sc_probs else (raw / temp).astype(d.sc_dtype)
  finished, history = st.finished, st.history
  if s.adaptive_stopping:
    stop, history = stopping.stable_and_confident(history, argmax, entropy, s.confidence_threshold)
    finished = finished | stop
  if d.on_step is not None:  # (ordered: the host sees the steps in the order they ran)
    jax.debug.callback(d.on_step, cv.index, st.step, argmax, ~st.finished, ordered=True)
  trajectory = st.trajectory
  if s.return_trajectory:
    ran = jnp.where(frozen, -1, argmax)  # -1 for rows that had stopped before this step
    trajectory = jax.lax.dynamic_update_slice(trajectory, ran[:, None], (0, st.step, 0))
  attempts = st.attempts
  if attempts is not None:
    canvas, history, attempts = restarts.advance(s, attempts, st.step, finished, canvas, history, cv.row_keys,
                                                 cv.index, d.config.vocab_size)
  return _StepState(step=st.step + 1, canvas=canvas, argmax=argmax, sc_signal=sc_signal, finished=finished,
                    history=history, steps=steps, trajectory=trajectory, attempts=attempts)


def _denoise_canvas(d: _Denoiser, cv: _Canvas, canvas0_BxC: Array, done_B: Array
                    ) -> tuple[Int[Array, "B C"], Int[Array, "B"], Int[Array, "B S C"]]:
  """The step loop of one canvas, from `canvas0_BxC`, until every row has stopped (rows in `done_B` already
  have) or the steps run out: (argmax canvas, steps per row, trajectory)."""
  s = d.sampler
  b, c = canvas0_BxC.shape
  n, vocab = s.max_denoising_steps, d.config.vocab_size
  init = _StepState(
      step=jnp.int32(0), canvas=canvas0_BxC, argmax=canvas0_BxC,
      sc_signal=jnp.zeros((b, c, vocab if s.self_conditioning else 0), d.carried_dtype), finished=done_B,
      history=stopping.init_history(s.stability_threshold if s.adaptive_stopping else 0, b, c),
      steps=jnp.zeros((b,), jnp.int32), trajectory=jnp.full((b, n if s.return_trajectory else 0, c), -1, jnp.int32),
      attempts=restarts.first(s, cv.step_keys) if s.restart_after else None)
  final = jax.lax.while_loop(lambda st: (st.step < n) & ~jnp.all(st.finished), functools.partial(_step, d, cv), init)
  return final.argmax, final.steps, final.trajectory


@flax.struct.dataclass
class _CanvasState:
  """The canvas loop's state."""
  index: Int[Array, ""]
  cache: KVCache
  tokens: Int[Array, "B N C"]
  steps: Int[Array, "B N"]
  finished: Bool[Array, "B"]
  trajectory: Int[Array, "B N S C"]


def _next_canvas(d: _Denoiser, row_keys_B: jax.Array, initial_BxNxC: Array | None, prompt_len: int, cache_len: int,
                 st: _CanvasState) -> _CanvasState:
  """Canvas `st.index`: its starting canvas, its step loop, and the commit of its truncated argmax to the cache."""
  s = d.sampler
  b = row_keys_B.shape[0]
  c = s.canvas_length
  n_canvases = s.num_canvases(c)
  init_keys, step_keys = split_per_row(per_row(jax.random.fold_in, row_keys_B, jnp.broadcast_to(st.index, (b,))))
  if initial_BxNxC is None:
    canvas0 = uniform_tokens(init_keys, c, d.config.vocab_size)
  else:
    canvas0 = jax.lax.dynamic_index_in_dim(initial_BxNxC, st.index, axis=1, keepdims=False)
  # The step loop compiled once per bucket; this canvas runs its bucket's, over that prefix of the cache. (One
  # bucket, as with one canvas: lax.switch just calls it.)
  lengths = cache_buckets(prompt_len, c, n_canvases) if s.cache_per_canvas else (cache_len,)
  if lengths[-1] > cache_len:
    raise ValueError(f"the cache has {cache_len} slots but the last canvas reads {lengths[-1]}")

  def over_prefix(length):
    return lambda cache, canvas0, step_keys, done: _denoise_canvas(
        d, _Canvas(index=st.index, cache=cache.prefix(length), step_keys=step_keys, row_keys=row_keys_B),
        canvas0, done)

  bucket = jnp.asarray([i.bit_length() for i in range(n_canvases)], jnp.int32)[st.index]
  argmax, steps, trajectory = jax.lax.switch(bucket, [over_prefix(length) for length in lengths], st.cache,
                                             canvas0, step_keys, st.finished)
  committed, finished = stopping.truncate_at_stop(argmax, st.finished, s.stop_ids, d.config.pad_id)
  more = (st.index + 1 < n_canvases) & ~jnp.all(finished)
  # Committed canvases are all-valid context, pads included, as HF's decoder mask of ones. The last canvas is
  # never committed, so the cache has no slots for it (and with one canvas, nothing to commit at all).
  cache = st.cache
  if n_canvases > 1:
    cache = jax.lax.cond(more, lambda cache: d.encode(committed, cache, None), lambda cache: cache, cache)
  return _CanvasState(
      index=st.index + 1, cache=cache,
      tokens=jax.lax.dynamic_update_slice(st.tokens, committed[:, None], (0, st.index, 0)),
      steps=jax.lax.dynamic_update_slice(st.steps, steps[:, None], (0, st.index)),
      finished=finished,
      trajectory=jax.lax.dynamic_update_slice(st.trajectory, trajectory[:, None], (0, st.index, 0, 0)))


@functools.partial(jax.jit, static_argnames=("config", "sampler", "cache_len", "on_step"))
def _generate(params: dict, prompt_BxP: Array, valid_BxP: Array, rng: Array,
              initial_BxNxC: Array | None, position_features: Array | None, *, config: ModelConfig,
              sampler: SamplerConfig, cache_len: int, on_step: Callable | None = None) -> GenerateOutput:
  """Prefills the prompt, then runs the canvas loop until every row has stopped or the canvases run out."""
  d = _Denoiser.make(params, config, sampler, position_features, on_step)
  b, p = prompt_BxP.shape
  c = sampler.canvas_length
  n_canvases = sampler.num_canvases(c)
  traj_steps = sampler.max_denoising_steps if sampler.return_trajectory else 0
  init = _CanvasState(
      index=jnp.int32(0), cache=d.encode(prompt_BxP, init_cache(config, b, cache_len), valid_BxP),
      tokens=jnp.full((b, n_canvases, c), config.pad_id, jnp.int32),
      steps=jnp.zeros((b, n_canvases), jnp.int32),
      finished=jnp.zeros((b,), bool),
      trajectory=jnp.full((b, n_canvases, traj_steps, c), -1, jnp.int32))
  final = jax.lax.while_loop(lambda st: (st.index < n_canvases) & ~jnp.all(st.finished),
                             functools.partial(_next_canvas, d, row_keys(rng, b), initial_BxNxC, p, cache_len), init)
  tokens = final.tokens.reshape(b, n_canvases * c)
  passes = jnp.maximum(jnp.sum(final.steps, axis=1), 1)
  tpf = jnp.sum(tokens != config.pad_id, axis=1) / passes
  return GenerateOutput(tokens=tokens, steps_per_canvas=final.steps, tokens_per_forward=tpf,
                        trajectory=final.trajectory if sampler.return_trajectory else None)


def _check_ids(name: str, ids: np.ndarray, vocab_size: int) -> None:
  if ids.size and (ids.min() < 0 or ids.max() >= vocab_size):
    raise ValueError(f"{name} has token ids outside [0, {vocab_size}): min {ids.min()}, max {ids.max()}")


def _prepare(config: ModelConfig, sampler_config: SamplerConfig, prompt_tokens, prompt_valid, rng,
             initial_canvases, max_cache_len: int | None, position_features=None,
             on_step: Callable | None = None) -> tuple[tuple, dict]:
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
  # NumPy arrays: the compiled call transfers them itself; jnp.asarray would dispatch a conversion of each.
  args = (prompt.astype(np.int32), valid, rng, initial, position_features_lib.check(config, position_features))
  # Slots for the prompt and every canvas but the last, which is never committed: a denoising step attends over
  # every slot of the cache it is given (the mask hides the unwritten ones), so a slot that is never written would
  # be work for nothing in every bucket.
  return args, dict(config=config, sampler=sampler, cache_len=p + (n - 1) * c, on_step=on_step)


def generate(params: dict, config: ModelConfig, prompt_tokens: Int[Array, "B P"],
             prompt_valid: Bool[Array, "B P"] | None, rng: jax.Array,
             sampler_config: SamplerConfig = SamplerConfig(), *,
             initial_canvases: Int[Array, "B N C"] | None = None,
             max_cache_len: int | None = None,
             position_features: Int[Array, "L F"] | None = None,
             on_step: Callable | None = None) -> GenerateOutput:
  """Generates after padded prompts, right or left (`prompt_valid` False on pads; None: all valid).

  `rng` is one key (row b uses fold_in(rng, b)) or one key per row. `initial_canvases` replaces the uniform
  random starting canvas of every canvas (HF's `decoder_input_ids` does so for the first; restarted attempts
  still start from random ones);
  `max_cache_len` makes a prompt that does not fit fail with a clear error.
  `position_features`: the model's feature table, when config.num_position_features > 0 (a checkpoint's
  metadata["position_features"]).
  `on_step(canvas_index, step, argmax_BxC, ran_B)` (numpy arrays; ran_B: the rows that ran this step, not
  stopped before it) is called on the host after every denoising step, from inside the compiled loop
  (jax.debug.callback; dgemma/sampling/streaming.py shows the canvas live with it). It is part of the program only when given: None compiles the program without it.
  """
  args, static = _prepare(config, sampler_config, prompt_tokens, prompt_valid, rng, initial_canvases,
                          max_cache_len, position_features, on_step)
  return _generate(params, *args, **static)


def compile_generate(params: dict, config: ModelConfig, prompt_tokens: Int[Array, "B P"],
                     prompt_valid: Bool[Array, "B P"] | None, rng: jax.Array,
                     sampler_config: SamplerConfig = SamplerConfig(), *,
                     max_cache_len: int | None = None,
                     position_features: Int[Array, "L F"] | None = None,
                     on_step: Callable | None = None
                     ) -> tuple[Callable[..., GenerateOutput], float]:
  """Ahead-of-time compilation for inputs shaped like these: (run, compile seconds), so that callers can
  report compile time apart. `run(prompt_tokens, prompt_valid, rng)` takes inputs of the same shapes.
  `on_step`: as for `generate`."""
  args, static = _prepare(config, sampler_config, prompt_tokens, prompt_valid, rng, None, max_cache_len,
                          position_features, on_step)
  start = time.perf_counter()
  compiled = _generate.lower(params, *args, **static).compile()
  seconds = time.perf_counter() - start

  def run(prompt_tokens, prompt_valid, rng) -> GenerateOutput:
    new_args, new_static = _prepare(config, sampler_config, prompt_tokens, prompt_valid, rng, None,
                                    max_cache_len, position_features, on_step)
    if new_static != static:
      raise ValueError("inputs differ in shape from the ones this sampler was compiled for")
    return compiled(params, *new_args)

  return run, seconds
