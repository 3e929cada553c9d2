"""What sample.py --stream costs: one checkpoint's sampler compiled without the host callback, with a no-op
callback (the device-to-host copy of each step's [B, C] canvas and the wait for the host), and with the live view
(streaming.LiveCanvas, written as plain text to /dev/null: the per-step decode and write of a terminal redraw).

    python scripts/init_model.py --config=configs/text.py:tokenizer=bytes --out=/tmp/text_small  # size=small, bytes
    python scripts/bench_stream.py --ckpt=/tmp/text_small --json_out=docs/results/stream_cost_cpu.json

The three are run in turn, --repeats times each after one warm-up, with the same prompt and seed (so the same
steps); reported: the median wall time of one completion, denoising steps (loop iterations) per completion and
steps per second.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import numpy as np  # noqa: E402

from dgemma import loading, tasks  # noqa: E402
from dgemma.sampling import SamplerConfig, compile_generate  # noqa: E402
from dgemma.sampling.streaming import LiveCanvas  # noqa: E402


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--ckpt", required=True)
  parser.add_argument("--prompt", default="def mean(values):\n    \"\"\"Return the arithmetic mean.\"\"\"\n")
  parser.add_argument("--repeats", type=int, default=5)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--json_out", default=None)
  args = parser.parse_args()
  config, params, metadata = loading.load_model(args.ckpt)
  task = tasks.for_checkpoint(config, metadata, args.ckpt)
  tokens, valid = task.encode(np.array([args.prompt], dtype=object))
  sampler = task.sampler(SamplerConfig())
  config = task.config
  resolved = sampler.resolve(config)
  key = jax.random.key(args.seed)
  steps_seen = []
  devnull = open(os.devnull, "w")
  variants = {
      "off": None,
      "noop_callback": lambda i, s, a, r: steps_seen.append(1),
      "live_view": LiveCanvas(task.token_text, resolved.num_canvases(resolved.canvas_length),
                              resolved.max_denoising_steps, row=0, stream=devnull, animate=False),
  }
  compiled, compile_s = {}, {}
  for name, on_step in variants.items():
    compiled[name], compile_s[name] = compile_generate(params, config, tokens, valid, key, sampler,
                                                       position_features=metadata.get("position_features"),
                                                       on_step=on_step)
  times = {name: [] for name in variants}
  outputs = {}
  for repeat in range(args.repeats + 1):  # the first round is a warm-up
    for name, run in compiled.items():
      if name == "live_view":
        variants[name].reset(0)
      start = time.perf_counter()
      out = jax.block_until_ready(run(tokens, valid, key))
      seconds = time.perf_counter() - start
      if repeat:
        times[name].append(seconds)
      outputs[name] = np.asarray(out.tokens)
  same = all(np.array_equal(outputs["off"], o) for o in outputs.values())
  steps = int(np.asarray(out.steps_per_canvas).sum())
  rows = {}
  for name in variants:
    median = statistics.median(times[name])
    rows[name] = {"median_s": median, "min_s": min(times[name]), "times_s": times[name],
                  "steps_per_s": steps / median, "compile_s": compile_s[name]}
  base = rows["off"]["median_s"]
  for name, row in rows.items():
    row["overhead_vs_off"] = row["median_s"] / base - 1
    row["overhead_ms_per_step"] = (row["median_s"] - base) / steps * 1e3
    print(f"{name:14s} {row['median_s'] * 1e3:8.1f} ms per completion  {row['steps_per_s']:7.1f} steps/s  "
          f"overhead {row['overhead_vs_off']:+.1%} ({row['overhead_ms_per_step']:+.2f} ms/step)")
  print(f"steps per completion {steps}; same tokens in all three: {same}")
  result = {"ckpt": args.ckpt, "model": {k: getattr(config, k) for k in ("vocab_size", "width", "num_layers",
                                                                          "num_heads", "canvas_length")},
            "prompt_tokens": int(valid.sum()), "canvases": resolved.num_canvases(resolved.canvas_length),
            "max_denoising_steps": resolved.max_denoising_steps, "steps_per_completion": steps,
            "repeats": args.repeats, "same_tokens": same, "variants": rows,
            "machine": {"processor": platform.processor() or platform.machine(), "cpus": os.cpu_count(),
                        "jax": jax.__version__, "backend": jax.default_backend()},
            "command": " ".join(["python", *sys.argv])}
  if args.json_out:
    with open(args.json_out, "w") as f:
      json.dump(result, f, indent=2)
    print(f"wrote {args.json_out}")
  return 0 if same else 1


if __name__ == "__main__":
  sys.exit(main())
