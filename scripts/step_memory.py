"""The memory of one training step of Gemma 3 270M (262k vocabulary), with and without the chunked losses.

    python scripts/step_memory.py                                    # compile only: XLA's planned memory, ~minutes
    python scripts/step_memory.py --chunks=0,256,1024 --accum=1,2 --json_out=docs/results/gemma3_270m_step_memory.json
    python scripts/step_memory.py --chunks=256 --accum=1 --run       # one real step (random weights): max RSS

The step is configs/text.py:init=gemma3_270m's (diffusion objective, self-conditioning on half the rows, AdamW,
float32 weights and optimizer state, every block rematerialised), full fine-tuning, at --batch rows of
--prompt_len prompt tokens and one canvas of --canvas_len tokens. For each loss chunk (diffusion.loss_chunk_tokens;
0: the whole [B, T, V] logits) and each gradient accumulation, the step is compiled from abstract shapes (no
weights are made) and XLA's memory analysis reported: arguments (the train state and batch), outputs, temporaries,
and their sum less what the donated state aliases: the planned peak of the step's buffers. --run makes random
weights of the same shapes (not the GGUF's: the memory is the same), runs one step of each (chunk, accumulation)
named, which must be one, and reports the process's maximum resident set size (the weights' creation included).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402

from dgemma import cli, model  # noqa: E402
from dgemma.config import PRESETS  # noqa: E402
from dgemma.diffusion.config import ObjectiveConfig  # noqa: E402
from dgemma.training import optimizer, state as state_lib  # noqa: E402

GIB = 2 ** 30


def _ints(text: str, name: str) -> list[int]:
  try:
    values = [int(v) for v in text.split(",") if v.strip()]
  except ValueError:
    raise ValueError(f"--{name} must be comma-separated integers, got {text!r}") from None
  if not values:
    raise ValueError(f"--{name} names no value")
  return values


def step_setup(args, chunk: int, accum: int):
  """(jitted train step, model config, abstract state, abstract batch) of one variant."""
  from configs import text as text_config  # the recipe's optimizer and objective
  c = text_config.get_config("size=debug,tokenizer=bytes")  # (the sections below do not depend on the size or the weights)
  overrides = dict(canvas_length=args.canvas_len, remat=True)
  if args.vocab_size:
    overrides["vocab_size"] = args.vocab_size
  config = PRESETS[args.model](**overrides)
  objective = ObjectiveConfig.from_config(c.diffusion).replace(loss_chunk_tokens=chunk)
  c.optimizer.update(dict(learning_rate=1e-4, end_learning_rate=1e-5, warmup_steps=100, decay_steps=1000))
  tx = optimizer.make_optimizer(c.optimizer)
  params = model.param_shapes(config)
  state = jax.eval_shape(lambda p: state_lib.create(p, tx, 0, jax.random.key(1), c.optimizer.master_dtype), params)
  b = args.batch
  batch = {"prompt": jax.ShapeDtypeStruct((b, args.prompt_len), jnp.int32),
           "canvas": jax.ShapeDtypeStruct((b, args.canvas_len), jnp.int32),
           "canvas_mask": jax.ShapeDtypeStruct((b, args.canvas_len), jnp.bool_)}
  step = state_lib.make_train_step(config, objective, tx, 0, grad_accum_steps=accum)
  return step, config, state, batch, tx, c


def compiled_memory(args, chunk: int, accum: int) -> dict:
  step, config, state, batch, _, _ = step_setup(args, chunk, accum)
  start = time.perf_counter()
  stats = step.lower(state, batch).compile().memory_analysis()
  out = {"loss_chunk_tokens": chunk, "grad_accum_steps": accum,
         "argument_bytes": int(stats.argument_size_in_bytes), "output_bytes": int(stats.output_size_in_bytes),
         "temp_bytes": int(stats.temp_size_in_bytes), "alias_bytes": int(stats.alias_size_in_bytes),
         "compile_seconds": round(time.perf_counter() - start, 1)}
  out["planned_peak_bytes"] = out["argument_bytes"] + out["output_bytes"] + out["temp_bytes"] - out["alias_bytes"]
  out["denoiser_logits_f32_bytes"] = args.batch * args.canvas_len * config.vocab_size * 4  # one [B, C, V] array
  return out


def run_step(args, chunk: int, accum: int) -> dict:
  step, config, abstract_state, _, tx, c = step_setup(args, chunk, accum)
  params = model.init_params(config, jax.random.key(0))  # random weights of the model's shapes and dtypes
  state = state_lib.create(params, tx, 0, jax.random.key(1), c.optimizer.master_dtype)
  del params
  rng = np.random.default_rng(0)
  batch = {"prompt": jnp.asarray(rng.integers(3, config.vocab_size, (args.batch, args.prompt_len)), jnp.int32),
           "canvas": jnp.asarray(rng.integers(3, config.vocab_size, (args.batch, args.canvas_len)), jnp.int32),
           "canvas_mask": jnp.ones((args.batch, args.canvas_len), bool)}
  start = time.perf_counter()
  state, metrics = step(state, batch)
  loss = float(metrics["loss"])
  seconds = time.perf_counter() - start
  return {"loss_chunk_tokens": chunk, "grad_accum_steps": accum, "loss": loss,
          "first_step_seconds_with_compile": round(seconds, 1),
          "max_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def main(argv: list[str]) -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  parser.add_argument("--model", default="gemma3_270m", help=f"a model preset: {sorted(PRESETS)}")
  parser.add_argument("--vocab_size", type=int, default=0, help="override the preset's vocabulary (tests)")
  parser.add_argument("--batch", type=int, default=8)
  parser.add_argument("--prompt_len", type=int, default=256)
  parser.add_argument("--canvas_len", type=int, default=256)
  parser.add_argument("--chunks", default="0,256", help="loss_chunk_tokens values (0: whole logits)")
  parser.add_argument("--accum", default="1", help="grad_accum_steps values")
  parser.add_argument("--run", action="store_true", help="run one step (one chunk, one accumulation) instead")
  parser.add_argument("--json_out", default="")
  args = parser.parse_args(argv[1:])
  try:
    if args.model not in PRESETS:
      raise ValueError(f"unknown --model {args.model!r}; choose from {sorted(PRESETS)}")
    for name in ("batch", "prompt_len", "canvas_len"):
      if getattr(args, name) < 1:
        raise ValueError(f"--{name} must be >= 1, got {getattr(args, name)}")
    chunks, accums = _ints(args.chunks, "chunks"), _ints(args.accum, "accum")
    if any(c < 0 for c in chunks) or any(a < 1 or args.batch % a for a in accums):
      raise ValueError(f"--chunks must be >= 0 and --accum divisors of --batch={args.batch}")
    if args.run and (len(chunks) > 1 or len(accums) > 1):
      raise ValueError("--run measures one step's maximum RSS: name one --chunks value and one --accum value")
    results = []
    for chunk in chunks:
      for accum in accums:
        r = run_step(args, chunk, accum) if args.run else compiled_memory(args, chunk, accum)
        shown = {k: (f"{v / GIB:.2f} GiB" if k.endswith("bytes") else v) for k, v in r.items()}
        print(json.dumps(shown), flush=True)
        results.append(r)
  except ValueError as e:
    print(f"step_memory.py: error: {e}", file=sys.stderr)
    return 1
  if args.json_out:
    record = {"command": "python " + " ".join(["scripts/step_memory.py"] + argv[1:]),
              "what": "compiled memory analysis" if not args.run else "one step run, max RSS",
              "model": args.model, "batch": args.batch, "prompt_len": args.prompt_len, "canvas_len": args.canvas_len,
              "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} CPUs",
              "xla_flags": os.environ.get("XLA_FLAGS", ""), "jax": jax.__version__, "backend": jax.default_backend(),
              "results": results}
    with open(args.json_out, "w") as f:
      json.dump(record, f, indent=1)
  return 0


if __name__ == "__main__":
  cli.exit(main(sys.argv))
