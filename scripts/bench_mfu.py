"""Training-step MFU of a mid-size dense model: the share of the device's bf16 peak a full step achieves.

    python scripts/bench_mfu.py --json_out=mfu.json          # width 2048, 16 layers, sequence 512, on a GPU
    python scripts/bench_mfu.py --tiny                       # CI smoke test on CPU

The step is the shape of our training step with random data: the causal encoder over [prompt ‖ clean canvas]
(next-token cross-entropy), the denoiser over a uniformly corrupted canvas against that cache (cross-entropy on
the clean tokens), gradients of both through the model, and an AdamW update. Model FLOPs are counted from the
config (3x the forward: matmuls and attention over the visible keys; no rematerialisation counted), beside XLA's
own count of the compiled step; MFU = model FLOPs / step time / peak (bench_latency's table, or --peak_tflops).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402

from dgemma import model  # noqa: E402
from dgemma.config import small_dense  # noqa: E402
from dgemma.model.transformer import DiffusionGemma  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench_latency  # noqa: E402  # (the peak table and the FLOP counting)


def step_flops(cfg, batch: int, prompt: int, canvas: int) -> float:
  """3x the forward FLOPs: the encoder over prompt + canvas (with logits), the denoiser over the canvas."""
  n = prompt + canvas
  encode = bench_latency.prefill_flops(cfg, batch, n) + 2 * batch * n * cfg.vocab_size * cfg.width
  denoise = bench_latency.denoise_step_flops(cfg, batch, n, canvas, self_conditioning=False)
  return 3.0 * (encode + denoise)


def make_step(cfg, prompt: int, canvas: int, learning_rate: float = 1e-4):
  net = DiffusionGemma(cfg)
  tx = optax.adamw(learning_rate)

  def loss_fn(params, tokens, noisy):
    b = tokens.shape[0]
    logits, cache = net.apply({"params": params}, tokens, model.init_cache(cfg, b, tokens.shape[1]),
                              method=DiffusionGemma.encode)
    ar = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits[:, :-1]), tokens[:, 1:, None], axis=-1))
    den_logits = net.apply({"params": params}, noisy, cache.with_end(jnp.full((b,), prompt, jnp.int32)),
                           method=DiffusionGemma.denoise)
    clean = tokens[:, prompt:prompt + canvas]
    den = -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(den_logits), clean[:, :, None], axis=-1))
    return ar + den

  @jax.jit
  def step(params, opt_state, tokens, noisy):
    loss, grads = jax.value_and_grad(loss_fn)(params, tokens, noisy)
    updates, opt_state = tx.update(grads, opt_state, params)
    return optax.apply_updates(params, updates), opt_state, loss

  return tx, step


def main(argv=None) -> int:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tiny", action="store_true")
  parser.add_argument("--width", type=int, default=2048)
  parser.add_argument("--layers", type=int, default=16)
  parser.add_argument("--heads", type=int, default=16)
  parser.add_argument("--vocab", type=int, default=32768)
  parser.add_argument("--sequence", type=int, default=512, help="prompt + canvas tokens (half each)")
  parser.add_argument("--batch", type=int, default=16)
  parser.add_argument("--param_dtype", default="bfloat16", choices=["bfloat16", "float32"])
  parser.add_argument("--matmul_dtype", default="", choices=["", "bfloat16"])
  parser.add_argument("--attention_impl", default="xla")
  parser.add_argument("--remat", action="store_true")
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--peak_tflops", type=float, default=None)
  parser.add_argument("--json_out", default=None)
  args = parser.parse_args(argv)
  if args.tiny:
    args.width, args.layers, args.heads, args.vocab, args.sequence, args.batch, args.steps = 64, 2, 4, 128, 32, 2, 2
  if args.sequence < 2 or args.sequence % 2 or args.steps < 1 or args.batch < 1:
    print("error: --sequence must be even and >= 2, --steps and --batch >= 1", file=sys.stderr)
    return 2
  prompt = canvas = args.sequence // 2
  try:
    cfg = small_dense(vocab_size=args.vocab, width=args.width, num_layers=args.layers, num_heads=args.heads,
                      canvas_length=canvas, param_dtype=args.param_dtype, matmul_dtype=args.matmul_dtype,
                      attention_impl=args.attention_impl, remat=args.remat)
  except ValueError as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  device = jax.devices()[0]
  peaks = bench_latency.device_peaks(device.device_kind, args.peak_tflops, None, jnp.bfloat16)
  params = model.init_params(cfg, jax.random.key(0))
  tx, step = make_step(cfg, prompt, canvas)
  opt_state = jax.jit(tx.init)(params)
  rng = np.random.default_rng(0)
  batches = [tuple(jnp.asarray(rng.integers(3, args.vocab, (args.batch, n)), jnp.int32)
                   for n in (args.sequence, canvas)) for _ in range(2)]
  t0 = time.perf_counter()
  compiled = step.lower(params, opt_state, *batches[0]).compile()
  compile_s = time.perf_counter() - t0
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  xla_flops = float((cost or {}).get("flops", 0.0))
  params, opt_state, loss = compiled(params, opt_state, *batches[0])
  jax.block_until_ready(loss)
  times = []
  for i in range(args.steps):
    start = time.perf_counter()
    params, opt_state, loss = compiled(params, opt_state, *batches[i % 2])
    jax.block_until_ready(loss)
    times.append(time.perf_counter() - start)
  median = float(np.median(times))
  flops = step_flops(cfg, args.batch, prompt, canvas)
  n_params = bench_latency.total_params(cfg)
  out = dict(device=device.device_kind, peak_tflops=peaks["peak_tflops"], peak_source=peaks["source"],
             width=args.width, layers=args.layers, heads=args.heads, vocab=args.vocab, sequence=args.sequence,
             batch=args.batch, param_dtype=args.param_dtype, matmul_dtype=args.matmul_dtype,
             attention_impl=args.attention_impl, remat=args.remat, params=n_params, compile_s=compile_s,
             step_s=median, min_step_s=min(times), model_flops=flops, xla_flops=xla_flops,
             tflops=flops / median / 1e12, mfu=flops / median / 1e12 / peaks["peak_tflops"],
             loss=float(loss))
  print(f"{device.device_kind}: dense {n_params / 1e6:.0f}M parameters ({args.param_dtype}), batch {args.batch} x "
        f"{args.sequence} tokens: step {1e3 * median:.1f} ms (compile {compile_s:.1f} s), {out['tflops']:.1f} "
        f"TFLOP/s of model FLOPs ({flops / 1e12:.2f} TFLOP per step; XLA counts {xla_flops / 1e12:.2f}): "
        f"MFU {100 * out['mfu']:.1f}% of {peaks['peak_tflops']:.4g} TFLOP/s ({peaks['source']})", flush=True)
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(out, f, indent=1)
  return 0


if __name__ == "__main__":
  sys.exit(main())
