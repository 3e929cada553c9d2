"""Sampler speed, side by side on one machine, one checkpoint, one prompt and the same canvas/step settings:

  1. our block-diffusion sampler (one jitted program),
  2. transformers' DiffusionGemma `generate` on the same HF checkpoint,
  3. autoregressive decoding with our same backbone (encoder + KV cache, one token per pass),
  4. bare denoiser forward passes (prefill + N denoise calls with self-conditioning, no sampling), to measure
     the sampler's own per-step overhead: over whole calls, and per added step (both also run with N / 6 steps),
     with the thread wake-ups (context switches) each added step costs;
  5. a bound: the FLOPs of one denoising step (XLA's count; and with only the chosen experts, as HF runs them)
     against this CPU's float32 matmul rate (a large jitted matmul), so the table says how fast a step could be.

  python scripts/bench_sampler.py                  # a random HF checkpoint of the size given by the flags
  python scripts/bench_sampler.py --ckpt=HF_DIR    # an existing HF DiffusionGemma directory

Compile time is measured apart (ahead-of-time compilation) and excluded from tokens/s. Every token of every
generated canvas counts (stop tokens are disabled on all sides so the work is the same); HF's warm-up run is
not timed. With random weights no row becomes confident, so every canvas runs all its steps on every side.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402
from dgemma.config import MOE_IMPLS  # noqa: E402
from dgemma.cpu import huge_pages  # noqa: E402
from dgemma.sampling import flags as sampler_flags  # noqa: E402

FLAGS = flags.FlagValues()
_D = dict(flag_values=FLAGS)
flags.DEFINE_string("ckpt", None, "HF DiffusionGemma directory; default: a random one of the size below.", **_D)
flags.DEFINE_integer("vocab", 4096, "Vocabulary of the random checkpoint.", **_D)
flags.DEFINE_integer("width", 256, "Model width of the random checkpoint.", **_D)
flags.DEFINE_integer("layers", 4, "Layers of the random checkpoint (the last one global).", **_D)
flags.DEFINE_integer("experts", 8, "Experts of the random checkpoint (top-2).", **_D)
flags.DEFINE_integer("canvas", 64, "Canvas length.", **_D)
flags.DEFINE_integer("canvases", 1, "Canvases to generate (max_new_tokens = canvases * canvas).", **_D)
# Our sampler's knobs that the comparison varies (dgemma/sampling/flags.py); the others are the references' defaults.
sampler_flags.define(FLAGS, only=("max_denoising_steps", "cache_per_canvas", "token_stats"))
flags.DEFINE_integer("prompt_len", 32, "Prompt length.", **_D)
flags.DEFINE_integer("batch", 1, "Batch size.", **_D)
flags.DEFINE_integer("repeats", 5, "Timed runs of each JAX program (the median is reported).", **_D)
flags.DEFINE_integer("hf_repeats", 5, "Timed runs of HF generate, after one untimed warm-up; each is paired with "
                     "a run of ours right after it.", **_D)
flags.DEFINE_enum("moe_impl", "dense", list(MOE_IMPLS),
                  "Our MoE experts: 'dense' (every expert; the fastest on CPU at these sizes) or 'xla' "
                  "(lax.ragged_dot, only the chosen experts). HF is unaffected.", **_D)
flags.DEFINE_enum("dtype", "float32", ["float32", "bfloat16"],
                  "Parameter dtype of the random checkpoint; both sides load and run it in that dtype (real "
                  "DiffusionGemma checkpoints are bfloat16). With --ckpt: the dtype both sides load it in.", **_D)
flags.DEFINE_enum("ours_dtype", None, ["float32", "bfloat16"],
                  "Our side only: the dtype we hold the parameters and activations in (default: --dtype). "
                  "'float32' with --dtype=bfloat16 --matmul_dtype=bfloat16 multiplies the checkpoint's exact bf16 "
                  "weights with float32 accumulation and keeps the rest in float32.", **_D)
flags.DEFINE_enum("matmul_dtype", "", ["", "bfloat16"],
                  "Our side only: 'bfloat16' multiplies bf16 copies of the weight matmuls' operands with float32 "
                  "accumulation (ModelConfig.matmul_dtype); HF runs the checkpoint in --dtype.", **_D)
flags.DEFINE_integer("seed", 0, "Seed of the random checkpoint, the prompt and the samplers.", **_D)
flags.DEFINE_string("json_out", None, "Also write the numbers to this JSON file.", **_D)


def _random_checkpoint(path: str):
  import jax

  from dgemma import model
  from dgemma.checkpoints import save_hf
  from dgemma.config import GLOBAL, LOCAL, ModelConfig
  heads = max(FLAGS.width // 64, 1)
  config = ModelConfig(
      vocab_size=FLAGS.vocab, width=FLAGS.width, num_layers=FLAGS.layers, num_heads=heads,
      local_num_kv_heads=max(heads // 2, 1), local_head_dim=64, global_num_kv_heads=1, global_head_dim=128,
      mlp_hidden=2 * FLAGS.width, num_experts=FLAGS.experts, top_k_experts=min(2, FLAGS.experts),
      expert_hidden=FLAGS.width // 2, sliding_window=128,
      layer_types=tuple(LOCAL for _ in range(FLAGS.layers - 1)) + (GLOBAL,), canvas_length=FLAGS.canvas,
      param_dtype=FLAGS.dtype)
  save_hf(path, config, model.init_params(config, jax.random.key(FLAGS.seed)))


def _median_time(fn, repeats: int):
  import jax
  times, out = [], None
  for _ in range(repeats):
    start = time.perf_counter()
    out = jax.block_until_ready(fn())
    times.append(time.perf_counter() - start)
  return statistics.median(times), out


def _context_switches() -> int | None:
  """Context switches so far, summed over this process's threads (Linux /proc), or None where unavailable. Each
  one a timed program adds is a thread that had gone to sleep and was woken: on XLA:CPU, mostly a parallel
  operation handing work to an idle worker (tools/handoff_latency.c measures what a wake-up costs)."""
  try:
    threads = os.listdir("/proc/self/task")
  except OSError:
    return None
  total = 0
  for tid in threads:
    try:
      with open(f"/proc/self/task/{tid}/status") as f:
        total += sum(int(line.split()[1]) for line in f if line.startswith(("voluntary_ctxt", "nonvoluntary_ctxt")))
    except FileNotFoundError:  # the thread ended meanwhile
      continue
  return total


@functools.lru_cache(maxsize=None)
def _bare_program(config, steps: int, canvas_len: int, cache_len: int, kernel_softmax: bool = False):
  """Prefill + `steps` denoiser passes that feed their logits back as self-conditioning: the network work of
  one canvas, without temperature, sampling, acceptance or stopping. `cache_len`: the prompt's length, for the
  cache the sampler's first canvas reads (it has no slots for the canvas, which is never committed).
  `kernel_softmax`: the self-conditioning softmax by the sampler's CPU kernel (in the dtype the sampler carries)
  instead of `jax.nn.softmax`."""
  import jax
  import jax.numpy as jnp

  from dgemma.model.cache import init_cache
  from dgemma.model.transformer import DiffusionGemma
  from dgemma.cpu import token_stats as cpu_kernel
  from dgemma.sampling.generate import signal_is_probabilities
  model = DiffusionGemma(config)

  @jax.jit
  def run(params, prompt, canvas):
    variables = {"params": params}
    b = prompt.shape[0]
    _, cache = model.apply(variables, prompt, init_cache(config, b, cache_len), None, False,
                           method=DiffusionGemma.encode)

    # As the sampler does (float32 models): the softmax of the logits, and E.T taken once for its product.
    table = (model.apply(variables, method=DiffusionGemma.embedding_table_transposed)
             if signal_is_probabilities(config) else None)

    def body(k, sc):
      has_sc = jnp.broadcast_to(k > 0, (b,))
      if table is None:
        return model.apply(variables, canvas, cache, sc, has_sc, method=DiffusionGemma.denoise)
      if kernel_softmax:
        probs = cpu_kernel.token_stats(sc, jnp.zeros(sc.shape[:-1]), 1.0, probs_dtype=(
            jnp.bfloat16 if config.matmul_dtype == "bfloat16" else jnp.float32)).probs
      else:
        probs = jax.nn.softmax(sc, axis=-1)
      return model.apply(variables, canvas, cache, None, has_sc, probs, table, method=DiffusionGemma.denoise)

    sc = jnp.zeros((b, canvas_len, config.vocab_size), jnp.float32)  # the logits are float32 (unembed)
    return jnp.sum(jax.lax.fori_loop(0, steps, body, sc))

  return run


def _step_gflop(params, config, prompt, canvas_len: int) -> float:
  """XLA's FLOP count of one self-conditioned denoiser pass (the model has no loops, so the count is complete)."""
  import jax
  import jax.numpy as jnp

  from dgemma.model.cache import init_cache
  from dgemma.model.transformer import DiffusionGemma
  model = DiffusionGemma(config)
  b = prompt.shape[0]
  _, cache = model.apply({"params": params}, prompt, init_cache(config, b, prompt.shape[1]), None,
                         False, method=DiffusionGemma.encode)
  step = jax.jit(lambda p, canvas, sc: model.apply({"params": p}, canvas, cache, sc, jnp.ones((b,), bool),
                                                  method=DiffusionGemma.denoise))
  canvas = jnp.zeros((b, canvas_len), jnp.int32)
  sc = jnp.zeros((b, canvas_len, config.vocab_size), jnp.float32)
  cost = step.lower(params, canvas, sc).compile().cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost  # older JAX: one dict per program
  return float(cost["flops"]) / 1e9


def _matmul_gflops(n: int = 1024, repeats: int = 10) -> float:
  """This machine's float32 matmul rate through XLA on an [n, n] @ [n, n] product (the best of `repeats`)."""
  import jax
  import jax.numpy as jnp
  a = jax.random.normal(jax.random.key(0), (n, n), jnp.float32)
  mm = jax.jit(lambda x: x @ x)
  jax.block_until_ready(mm(a))
  best = min(_median_time(lambda: mm(a), 1)[0] for _ in range(repeats))
  return 2 * n ** 3 / best / 1e9


def run() -> dict:
  import jax
  import numpy as np
  import torch

  from dgemma.checkpoints import load_hf
  from dgemma.sampling import ARConfig, SamplerConfig
  from dgemma.sampling.autoregressive import compile_autoregressive
  from dgemma.sampling.generate import compile_generate, signal_is_probabilities

  tmp = None
  path = FLAGS.ckpt
  if path is None:
    tmp = tempfile.TemporaryDirectory()
    path = os.path.join(tmp.name, "hf")
    _random_checkpoint(path)
  config, params = load_hf(path)
  ours_dtype = FLAGS.ours_dtype or FLAGS.dtype
  params = jax.tree.map(lambda x: x.astype(FLAGS.dtype).astype(ours_dtype), params)
  config = config.replace(canvas_length=FLAGS.canvas, moe_impl=FLAGS.moe_impl, param_dtype=ours_dtype,
                          matmul_dtype=FLAGS.matmul_dtype)
  c, b = FLAGS.canvas, FLAGS.batch
  new_tokens = FLAGS.canvases * c
  # Our sampler: the flags, else the reference defaults; stop tokens off on all sides, so that the work is the same.
  sampler = sampler_flags.sampler_config(FLAGS, max_new_tokens=new_tokens, canvas_length=c, stop_ids=())
  n_steps = sampler.max_denoising_steps
  rng = np.random.default_rng(FLAGS.seed)
  prompt = rng.integers(3, config.vocab_size, (b, FLAGS.prompt_len)).astype(np.int32)
  valid = np.ones_like(prompt, bool)
  key = jax.random.key(FLAGS.seed)
  results = {}

  # 1. Our sampler.
  ours, compile_s = compile_generate(params, config, prompt, valid, key, sampler)
  seconds, out = _median_time(lambda: ours(prompt, valid, key), FLAGS.repeats)
  passes = int(np.asarray(out.steps_per_canvas).sum())
  results["ours"] = dict(seconds=seconds, compile_s=compile_s, tokens=b * new_tokens,
                         steps_per_canvas=passes / (b * FLAGS.canvases),
                         tokens_per_forward=float(np.mean(np.asarray(out.tokens_per_forward))))

  # 2. transformers on the same checkpoint and settings.
  from transformers import DiffusionGemmaForBlockDiffusion
  from transformers.utils import logging as hf_logging
  hf_logging.set_verbosity_error()
  hf = DiffusionGemmaForBlockDiffusion.from_pretrained(path, dtype=getattr(torch, FLAGS.dtype)).eval()
  hf.config.canvas_length = c
  torch.manual_seed(FLAGS.seed)
  hf_kwargs = dict(max_new_tokens=new_tokens, max_denoising_steps=n_steps, eos_token_id=[], pad_token_id=-1)

  def hf_generate():
    with torch.no_grad():
      return hf.generate(torch.tensor(prompt, dtype=torch.long), **hf_kwargs)

  hf_generate()  # warm-up
  # Each HF run is followed by one of ours, so that a change in the machine's speed (shared hosts drift by
  # 20% within minutes) hits both sides of a pair alike; the paired ratios are reported besides the medians.
  times, ours_paired = [], []
  for _ in range(FLAGS.hf_repeats):
    start = time.perf_counter()
    hf_out = hf_generate()
    times.append(time.perf_counter() - start)
    ours_paired.append(_median_time(lambda: ours(prompt, valid, key), 1)[0])
  results["paired"] = dict(ratios=[hf_s / ours_s for hf_s, ours_s in zip(times, ours_paired)],
                           ours_seconds=ours_paired, hf_seconds=list(times))
  results["paired"]["median_ratio"] = statistics.median(results["paired"]["ratios"])
  hf_tpf = float(hf_out.tokens_per_forward.float().mean())
  results["transformers"] = dict(seconds=statistics.median(times), compile_s=0.0, tokens=b * new_tokens,
                                 steps_per_canvas=new_tokens / hf_tpf / FLAGS.canvases,
                                 tokens_per_forward=hf_tpf)

  # 3. Autoregressive decoding of as many tokens with our backbone.
  ar, ar_compile = compile_autoregressive(params, config, prompt, valid, key,
                                          ARConfig(max_new_tokens=new_tokens, stop_ids=()))
  ar_seconds, _ = _median_time(lambda: ar(prompt, valid, key), FLAGS.repeats)
  results["autoregressive"] = dict(seconds=ar_seconds, compile_s=ar_compile, tokens=b * new_tokens,
                                   steps_per_canvas=None, tokens_per_forward=1.0)

  # 4. Sampler overhead: one canvas, every step run, against the bare network passes of that canvas. Measured on
  # the sampler users run (adaptive stopping on), which a random checkpoint never stops early; a trained one may,
  # and then the fixed-step sampler is measured and the report says so. (In bf16-matmul mode XLA:CPU compiled the
  # fixed-step program ~0.7 ms/step slower, though it does less: a scheduling effect, not sampler work.)
  one = SamplerConfig(max_denoising_steps=n_steps, max_new_tokens=c, canvas_length=c, stop_ids=(),
                      token_stats=sampler.token_stats)
  sampler_one, _ = compile_generate(params, config, prompt, valid, key, one)
  if not (np.asarray(sampler_one(prompt, valid, key).steps_per_canvas) == n_steps).all():
    one = dataclasses.replace(one, adaptive_stopping=False)
    sampler_one, _ = compile_generate(params, config, prompt, valid, key, one)
  bare = _bare_program(config, n_steps, c, FLAGS.prompt_len)
  canvas = rng.integers(0, config.vocab_size, (b, c)).astype(np.int32)
  # The same two programs with fewer steps: (long - short) / (steps between) is the cost of one more step,
  # without what a call pays once (prefill, setup), which the whole-call ratio includes.
  few = max(1, n_steps // 6)
  sampler_few, _ = compile_generate(params, config, prompt, valid, key,
                                    dataclasses.replace(one, max_denoising_steps=few))
  bare_few = _bare_program(config, few, c, FLAGS.prompt_len)
  programs = dict(sampler=lambda: sampler_one(prompt, valid, key), bare=lambda: bare(params, prompt, canvas),
                  sampler_few=lambda: sampler_few(prompt, valid, key), bare_few=lambda: bare_few(params, prompt, canvas))
  # With the CPU kernel, the sampler's softmax is faster than the bare passes' XLA one: also time bare passes that
  # take their softmax from the kernel, so that what remains is the sampler's other work.
  if one.resolve(config).token_stats == "cpu" and signal_is_probabilities(config):
    bare_kernel = _bare_program(config, n_steps, c, FLAGS.prompt_len, kernel_softmax=True)
    programs["bare_kernel"] = lambda: bare_kernel(params, prompt, canvas)
  for fn in programs.values():
    jax.block_until_ready(fn())  # compile
  # Back-to-back rounds of all four, so that a load change on a shared machine hits them alike; the median
  # sampler / bare ratio of the rounds.
  times = {name: [] for name in programs}
  switches = {name: [] for name in programs}
  for _ in range(2 * FLAGS.repeats):
    for name, fn in programs.items():
      before = _context_switches()
      times[name].append(_median_time(fn, 1)[0])
      after = _context_switches()
      if before is not None and after is not None:
        switches[name].append(after - before)
  t = {name: statistics.median(v) for name, v in times.items()}
  ratio = statistics.median(a / b for a, b in zip(times["sampler"], times["bare"]))
  per_step = {side: (t[side] - t[side + "_few"]) / max(n_steps - few, 1) for side in ("sampler", "bare")}
  results["overhead"] = dict(sampler_s=t["sampler"], bare_s=t["bare"], sampler_step_ms=1e3 * t["sampler"] / n_steps,
                             bare_step_ms=1e3 * t["bare"] / n_steps, overhead=ratio - 1.0,
                             adaptive_stopping=one.adaptive_stopping, few_steps=few,
                             sampler_added_step_ms=1e3 * per_step["sampler"], bare_added_step_ms=1e3 * per_step["bare"],
                             added_step_overhead=per_step["sampler"] / per_step["bare"] - 1.0,
                             sampler_fixed_ms=1e3 * (t["sampler_few"] - few * per_step["sampler"]),
                             bare_fixed_ms=1e3 * (t["bare_few"] - few * per_step["bare"]))
  if "bare_kernel" in times:
    results["overhead"]["bare_kernel_step_ms"] = 1e3 * t["bare_kernel"] / n_steps
    results["overhead"]["overhead_vs_kernel_softmax"] = statistics.median(
        a / b for a, b in zip(times["sampler"], times["bare_kernel"])) - 1.0
  if all(switches.values()):
    sw = {name: statistics.median(v) for name, v in switches.items()}
    for side in ("sampler", "bare"):
      results["overhead"][side + "_switches_per_step"] = (sw[side] - sw[side + "_few"]) / max(n_steps - few, 1)
  # 5. The bound: how many FLOPs a step is and how fast this CPU multiplies matrices.
  gflop = _step_gflop(params, config, prompt, c)
  # Every layer has the MoE branch; the dense path runs each expert's gate, up and down projection on every token.
  unchosen = 2 * 3 * config.width * config.expert_hidden * (config.num_experts - config.top_k_experts)
  sparse_gflop = gflop - (b * c * config.num_layers * unchosen / 1e9 if config.moe_impl == "dense" else 0.0)
  peak = _matmul_gflops()
  hf_step_ms = 1e3 * results["transformers"]["seconds"] / (results["transformers"]["steps_per_canvas"]
                                                           * FLAGS.canvases)
  results["bound"] = dict(step_gflop=gflop, step_gflop_chosen_experts=sparse_gflop, matmul_gflops=peak,
                          bare_step_gflops=gflop / (t["bare"] / n_steps), hf_step_ms=hf_step_ms,
                          step_ms_for_5x=hf_step_ms / 5,
                          gflops_for_5x_chosen_experts=sparse_gflop / (hf_step_ms / 5 / 1e3))
  results["settings"] = dict(ckpt=FLAGS.ckpt or "random", vocab=config.vocab_size, width=config.width,
                             layers=config.num_layers, experts=config.num_experts, dtype=FLAGS.dtype,
                             ours_dtype=ours_dtype,
                             matmul_dtype=config.matmul_dtype or ours_dtype,
                             moe_impl=config.moe_impl, canvas=c,
                             canvases=FLAGS.canvases, cache_per_canvas=sampler.resolve(config).cache_per_canvas,
                             token_stats=sampler.resolve(config).token_stats,
                             steps=n_steps, prompt_len=FLAGS.prompt_len, batch=b,
                             cpu_count=os.cpu_count(), torch_threads=torch.get_num_threads(),
                             ld_preload=os.environ.get("LD_PRELOAD") or None)  # e.g. tools/spin_wait.c
  if tmp is not None:
    tmp.cleanup()
  return results


def report(results: dict) -> str:
  s = results["settings"]
  rows = [("dgemma sampler (jit)", "ours"), ("transformers generate", "transformers"),
          ("dgemma autoregressive", "autoregressive")]
  hf_rate = results["transformers"]["tokens"] / results["transformers"]["seconds"]
  lines = [
      f"checkpoint {s['ckpt']}: vocab {s['vocab']}, width {s['width']}, {s['layers']} layers, "
      f"{s['experts']} experts in {s['dtype']} (ours: {s.get('ours_dtype', s['dtype'])}, moe_impl={s['moe_impl']}, "
      f"matmuls {s.get('matmul_dtype', s['dtype'])}); batch {s['batch']}, prompt {s['prompt_len']}, "
      f"{s['canvases']} canvas(es) of {s['canvas']}"
      + ("" if s["canvases"] == 1 else f" (cache per canvas: {s.get('cache_per_canvas', False)})")
      + f", token stats: {s.get('token_stats', 'xla')}"
      + f", {s['steps']} steps; {s['cpu_count']} CPU cores, "
      f"torch threads {s['torch_threads']}" + (f"; LD_PRELOAD={s['ld_preload']}" if s.get("ld_preload") else ""),
      "",
      "| decoder | tokens/s | x transformers | denoising steps / canvas | tokens / forward | time (s) | "
      "compile (s) |",
      "|---|---|---|---|---|---|---|",
  ]
  for label, key in rows:
    r = results[key]
    rate = r["tokens"] / r["seconds"]
    steps = "-" if r["steps_per_canvas"] is None else f"{r['steps_per_canvas']:.1f}"
    lines.append(f"| {label} | {rate:.1f} | {rate / hf_rate:.2f} | {steps} | {r['tokens_per_forward']:.2f} | "
                 f"{r['seconds']:.3f} | {r['compile_s']:.1f} |")
  if "paired" in results:  # (results files from before the pairing have none)
    p = results["paired"]
    lines += ["", f"x transformers, run for run (each HF run followed by one of ours): median "
                  f"{p['median_ratio']:.2f}x over {len(p['ratios'])} pairs ("
                  + ", ".join(f"{r:.2f}" for r in p["ratios"]) + ")"]
  o = results["overhead"]
  lines += ["", f"sampler overhead over bare denoiser passes (one canvas, all {s['steps']} steps, prefill "
                f"included): {o['sampler_step_ms']:.2f} ms/step vs {o['bare_step_ms']:.2f} ms/step; median "
                f"paired ratio {100 * o['overhead']:+.1f}%" +
                ("" if o.get("adaptive_stopping", True) else " (fixed-step sampler: rows stopped early)")]
  if "added_step_overhead" in o:  # (results files from before this measurement have none)
    lines += [f"per added step ({o['few_steps']} against {s['steps']} steps): {o['sampler_added_step_ms']:.3f} vs "
              f"{o['bare_added_step_ms']:.3f} ms, {100 * o['added_step_overhead']:+.1f}%; paid once per call: "
              f"{o['sampler_fixed_ms']:.1f} vs {o['bare_fixed_ms']:.1f} ms"]
  if "overhead_vs_kernel_softmax" in o:
    lines += [f"against bare passes whose softmax is the kernel's too: {o['bare_kernel_step_ms']:.2f} ms/step; median "
              f"paired ratio {100 * o['overhead_vs_kernel_softmax']:+.1f}%"]
  if "sampler_switches_per_step" in o:
    lines += [f"thread wake-ups (context switches) per added step: {o['sampler_switches_per_step']:.1f} sampler, "
              f"{o['bare_switches_per_step']:.1f} bare"]
  if "bound" in results:
    d = results["bound"]
    lines += [f"bound: a denoising step is {d['step_gflop']:.2f} GFLOP as we run it ({d['step_gflop_chosen_experts']:.2f} "
              f"with only the chosen experts); the bare step runs at {d['bare_step_gflops']:.0f} GFLOP/s against "
              f"this CPU's {d['matmul_gflops']:.0f} GFLOP/s on a 1024^3 float32 matmul. 5x transformers "
              f"({d['hf_step_ms']:.1f} ms per step) means a step of {d['step_ms_for_5x']:.2f} ms: "
              f"{d['gflops_for_5x_chosen_experts']:.0f} GFLOP/s even with only the chosen experts."]
  return "\n".join(lines)


def main(argv: list[str]) -> int:
  def run_and_report() -> int:
    results = run()
    print(report(results))
    if FLAGS.json_out:
      with open(FLAGS.json_out, "w") as f:
        json.dump(results, f, indent=2)
    return 0

  return cli.run_main(argv, __doc__, run_and_report, FLAGS, errors=(ValueError, FileNotFoundError))


if __name__ == "__main__":
  huge_pages.restart_with_huge_pages()  # faster XLA:CPU buffers (dgemma/cpu/huge_pages.py)
  sys.exit(main(sys.argv))
