"""Single-user latency: block diffusion against autoregressive decoding with the same backbone and cache.

    python scripts/bench_latency.py --json_out=latency.json                        # diffusiongemma_26b_a4b, GPU
    python scripts/bench_latency.py --tiny                                         # CI: tiny_moe, seconds on CPU
    python scripts/bench_latency.py --preset=diffusiongemma_26b_a4b --override=num_layers=6,vocab_size=32768 ...

A randomly initialised model of a preset, built on the device (jitted init: the weights never sit on the host).
For each batch size B and prompt length P it measures (median of --repeats timed calls after --warmup, each
ended by block_until_ready):
- prefill: the causal encoder over the P-token prompt, written into an empty cache (no logits);
- per canvas c of the longest generation (cache end P + c·C): one denoising step of a C-token canvas against the
  cache (the sampler's step: the self-conditioned denoiser, softmax and arg-max over the vocabulary), the commit
  of a canvas (encoding its C tokens into the cache), and one autoregressive token (the encoder over one token
  and an arg-max, the step of dgemma/sampling/autoregressive.py), each averaged over a jitted loop;
and derives, for N new tokens in n = ceil(N / C) canvases at S denoising steps per canvas (random weights never
stop early, so S is fixed):
    diffusion_s = prefill_s + S · sum_{c<n} step_s[c] + sum_{c<n-1} commit_s[c]
    ar_s        = prefill_s + (N - 1) · mean_{c<n} ar_token_s[c]     (the prefill's logits give the first token)
    tokens_per_s = N / time (one sequence; batch_tokens_per_s = B · N / time).
A check decodes with `generate_autoregressive` itself (first B and P) and reports its end-to-end time next to the
derived one.

Roofline: the AR step's bytes are the weights it must read (attention, dense GeGLU, router, the routed experts
only: top_k per layer at batch 1, the expected number of distinct experts of B·top_k uniform picks otherwise, and
the tied unembedding), against the HBM bandwidth; the denoising step's FLOPs are counted from the ModelConfig
(matmuls with the routed experts only, the vocabulary projections, attention over the visible keys), against the
bf16 peak. Peaks: a table per device kind (dense bf16, no sparsity); on other devices (CPU) a quick
measurement of a large matmul and a large read, or --peak_tflops / --peak_gbps.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dgemma import config as model_configs  # noqa: E402
from dgemma import model  # noqa: E402
from dgemma.config import GLOBAL, LOCAL, ModelConfig  # noqa: E402
from dgemma.model.transformer import DiffusionGemma  # noqa: E402
from dgemma.sampling import acceptance  # noqa: E402

# (substring of jax's device_kind, bf16 dense TFLOP/s, HBM TB/s), first match wins: the vendors' data sheets.
PEAKS = (
    ("H100 PCIe", 756.0, 2.0),
    ("H100 NVL", 835.0, 3.9),
    ("H100", 989.0, 3.35),  # SXM
    ("H200", 989.0, 4.8),
)
PRESETS = {**model_configs.PRESETS, "small_dense": model_configs.small_dense}
TINY = dict(preset="tiny_moe", batch=(1, 2), prompt_lens=(8, 16), new_tokens=(8, 16), steps=(2, 3), repeats=2,
            warmup=1, loop=2, ar_loop=2, ar_check_tokens=4)


# -------------------------------------------------------------------------------------------------
# Arguments
# -------------------------------------------------------------------------------------------------
def _ints(text: str) -> tuple[int, ...]:
  try:
    values = tuple(int(v) for v in text.split(",") if v)
  except ValueError:
    raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
  if not values or min(values) < 1:
    raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
  return values


def parse_overrides(text: str) -> dict:
  """'width=512,num_layers=6' -> ModelConfig field values, typed by the field's default or annotation."""
  fields = {f.name: f for f in dataclasses.fields(ModelConfig)}
  out = {}
  for item in filter(None, text.split(",")):
    key, sep, value = item.partition("=")
    if not sep or key not in fields:
      raise ValueError(f"bad --override entry {item!r}: expected field=value with a ModelConfig field")
    kind = fields[key].type
    if "bool" in str(kind):
      out[key] = value.lower() in ("1", "true", "yes")
    elif "int" in str(kind) and "tuple" not in str(kind):
      out[key] = int(value)
    elif "float" in str(kind):
      out[key] = float(value)
    elif str(kind) == "str":
      out[key] = value
    else:
      raise ValueError(f"--override cannot set {key!r} (a {kind}); use a preset")
  return out


def build_config(preset: str, overrides: dict) -> ModelConfig:
  if preset not in PRESETS:
    raise ValueError(f"unknown preset {preset!r}; choose from {sorted(PRESETS)}")
  if preset == "diffusiongemma_26b_a4b" and "num_layers" in overrides:  # keep its 5 local : 1 global pattern
    n = overrides["num_layers"]
    overrides = {"layer_types": tuple(GLOBAL if (i + 1) % 6 == 0 or i == n - 1 else LOCAL for i in range(n)),
                 **overrides}
  if preset == "small_dense" and "vocab_size" not in overrides:
    raise ValueError("the small_dense preset needs --override=vocab_size=...")
  try:
    return PRESETS[preset](**overrides)
  except TypeError as e:
    raise ValueError(f"bad override for preset {preset!r}: {e}") from None


# -------------------------------------------------------------------------------------------------
# Counting: parameters, FLOPs, bytes
# -------------------------------------------------------------------------------------------------
def attention_params(cfg: ModelConfig, kind: str) -> int:
  d, n, kv, h = cfg.width, cfg.num_heads, cfg.num_kv_heads(kind), cfg.head_dim(kind)
  return d * n * h + d * kv * h * (2 if cfg.has_v_proj(kind) else 1) + n * h * d


def expert_params(cfg: ModelConfig) -> int:
  """One expert: the fused gate/up and the down projection."""
  return 3 * cfg.width * cfg.expert_hidden


def layer_params(cfg: ModelConfig, kind: str, experts: float) -> float:
  """The matmul weights a token passes through in one layer with `experts` experts (router included)."""
  moe = cfg.width * cfg.num_experts + experts * expert_params(cfg) if cfg.num_experts else 0
  return attention_params(cfg, kind) + 3 * cfg.width * cfg.mlp_hidden + moe


def total_params(cfg: ModelConfig) -> int:
  """Every parameter of the model (from the shapes alone: nothing is allocated)."""
  return int(sum(math.prod(x.shape) for x in jax.tree_util.tree_leaves(model.param_shapes(cfg))))


def distinct_experts(cfg: ModelConfig, tokens: int) -> float:
  """Experts one layer reads for `tokens` tokens: exactly top_k for one token; for more, the expected number of
  distinct experts among `tokens` independent uniform top-k picks (random weights route about uniformly)."""
  e, k = cfg.num_experts, cfg.top_k_experts
  if not e:
    return 0.0
  return float(k) if tokens == 1 else e * (1.0 - (1.0 - k / e) ** tokens)


def ar_step_bytes(cfg: ModelConfig, batch: int) -> dict:
  """Bytes one AR step must read: every layer's weights with only the routed experts, the tied unembedding
  (the embedding lookup reads B rows: negligible); and, separately, the K/V of the visible cache slots."""
  item = jnp.dtype(cfg.param_dtype).itemsize
  experts = distinct_experts(cfg, batch)
  weights = sum(layer_params(cfg, k, experts) for k in cfg.layer_types) + cfg.vocab_size * cfg.width
  return dict(weight_bytes=float(weights * item), experts_read_per_layer=experts)


def kv_bytes(cfg: ModelConfig, batch: int, end: int) -> float:
  """K and V of the cache slots a query at position `end` sees (local layers: the window)."""
  item = jnp.dtype(cfg.param_dtype).itemsize
  total = 0
  for kind in cfg.layer_types:
    slots = min(end + 1, cfg.sliding_window) if kind == LOCAL else end + 1
    total += 2 * slots * cfg.num_kv_heads(kind) * cfg.head_dim(kind)
  return float(batch * total * item)


def denoise_step_flops(cfg: ModelConfig, batch: int, end: int, canvas: int, self_conditioning: bool) -> float:
  """Useful FLOPs of one denoising step: matmuls with the routed experts only, the unembedding, the
  self-conditioning product with the embedding and its GeGLU, attention over the visible keys (HF's sliding
  cache: W-1 cache slots on local layers, plus the whole canvas)."""
  tokens = batch * canvas
  per_token = sum(layer_params(cfg, k, cfg.top_k_experts) for k in cfg.layer_types) + cfg.vocab_size * cfg.width
  if self_conditioning:
    per_token += cfg.vocab_size * cfg.width + 3 * cfg.width * cfg.mlp_hidden
  attention = 0
  for kind in cfg.layer_types:
    keys = (min(end, cfg.sliding_window - 1) if kind == LOCAL else end) + canvas
    attention += 4 * cfg.num_heads * cfg.head_dim(kind) * keys
  return float(2 * tokens * per_token + tokens * attention)


def prefill_flops(cfg: ModelConfig, batch: int, length: int) -> float:
  """Useful FLOPs of the causal prefill of `length` tokens into an empty cache (no logits)."""
  per_token = sum(layer_params(cfg, k, cfg.top_k_experts) for k in cfg.layer_types)
  pos = np.arange(length)
  attention = 0.0
  for kind in cfg.layer_types:
    keys = np.minimum(pos + 1, cfg.sliding_window) if kind == LOCAL else pos + 1
    attention += 4 * cfg.num_heads * cfg.head_dim(kind) * float(keys.sum())
  return float(batch * (2 * length * per_token + attention))


# -------------------------------------------------------------------------------------------------
# Peaks
# -------------------------------------------------------------------------------------------------
def measure_peaks(dtype) -> tuple[float, float]:
  """(TFLOP/s of a large matmul, GB/s of a large reduction read) on the default device, for devices without
  a data-sheet entry (CPUs). Achieved by XLA, so a practical ceiling rather than the silicon's peak."""
  n = 1024 if jax.default_backend() == "cpu" else 8192
  a = jnp.ones((n, n), dtype)
  mm = jax.jit(lambda x: x @ x)
  flops_s = 2 * n ** 3 / median_time(lambda: mm(a), warmup=1, repeats=5)
  x = jnp.ones((64 * 2 ** 20,), jnp.float32)  # 256 MiB: past every cache
  read = jax.jit(jnp.sum)
  bytes_s = x.nbytes / median_time(lambda: read(x), warmup=1, repeats=5)
  return flops_s / 1e12, bytes_s / 1e9


def device_peaks(kind: str, flag_tflops: float | None, flag_gbps: float | None, dtype) -> dict:
  for name, tflops, tbps in PEAKS:
    if name in kind:
      source, peak_tflops, peak_gbps = f"data sheet ({name})", tflops, 1e3 * tbps
      break
  else:
    source = "measured (a large XLA matmul and read on this device)"
    peak_tflops, peak_gbps = (None, None) if flag_tflops and flag_gbps else measure_peaks(dtype)
  if flag_tflops or flag_gbps:
    source += "; flags: " + ", ".join(f for f, v in (("--peak_tflops", flag_tflops), ("--peak_gbps", flag_gbps))
                                      if v)
  return dict(source=source, peak_tflops=flag_tflops or peak_tflops, peak_gbps=flag_gbps or peak_gbps)


# -------------------------------------------------------------------------------------------------
# Timing
# -------------------------------------------------------------------------------------------------
def median_time(fn, *, warmup: int, repeats: int) -> float:
  for _ in range(warmup):
    jax.block_until_ready(fn())
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times)


def make_passes(cfg: ModelConfig, loop: int, ar_loop: int, self_conditioning: bool):
  """The jitted passes: encode (prefill / commit), `loop` denoising steps, `ar_loop` AR tokens."""
  net = DiffusionGemma(cfg)

  @jax.jit
  def encode(params, tokens, cache):
    _, cache = net.apply({"params": params}, tokens, cache, None, False, method=DiffusionGemma.encode)
    return cache

  @jax.jit
  def denoise_steps(params, canvas, probs, cache, table):
    def body(_, carry):
      canvas, probs = carry
      logits = net.apply({"params": params}, canvas, cache, None, None, probs if self_conditioning else None,
                         table, method=DiffusionGemma.denoise)
      return acceptance.argmax(logits), jax.nn.softmax(logits, axis=-1)
    return jax.lax.fori_loop(0, loop, body, (canvas, probs))

  @jax.jit
  def ar_tokens(params, token, cache):
    def body(_, carry):
      token, cache = carry
      logits, cache = net.apply({"params": params}, token[:, None], cache, None, True,
                                method=DiffusionGemma.encode)
      return acceptance.argmax(logits[:, -1:])[:, 0], cache
    return jax.lax.fori_loop(0, ar_loop, body, (token, cache))

  @jax.jit
  def table(params):
    return net.apply({"params": params}, method=DiffusionGemma.embedding_table_transposed)

  return encode, denoise_steps, ar_tokens, table


def ar_end_to_end(params, cfg, prompt, new_tokens: int, warmup: int, repeats: int) -> dict:
  """`generate_autoregressive` itself (no early stop), end to end, for the derived AR number to be checked."""
  from dgemma.sampling.autoregressive import ARConfig, compile_autoregressive
  ar = ARConfig(max_new_tokens=new_tokens, stop_ids=())
  run, compile_s = compile_autoregressive(params, cfg, prompt, None, jax.random.key(0), ar)
  seconds = median_time(lambda: run(prompt, None, jax.random.key(0)).tokens, warmup=warmup, repeats=repeats)
  return dict(new_tokens=new_tokens, seconds=seconds, compile_s=compile_s)


def bench_shape(params, cfg, passes, *, batch, prompt_len, canvas, max_new, loop, ar_loop, warmup, repeats,
                self_conditioning, log) -> dict:
  """Prefill, then per canvas of the longest generation: step, AR token, commit."""
  encode, denoise_steps, ar_tokens, table_fn = passes
  rng = np.random.default_rng(prompt_len)
  tokens = lambda n: jnp.asarray(rng.integers(3, cfg.vocab_size, (batch, n)), jnp.int32)
  num_canvases = math.ceil(max_new / canvas)
  capacity = prompt_len + num_canvases * canvas
  empty = model.init_cache(cfg, batch, capacity)
  prompt = tokens(prompt_len)
  out = dict(batch=batch, prompt_len=prompt_len, canvas=canvas, cache_capacity=capacity)
  t0 = time.perf_counter()
  cache = jax.block_until_ready(encode(params, prompt, empty))
  out["compile_s"] = {"prefill": time.perf_counter() - t0}
  out["prefill_s"] = median_time(lambda: encode(params, prompt, empty), warmup=warmup, repeats=repeats)
  log(f"  B={batch} P={prompt_len}: prefill {1e3 * out['prefill_s']:.2f} ms")
  table = table_fn(params)
  probs = jax.nn.softmax(jax.random.normal(jax.random.key(1), (batch, canvas, cfg.vocab_size)), axis=-1)
  out.update(canvas_ends=[], step_s=[], ar_token_s=[], commit_s=[])
  for c in range(num_canvases):
    end = prompt_len + c * canvas
    canvas0, token = tokens(canvas), tokens(1)[:, 0]
    if c == 0:
      for name, fn in (("denoise_loop", lambda: denoise_steps(params, canvas0, probs, cache, table)),
                       ("ar_loop", lambda: ar_tokens(params, token, cache))):
        t0 = time.perf_counter()
        jax.block_until_ready(fn())
        out["compile_s"][name] = time.perf_counter() - t0
    step = median_time(lambda: denoise_steps(params, canvas0, probs, cache, table), warmup=warmup,
                       repeats=repeats) / loop
    ar = median_time(lambda: ar_tokens(params, token, cache), warmup=warmup, repeats=repeats) / ar_loop
    out["canvas_ends"].append(end)
    out["step_s"].append(step)
    out["ar_token_s"].append(ar)
    msg = f"    cache end {end}: denoising step {1e3 * step:.2f} ms, AR token {1e3 * ar:.3f} ms"
    if c < num_canvases - 1:
      committed = tokens(canvas)
      if c == 0 and canvas == prompt_len:
        out["compile_s"]["commit"] = 0.0  # the prefill's compiled pass (same shapes)
      elif c == 0:
        t0 = time.perf_counter()
        jax.block_until_ready(encode(params, committed, cache))
        out["compile_s"]["commit"] = time.perf_counter() - t0
      out["commit_s"].append(median_time(lambda: encode(params, committed, cache), warmup=warmup,
                                         repeats=repeats))
      cache = encode(params, committed, cache)
      msg += f", commit {1e3 * out['commit_s'][-1]:.2f} ms"
    log(msg)
  return out


# -------------------------------------------------------------------------------------------------
# Derived numbers
# -------------------------------------------------------------------------------------------------
def generation_times(shape: dict, new_tokens: int, steps: int) -> tuple[float, float]:
  """(diffusion seconds, AR seconds) for `new_tokens` at `steps` per canvas, from the measured parts (the module
  docstring's formulas)."""
  n = math.ceil(new_tokens / shape["canvas"])
  if n > len(shape["step_s"]):
    raise ValueError(f"{new_tokens} new tokens need {n} canvases; {len(shape['step_s'])} were measured")
  diffusion = shape["prefill_s"] + steps * sum(shape["step_s"][:n]) + sum(shape["commit_s"][:n - 1])
  ar = shape["prefill_s"] + (new_tokens - 1) * statistics.fmean(shape["ar_token_s"][:n])
  return diffusion, ar


def summarise(shape: dict, cfg: ModelConfig, peaks: dict, new_tokens, steps, self_conditioning: bool) -> dict:
  b, p, c = shape["batch"], shape["prompt_len"], shape["canvas"]
  gen = []
  for n in new_tokens:
    for s in steps:
      diffusion_s, ar_s = generation_times(shape, n, s)
      gen.append(dict(new_tokens=n, steps_per_canvas=s, diffusion_s=diffusion_s, ar_s=ar_s,
                      diffusion_tokens_per_s=n / diffusion_s, ar_tokens_per_s=n / ar_s,
                      diffusion_batch_tokens_per_s=b * n / diffusion_s, ar_batch_tokens_per_s=b * n / ar_s,
                      speedup=ar_s / diffusion_s))
  ar_bytes = ar_step_bytes(cfg, b)
  step_flops = denoise_step_flops(cfg, b, p, c, self_conditioning)
  fill_flops = prefill_flops(cfg, b, p)
  roof = dict(ar_weight_bytes=ar_bytes["weight_bytes"], ar_kv_bytes=kv_bytes(cfg, b, p),
              experts_read_per_layer=ar_bytes["experts_read_per_layer"],
              ar_gbps=ar_bytes["weight_bytes"] / shape["ar_token_s"][0] / 1e9,
              denoise_step_flops=step_flops, denoise_tflops=step_flops / shape["step_s"][0] / 1e12,
              prefill_flops=fill_flops, prefill_tflops=fill_flops / shape["prefill_s"] / 1e12)
  if peaks["peak_gbps"]:
    roof["ar_fraction_of_hbm"] = roof["ar_gbps"] / peaks["peak_gbps"]
    roof["ar_fraction_of_hbm_with_kv"] = (roof["ar_weight_bytes"] + roof["ar_kv_bytes"]) / shape["ar_token_s"][0] \
        / 1e9 / peaks["peak_gbps"]
  if peaks["peak_tflops"]:
    roof["denoise_fraction_of_peak"] = roof["denoise_tflops"] / peaks["peak_tflops"]
    roof["prefill_fraction_of_peak"] = roof["prefill_tflops"] / peaks["peak_tflops"]
  return dict(shape, generation=gen, roofline=roof)


def table_lines(result: dict) -> list[str]:
  lines = []
  for r in result["results"]:
    roof = r["roofline"]
    frac = lambda key: f"{100 * roof[key]:.1f}%" if key in roof else "n/a"
    lines += [f"\n### B={r['batch']}, P={r['prompt_len']} (cache capacity {r['cache_capacity']})",
              f"prefill {1e3 * r['prefill_s']:.2f} ms ({roof['prefill_tflops']:.3g} TFLOP/s, "
              f"{frac('prefill_fraction_of_peak')} of peak); denoising step {1e3 * r['step_s'][0]:.2f} ms "
              f"({roof['denoise_tflops']:.3g} TFLOP/s, {frac('denoise_fraction_of_peak')} of peak); AR token "
              f"{1e3 * r['ar_token_s'][0]:.3f} ms ({roof['ar_gbps']:.4g} GB/s of weights, "
              f"{frac('ar_fraction_of_hbm')} of HBM; {roof['experts_read_per_layer']:.3g} experts per layer)",
              "", "| new tokens | S per canvas | diffusion tok/s | AR tok/s | diffusion / AR |",
              "|---|---|---|---|---|"]
    for g in r["generation"]:
      lines.append(f"| {g['new_tokens']} | {g['steps_per_canvas']} | {g['diffusion_tokens_per_s']:.1f} | "
                   f"{g['ar_tokens_per_s']:.1f} | {g['speedup']:.2f}x |")
  return lines


def crossover_steps(shape: dict, new_tokens: int) -> float:
  """Steps per canvas at which diffusion and AR take equal time for `new_tokens` (diffusion wins below)."""
  n = math.ceil(new_tokens / shape["canvas"])
  _, ar = generation_times(shape, new_tokens, 1)
  fixed = shape["prefill_s"] + sum(shape["commit_s"][:n - 1])
  return (ar - fixed) / sum(shape["step_s"][:n])


# -------------------------------------------------------------------------------------------------
# Main
# -------------------------------------------------------------------------------------------------
def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tiny", action="store_true", help="tiny_moe at tiny shapes: a smoke test in seconds")
  parser.add_argument("--preset", default=None, help=f"model preset: {sorted(PRESETS)}")
  parser.add_argument("--override", default="", help="ModelConfig fields, e.g. num_layers=6,vocab_size=32768")
  parser.add_argument("--param_dtype", default="bfloat16", choices=["bfloat16", "float32"])
  parser.add_argument("--matmul_dtype", default="", choices=["", "bfloat16"])
  parser.add_argument("--attention_impl", default=None, help="ModelConfig.attention_impl (per kind: local=...)")
  parser.add_argument("--moe_impl", default=None, choices=list(model_configs.MOE_IMPLS))
  parser.add_argument("--batch", type=_ints, default=(1, 8))
  parser.add_argument("--prompt_lens", type=_ints, default=(256, 2048))
  parser.add_argument("--new_tokens", type=_ints, default=(256, 1024))
  parser.add_argument("--steps", type=_ints, default=(8, 12, 16, 24, 48), help="denoising steps per canvas")
  parser.add_argument("--canvas", type=int, default=None, help="canvas length (default: the config's)")
  parser.add_argument("--no_self_conditioning", action="store_true")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--warmup", type=int, default=1)
  parser.add_argument("--loop", type=int, default=4, help="denoising steps per timed call")
  parser.add_argument("--ar_loop", type=int, default=16, help="AR tokens per timed call")
  parser.add_argument("--ar_check_tokens", type=int, default=64,
                      help="tokens of the generate_autoregressive end-to-end check (0: skip)")
  parser.add_argument("--peak_tflops", type=float, default=None)
  parser.add_argument("--peak_gbps", type=float, default=None)
  parser.add_argument("--json_out", default=None)
  args = parser.parse_args(argv)
  if args.tiny:
    for key, value in TINY.items():
      if key == "preset" and args.preset is None or key != "preset" and parser.get_default(key) == getattr(args, key):
        setattr(args, key, value)
  preset = args.preset or "diffusiongemma_26b_a4b"
  try:
    overrides = parse_overrides(args.override)
    overrides.setdefault("param_dtype", args.param_dtype)
    overrides.setdefault("matmul_dtype", args.matmul_dtype)
    if args.attention_impl:
      overrides["attention_impl"] = args.attention_impl
    if args.moe_impl:
      overrides["moe_impl"] = args.moe_impl
    if args.canvas:
      overrides["canvas_length"] = args.canvas
    cfg = build_config(preset, overrides)
    for name in ("repeats", "loop", "ar_loop"):
      if getattr(args, name) < 1:
        raise ValueError(f"--{name} must be >= 1")
    if args.ar_loop > cfg.canvas_length:
      raise ValueError(f"--ar_loop={args.ar_loop} must be <= the canvas length {cfg.canvas_length}")
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2

  sc = not args.no_self_conditioning
  device = jax.devices()[0]
  mm_dtype = jnp.bfloat16 if "bfloat16" in (cfg.param_dtype, cfg.matmul_dtype) else jnp.float32
  peaks = device_peaks(device.device_kind, args.peak_tflops, args.peak_gbps, mm_dtype)
  log = lambda msg: print(msg, flush=True)
  log(f"jax {jax.__version__} on {device.device_kind} ({jax.default_backend()}); peaks: "
      f"{peaks['peak_tflops']:.4g} TFLOP/s, {peaks['peak_gbps']:.4g} GB/s ({peaks['source']})")
  t0 = time.perf_counter()
  init_cfg = cfg.replace(attention_impl="xla", moe_impl="xla")  # the same parameter tree, no kernel compiles
  params = jax.block_until_ready(model.init_params(init_cfg, jax.random.key(0)))  # jitted: built on the device
  log(f"{preset}: {total_params(cfg) / 1e9:.3g} B parameters, {cfg.param_dtype}, built in "
      f"{time.perf_counter() - t0:.1f} s; attention_impl={cfg.attention_impl!r}, moe_impl={cfg.moe_impl!r}")
  result = dict(
      device=dict(kind=device.device_kind, backend=jax.default_backend(), jax=jax.__version__, **peaks),
      model=dict(preset=preset, overrides={k: v for k, v in overrides.items()}, total_params=total_params(cfg),
                 param_dtype=cfg.param_dtype, matmul_dtype=cfg.matmul_dtype, attention_impl=cfg.attention_impl,
                 moe_impl=cfg.moe_impl, num_experts=cfg.num_experts, top_k_experts=cfg.top_k_experts,
                 canvas_length=cfg.canvas_length, self_conditioning=sc),
      settings=dict(repeats=args.repeats, warmup=args.warmup, loop=args.loop, ar_loop=args.ar_loop,
                    new_tokens=list(args.new_tokens), steps=list(args.steps)),
      formulas=dict(diffusion_s="prefill_s + S * sum(step_s[:n]) + sum(commit_s[:n-1]), n = ceil(N / canvas)",
                    ar_s="prefill_s + (N - 1) * mean(ar_token_s[:n])", tokens_per_s="N / seconds"),
      results=[])

  def write():
    if args.json_out:
      with open(args.json_out + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
      os.replace(args.json_out + ".tmp", args.json_out)  # a killed run leaves the last complete file

  passes = make_passes(cfg, args.loop, args.ar_loop, sc)
  for b in args.batch:
    for p in args.prompt_lens:
      shape = bench_shape(params, cfg, passes, batch=b, prompt_len=p, canvas=cfg.canvas_length,
                          max_new=max(args.new_tokens), loop=args.loop, ar_loop=args.ar_loop, warmup=args.warmup,
                          repeats=args.repeats, self_conditioning=sc, log=log)
      r = summarise(shape, cfg, peaks, args.new_tokens, args.steps, sc)
      r["crossover_steps"] = {str(n): crossover_steps(shape, n) for n in args.new_tokens}
      result["results"].append(r)
      log("\n".join(table_lines(dict(results=[r]))))
      write()
      if args.ar_check_tokens and "ar_check" not in result:
        prompt = jnp.asarray(np.random.default_rng(0).integers(3, cfg.vocab_size, (b, p)), jnp.int32)
        check = ar_end_to_end(params, cfg, prompt, args.ar_check_tokens, args.warmup, args.repeats)
        n = args.ar_check_tokens
        derived = shape["prefill_s"] + (n - 1) * shape["ar_token_s"][0]
        result["ar_check"] = dict(check, batch=b, prompt_len=p, derived_seconds=derived)
        log(f"  generate_autoregressive, {n} tokens end to end: {1e3 * check['seconds']:.1f} ms "
            f"(derived from the parts: {1e3 * derived:.1f} ms; its prefill also computes the prompt's logits)")
        write()
  return 0


if __name__ == "__main__":
  sys.exit(main())
