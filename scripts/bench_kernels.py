"""Times the Pallas kernels against the XLA paths (and cuDNN attention) at DiffusionGemma shapes.

    python scripts/bench_kernels.py                 # on a GPU: the real shapes (bf16), a Markdown table
    python scripts/bench_kernels.py --tiny          # anywhere: tiny shapes, interpret mode off GPU (smoke test)

Attention: the denoiser pass (canvas 256 queries over [cache ‖ canvas], 16 query heads) for caches of 1k-32k
slots, on local layers (8 KV heads, head dim 256, window 1024: the last 1023 cache slots) and global layers
(2 KV heads, head dim 512, whole cache); plus a causal prefill. Implementations: the Pallas kernel with the
structured mask, the model's XLA attention with the dense mask, and `jax.nn.dot_product_attention`
(cuDNN) with the same dense mask (and, where every key is visible, without one).
MoE: 128 experts, top-8, width 2816 -> 704: the fused gate/up grouped matmul [M, 2816] x [128, 2816, 1408],
the down one [M, 704] x [128, 704, 2816], and the whole expert branch; Pallas `gmm` against `lax.ragged_dot`.

TFLOP/s count useful work only (keys the mask lets each query see; each token's own top-8 experts), the same
count for every implementation, so the numbers compare directly; "% peak" is against the H200's dense bf16
peak (989 TFLOP/s; --peak_tflops to change). "max |Δ|" is the largest difference from the XLA path: the first
GPU run doubles as a check of the Triton-compiled kernels. Backward timings ("fwd+bwd") use 3.5x (attention)
and 3x (matmul) the forward FLOPs.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dgemma.model.attention import dot_product_attention  # noqa: E402
from dgemma.model.layers import experts_ragged_dot  # noqa: E402
from pallas_kernels.attention import AttentionMask, BlockSizes, attention  # noqa: E402
from pallas_kernels.moe import GmmTiling, gmm, moe_experts  # noqa: E402

H200_BF16_PEAK_TFLOPS = 989.0  # dense (no sparsity), SXM


def _time(fn, *args, warmup: int, iters: int) -> float:
  """Median wall time in ms of a jitted call (compiled and warmed up first)."""
  for _ in range(warmup):
    jax.block_until_ready(fn(*args))
  times = []
  for _ in range(iters):
    t0 = time.perf_counter()
    jax.block_until_ready(fn(*args))
    times.append(time.perf_counter() - t0)
  return 1e3 * statistics.median(times)


def _max_diff(a, b) -> float:
  leaves = zip(jax.tree_util.tree_leaves(a), jax.tree_util.tree_leaves(b))
  return max(float(jnp.max(jnp.abs(x.astype(jnp.float32) - y.astype(jnp.float32)))) for x, y in leaves)


class Table:
  def __init__(self, peak_tflops: float):
    self.peak = peak_tflops
    self.rows = ["| case | implementation | pass | ms | TFLOP/s | % peak | max abs diff vs XLA |",
                 "|---|---|---|---:|---:|---:|---:|"]

  def add(self, case, impl, which, ms, flops, diff):
    if ms is None:
      self.rows.append(f"| {case} | {impl} | {which} | n/a | | | {diff} |")
    else:
      tflops = flops / (ms * 1e-3) / 1e12
      diff_s = "" if diff is None else f"{diff:.2e}"
      self.rows.append(f"| {case} | {impl} | {which} | {ms:.3f} | {tflops:.3g} | {100 * tflops / self.peak:.3g}% "
                       f"| {diff_s} |")
    print(self.rows[-1], flush=True)


def _fwd_and_bwd(fn):
  """(jitted forward, jitted forward+backward) of fn(q, k, v)."""
  def loss(q, k, v, ct):
    out, vjp = jax.vjp(fn, q, k, v)
    return out, vjp(ct)
  return jax.jit(fn), jax.jit(loss)


def bench_attention(table: Table, *, batch, canvas, caches, heads, kinds, prefill_lengths, dtype, block_sizes,
                    warmup, iters, on_gpu):
  rng = np.random.default_rng(0)
  for kind, (kv_heads, head_dim, window) in kinds.items():
    cases = [("denoiser", s) for s in caches] + [("prefill", s) for s in prefill_lengths]
    for mode, length in cases:
      if mode == "denoiser":
        t, s = canvas, length + canvas
        mask = AttentionMask.denoiser(jnp.full((batch,), length, jnp.int32), jnp.ones((batch, length), bool),
                                      canvas, window)
        visible_per_query = np.full(t, min(window - 1, length) if window else length) + canvas
      else:
        t, s = length, length
        mask = AttentionMask.causal(jnp.broadcast_to(jnp.arange(length), (batch, length)),
                                    jnp.ones((batch, length), bool), window)
        q_pos = np.arange(length)
        visible_per_query = q_pos + 1 if window is None else np.minimum(q_pos + 1, window)
      scale = head_dim ** -0.25  # attention scale is 1.0: keep the logits O(1)
      q = jnp.asarray(rng.normal(size=(batch, t, heads, head_dim)) * scale, dtype)
      k = jnp.asarray(rng.normal(size=(batch, s, kv_heads, head_dim)) * scale, dtype)
      v = jnp.asarray(rng.normal(size=(batch, s, kv_heads, head_dim)), dtype)
      ct = jnp.asarray(rng.normal(size=q.shape), dtype)
      dense = mask.dense()
      fwd_flops = 4.0 * batch * heads * head_dim * float(visible_per_query.sum())
      case = f"attn {mode} {kind} H={head_dim} K={kv_heads} T={t} S={s}"

      impls = {  # the XLA path first: it is the reference of the difference column
          "xla (model)": lambda q, k, v: dot_product_attention(q, k, v, dense),
          "pallas": lambda q, k, v: attention(q, k, v, mask, block_sizes=block_sizes),
      }
      if on_gpu:
        impls["cudnn (dense mask)"] = lambda q, k, v: jax.nn.dot_product_attention(
            q, k, v, mask=dense[:, None], scale=1.0, implementation="cudnn")
        if mode == "denoiser" and window is None:  # every key is visible: cuDNN's best case, no mask at all
          impls["cudnn (no mask)"] = lambda q, k, v: jax.nn.dot_product_attention(
              q, k, v, scale=1.0, implementation="cudnn")
      reference = {}
      for name, fn in impls.items():
        fwd, fwd_bwd = _fwd_and_bwd(fn)
        for which, call, args, flops in [("fwd", fwd, (q, k, v), fwd_flops),
                                         ("fwd+bwd", fwd_bwd, (q, k, v, ct), 3.5 * fwd_flops)]:
          try:
            result = call(*args)
          except Exception as e:  # cuDNN rejects some shapes (e.g. head dim 512): report them, keep going
            if not name.startswith("cudnn"):
              raise
            table.add(case, name, which, None, flops, f"unsupported: {type(e).__name__}: {str(e)[:80]}")
            continue
          diff = None if name.startswith("xla") else _max_diff(result, reference[which])
          reference.setdefault(which, result)
          table.add(case, name, which, _time(call, *args, warmup=warmup, iters=iters), flops, diff)


def _routing(rng, tokens, num_experts, top_k):
  experts = np.stack([rng.choice(num_experts, size=top_k, replace=False) for _ in range(tokens)])
  weights = rng.random((tokens, top_k))
  return jnp.asarray(weights / weights.sum(1, keepdims=True), jnp.float32), jnp.asarray(experts, jnp.int32)


def bench_moe(table: Table, *, token_counts, num_experts, top_k, width, hidden, dtype, tiling, warmup, iters):
  rng = np.random.default_rng(1)
  gate_up = jnp.asarray(rng.normal(size=(num_experts, width, 2 * hidden)) * width ** -0.5, dtype)
  down = jnp.asarray(rng.normal(size=(num_experts, hidden, width)) * hidden ** -0.5, dtype)
  for tokens in token_counts:
    m = tokens * top_k
    weights, experts = _routing(rng, tokens, num_experts, top_k)
    group_sizes = jnp.bincount(experts.reshape(-1), length=num_experts).astype(jnp.int32)
    x = jnp.asarray(rng.normal(size=(tokens, width)), dtype)
    for name, lhs_dim, rhs in [("gate/up", width, gate_up), ("down", hidden, down)]:
      lhs = jnp.asarray(rng.normal(size=(m, lhs_dim)), dtype)
      ct = jnp.asarray(rng.normal(size=(m, rhs.shape[2])), dtype)
      flops = 2.0 * m * rhs.shape[1] * rhs.shape[2]
      case = f"gmm {name} M={m} [{m},{rhs.shape[1]}]x[{num_experts},{rhs.shape[1]},{rhs.shape[2]}]"
      reference = {}
      for impl, fn in [("xla ragged_dot", lambda a, b: jax.lax.ragged_dot(a, b, group_sizes)),
                       ("pallas gmm", lambda a, b: gmm(a, b, group_sizes, tiling=tiling))]:
        fwd = jax.jit(fn)
        fwd_bwd = jax.jit(lambda a, b, ct, fn=fn: (lambda out, vjp: (out, vjp(ct)))(*jax.vjp(fn, a, b)))
        for which, call, args, f in [("fwd", fwd, (lhs, rhs), flops), ("fwd+bwd", fwd_bwd, (lhs, rhs, ct), 3 * flops)]:
          result = call(*args)
          diff = None if impl.startswith("xla") else _max_diff(result, reference[which])
          reference.setdefault(which, result)
          table.add(case, impl, which, _time(call, *args, warmup=warmup, iters=iters), f, diff)
    flops = 2.0 * tokens * top_k * (width * 2 * hidden + hidden * width)
    case = f"moe experts T={tokens} top-{top_k} of {num_experts}, {width}->{hidden}"
    ct = jnp.asarray(rng.normal(size=x.shape), dtype)
    reference = {}
    for impl, fn in [("xla (model)", experts_ragged_dot),
                     ("pallas", lambda *a: moe_experts(*a, tiling=tiling))]:
      run = lambda x, gu, dn, fn=fn: fn(x, weights, experts, gu, dn)
      fwd = jax.jit(run)
      fwd_bwd = jax.jit(lambda x, gu, dn, ct, run=run: (lambda out, vjp: (out, vjp(ct)))(*jax.vjp(run, x, gu, dn)))
      for which, call, args, f in [("fwd", fwd, (x, gate_up, down), flops),
                                   ("fwd+bwd", fwd_bwd, (x, gate_up, down, ct), 3 * flops)]:
        result = call(*args)
        diff = None if impl.startswith("xla") else _max_diff(result, reference[which])
        reference.setdefault(which, result)
        table.add(case, impl, which, _time(call, *args, warmup=warmup, iters=iters), f, diff)


def main(argv=None):
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--tiny", action="store_true", help="tiny shapes (interpret mode off GPU): a smoke test")
  parser.add_argument("--iters", type=int, default=None)
  parser.add_argument("--warmup", type=int, default=None)
  parser.add_argument("--batch", type=int, default=1)
  parser.add_argument("--peak_tflops", type=float, default=H200_BF16_PEAK_TFLOPS)
  parser.add_argument("--skip_attention", action="store_true")
  parser.add_argument("--skip_moe", action="store_true")
  parser.add_argument("--block_q", type=int, default=None, help="attention tiles (default: per head dim)")
  parser.add_argument("--block_k", type=int, default=None)
  parser.add_argument("--block_m", type=int, default=None, help="gmm tiles (default: GmmTiling())")
  parser.add_argument("--out", default=None, help="also write the Markdown table here")
  args = parser.parse_args(argv)

  on_gpu = jax.default_backend() == "gpu"
  devices = ", ".join(d.device_kind for d in jax.devices())
  print(f"jax {jax.__version__}, backend {jax.default_backend()} ({devices}); "
        f"{'Triton-compiled kernels' if on_gpu else 'Pallas interpret mode (no GPU)'}\n", flush=True)
  if not on_gpu and not args.tiny:
    parser.error("no GPU: the real shapes would take hours in interpret mode; use --tiny")
  warmup = args.warmup if args.warmup is not None else (1 if args.tiny else 3)
  iters = args.iters if args.iters is not None else (1 if args.tiny else 20)
  block_sizes = None
  if args.block_q or args.block_k:
    base = BlockSizes()
    block_sizes = BlockSizes(block_q=args.block_q or base.block_q, block_k=args.block_k or base.block_k)
  tiling = GmmTiling(block_m=args.block_m) if args.block_m else None

  table = Table(args.peak_tflops)
  print("\n".join(table.rows), flush=True)
  if args.tiny:
    attn = dict(canvas=8, caches=(16, 40), heads=4, prefill_lengths=(24,), dtype=jnp.float32,
                kinds={"local": (2, 8, 6), "global": (1, 16, None)})
    moe = dict(token_counts=(16,), num_experts=8, top_k=2, width=32, hidden=16, dtype=jnp.float32)
  else:
    attn = dict(canvas=256, caches=(1024, 4096, 16384, 32768), heads=16, prefill_lengths=(4096,),
                dtype=jnp.bfloat16, kinds={"local": (8, 256, 1024), "global": (2, 512, None)})
    moe = dict(token_counts=(256, 4096), num_experts=128, top_k=8, width=2816, hidden=704, dtype=jnp.bfloat16)
  if not args.skip_attention:
    bench_attention(table, batch=args.batch, block_sizes=block_sizes, warmup=warmup, iters=iters, on_gpu=on_gpu,
                    **attn)
  if not args.skip_moe:
    bench_moe(table, tiling=tiling, warmup=warmup, iters=iters, **moe)
  if args.out:
    with open(args.out, "w") as f:
      f.write("\n".join(table.rows) + "\n")


if __name__ == "__main__":
  main()
