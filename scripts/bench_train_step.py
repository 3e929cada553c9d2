"""Times one training step of a config: the question to ask before sizing a run to the hour.

    python scripts/bench_train_step.py --config=configs/sft_sudoku.py                      # the CPU default
    python scripts/bench_train_step.py --config=configs/sft_sudoku.py --config.model.mlp_hidden=384
    python scripts/bench_train_step.py --config=configs/sft_sudoku.py --profile              # where the time goes

It builds the model, data and jitted train step exactly as train.py does (one device, no mesh), compiles the
step, draws `--steps` real batches up front (so the data pipeline does not share the timed window) and reports
the median and fastest step, examples/s, XLA's own FLOP count of the step and the rate it ran at.

`--profile` (XLA:CPU only) also traces three steps and sums the time of XLA's compiled operations by kind
(matrix-multiply fusions, element-wise fusions, ...) and how much of the traced time 0, 1 or 2+ of XLA's
compute threads were busy: on a 2-core CPU the element-wise fusions run on one thread, so that share is what
more cores cannot buy back.
"""

from __future__ import annotations

import collections
import glob
import gzip
import json
import os
import re
import statistics
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
from absl import flags  # noqa: E402
from ml_collections import config_flags  # noqa: E402

import train as train_lib  # noqa: E402  # the repository's train.py: the model, data and step a run uses
from dgemma import cli  # noqa: E402
from dgemma.cpu import huge_pages  # noqa: E402
from dgemma.diffusion.config import ObjectiveConfig  # noqa: E402
from dgemma.training import optimizer, state as state_lib  # noqa: E402

FLAGS = flags.FlagValues()  # private: this module can be imported next to train.py and other scripts
_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py[:args]).",
                                          flag_values=FLAGS)
_STEPS = flags.DEFINE_integer("steps", 10, "Timed steps (after one compile-and-warm-up step).", flag_values=FLAGS)
_PROFILE = flags.DEFINE_bool("profile", False, "Also trace 3 steps and print where XLA:CPU spends the time.",
                             flag_values=FLAGS)


def time_train_step(c, steps: int) -> dict:
  """Compiles the config's train step and times `steps` calls on real batches; returns the numbers."""
  if steps < 1:
    raise ValueError(f"--steps must be >= 1, got {steps}")
  config, params, _ = train_lib.build_model(c)
  dataset, _ = train_lib.build_data(c, config)
  batches = iter(dataset)
  tx = optimizer.make_optimizer(c.optimizer)
  state = state_lib.create(params, tx, c.lora_rank, jax.random.key(c.seed + 1), c.optimizer.master_dtype)
  step = state_lib.make_train_step(config, ObjectiveConfig.from_config(c.diffusion), tx, c.seed,
                                   position_features=c.get("position_features"))
  first = next(batches)
  t0 = time.perf_counter()
  compiled = step.lower(state, first).compile()
  compile_s = time.perf_counter() - t0
  cost = compiled.cost_analysis()
  cost = cost[0] if isinstance(cost, (list, tuple)) else cost
  flops = float((cost or {}).get("flops", 0.0))
  state, metrics = step(state, first)
  jax.block_until_ready(metrics)
  timed = [next(batches) for _ in range(steps)]
  times = []
  for batch in timed:
    t0 = time.perf_counter()
    state, metrics = step(state, batch)
    jax.block_until_ready(metrics)
    times.append(time.perf_counter() - t0)
  median = statistics.median(times)
  return dict(step=step, state=state, batches=batches, compile_s=compile_s, flops=flops, median_s=median,
              min_s=min(times), examples_per_s=c.batch_size / median,
              gflops_per_s=flops / median / 1e9 if flops else float("nan"))


def _merged(intervals: list[tuple[float, float]]) -> list[tuple[float, float]]:
  """One thread's busy time as disjoint intervals (an event nested in another counts once)."""
  out: list[list[float]] = []
  for start, end in sorted(intervals):
    if out and start <= out[-1][1]:
      out[-1][1] = max(out[-1][1], end)
    else:
      out.append([start, end])
  return [(start, end) for start, end in out]


def profile_steps(r: dict, num_steps: int = 3) -> tuple[list[tuple[str, float, float]], dict[int, float]]:
  """Traces `num_steps` more steps of a `time_train_step` result and returns `profile_summary` of them."""
  state, batches = r["state"], r["batches"]
  with tempfile.TemporaryDirectory() as trace_dir:
    jax.profiler.start_trace(trace_dir, create_perfetto_trace=True)
    for _ in range(num_steps):
      state, metrics = r["step"](state, next(batches))
      jax.block_until_ready(metrics)
    jax.profiler.stop_trace()
    return profile_summary(trace_dir, num_steps)


def profile_summary(trace_dir: str, num_steps: int) -> tuple[list[tuple[str, float, float]], dict[int, float]]:
  """(kind, ms per step, share of the compute threads' time) by op kind, and {busy threads: share of time}."""
  files = sorted(glob.glob(os.path.join(trace_dir, "plugins", "profile", "*", "perfetto_trace.json.gz")))
  if not files:
    raise RuntimeError(f"no perfetto trace under {trace_dir}: this JAX wrote none")
  with gzip.open(files[-1]) as f:
    trace = json.load(f)
  events = trace["traceEvents"] if isinstance(trace, dict) else trace
  names = {(e["pid"], e["tid"]): e["args"]["name"] for e in events
           if e.get("ph") == "M" and e.get("name") == "thread_name"}
  by_kind, spans = collections.Counter(), collections.defaultdict(list)
  for e in events:  # XLA's compute threads; the executor's own bookkeeping events are not work
    thread = names.get((e.get("pid"), e.get("tid")), "")
    if e.get("ph") != "X" or "XLAEigen" not in thread or e["name"].startswith(("ThunkExecutor", "Slinky")):
      continue
    by_kind[re.sub(r"[.\d]+$", "", e["name"])] += e["dur"]
    spans[thread].append((e["ts"], e["ts"] + e["dur"]))
  if not by_kind:
    raise RuntimeError("the trace holds no XLA:CPU compute-thread events (is this a CPU run?)")
  total = sum(by_kind.values())
  kinds = [(kind, us / 1e3 / num_steps, us / total) for kind, us in by_kind.most_common()]
  edges = sorted(edge for v in spans.values() for start, end in _merged(v) for edge in ((start, 1), (end, -1)))
  busy, level, previous = collections.Counter(), 0, edges[0][0]
  for at, change in edges:  # time spent at each number of busy threads
    busy[min(level, 2)] += at - previous
    level, previous = level + change, at
  span = sum(busy.values())
  return kinds, {k: v / span for k, v in sorted(busy.items())}


def run() -> None:
  c = _CONFIG.value
  if c is None:
    raise ValueError("--config is required, e.g. --config=configs/sft_sudoku.py")
  r = time_train_step(c, _STEPS.value)
  print(f"{jax.devices()[0].device_kind}: batch {c.batch_size}, compile {r['compile_s']:.1f} s")
  print(f"step: median {1e3 * r['median_s']:.0f} ms, fastest {1e3 * r['min_s']:.0f} ms over {_STEPS.value} steps; "
        f"{r['examples_per_s']:.1f} examples/s; {r['flops'] / 1e9:.1f} GFLOP per step (XLA's count) at "
        f"{r['gflops_per_s']:.1f} GFLOP/s; {c.num_train_steps} steps would take "
        f"{c.num_train_steps * r['median_s'] / 60:.1f} min")
  if not _PROFILE.value:
    return
  if jax.default_backend() != "cpu":
    raise ValueError("--profile reads XLA:CPU's trace; on GPUs use jax.profiler with TensorBoard / XProf")
  kinds, busy = profile_steps(r)
  print("compute threads busy (share of the traced time): " +
        ", ".join(f"{'2+' if k == 2 else k}: {100 * v:.0f}%" for k, v in busy.items()))
  print("| XLA operation kind | ms per step (summed over threads) | share |\n|---|---|---|")
  for kind, ms, share in kinds[:15]:
    print(f"| {kind} | {ms:.1f} | {100 * share:.1f}% |")


def main(argv: list[str]) -> int:
  """Runs with command-line `argv`; bad input prints one `error:` line and returns a non-zero code."""
  try:
    return cli.run_main(argv, __doc__, run, FLAGS)
  except AttributeError as e:  # ml_collections: an override names a key the config does not have
    print(f"error: unknown config key {str(e).strip(chr(34))} in a --config override", file=sys.stderr)
    return 2


if __name__ == "__main__":
  huge_pages.restart_with_huge_pages()  # as train.py (dgemma/cpu/huge_pages.py)
  sys.exit(main(sys.argv))
