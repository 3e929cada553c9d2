"""Completions at batch 1: a diffusion text checkpoint against its autoregressive twin (docs/text.md).

  python scripts/bench_text_decoding.py --diffusion=DIR/model --ar=DIR_AR/model --data=data/stdlib_code/test.jsonl
      [--num=20] [--show=3] [--seed=0] [--json_out=F]

For each of the first --num prompts of --data (read as the checkpoint's training data was, in file order), one
prompt at a time (batch 1), each model completes it with its own decoder and its recorded defaults: the diffusion
model with the block-diffusion sampler (adaptive stop, so the denoising steps per canvas vary), the AR twin with
greedy decoding, one encoder pass per token; both stop at the model's stop ids, at most the canvases the
checkpoint trained with. Reported per model: the wall time per completion (each call compiled beforehand and ended
by block_until_ready), tokens per completion, and for diffusion the denoising steps per canvas. To compare at the
same length, the AR twin is also timed decoding exactly the tokens the diffusion model produced for the prompt
(no early stop). The first --show completions of each are printed unedited.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))  # scripts/, for eval_text

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402

FLAGS = flags.FlagValues()
_D = dict(flag_values=FLAGS)
flags.DEFINE_string("diffusion", None, "A diffusion text checkpoint (exported model/ or a training workdir).", **_D)
flags.DEFINE_string("ar", None, "Its objective=ar twin (same task and tokenizer).", **_D)
flags.DEFINE_string("data", None, "Prompts: a file in a format the text task reads (its responses are ignored).",
                    **_D)
flags.DEFINE_integer("num", 20, "Prompts to complete (the first ones of --data).", **_D)
flags.DEFINE_integer("show", 3, "Completions of each model to print.", **_D)
flags.DEFINE_integer("seed", 0, "Random seed of the diffusion sampler.", **_D)
flags.DEFINE_string("json_out", None, "Also write the numbers and the shown completions to this JSON file.", **_D)


def _load_text(path: str):
  from dgemma import tasks
  from dgemma.loading import load_model
  if not os.path.exists(path):
    raise ValueError(f"checkpoint {path} does not exist")
  config, params, metadata = load_model(path)
  task = tasks.for_checkpoint(config, metadata, path)
  if task is None or task.name != "text":
    raise ValueError(f"{path} is not a text checkpoint (task 'text')")
  return task, params, metadata


def _prompts(task, metadata: dict, path: str, num: int):
  """The first `num` prompts of `path` as [1, P] rows, read as the checkpoint's training data was."""
  from dgemma.tasks.text import likelihood
  import eval_text  # scripts/: the data settings the checkpoint trained with
  rows = []
  for batch in likelihood.batches(task.encoder(eval_text.data_config(metadata, os.path.abspath(path))), 1, num):
    prompt = batch["prompt"][:1]
    rows.append((prompt, prompt != task.config.pad_id))
  if not rows:
    raise ValueError(f"{path} holds no usable example")
  return rows


def _timed(fn, *args):
  import jax
  start = time.perf_counter()
  out = jax.block_until_ready(fn(*args))
  return out, time.perf_counter() - start


def _text(task, tokens) -> str:
  return str(task.decode(tokens[None])[0])


def run() -> int:
  import jax
  import numpy as np

  from dgemma.sampling import config as sampler_lib
  from dgemma.sampling.autoregressive import ARConfig, compile_autoregressive
  from dgemma.sampling.generate import compile_generate

  for name in ("diffusion", "ar", "data"):
    if not FLAGS[name].value:
      raise ValueError(f"--{name} is required")
  if FLAGS.num < 1:
    raise ValueError(f"--num must be >= 1, got {FLAGS.num}")
  if FLAGS.json_out:
    cli.check_output_path(FLAGS.json_out, "--json_out")
  d_task, d_params, d_meta = _load_text(FLAGS.diffusion)
  a_task, a_params, a_meta = _load_text(FLAGS.ar)
  features = d_meta.get("position_features")
  sampler = d_task.sampler(sampler_lib.sampler_config(
      d_meta, self_conditioning=sampler_lib.self_conditioning_for(d_meta)))
  capacity = sampler.max_new_tokens
  if not os.path.exists(FLAGS.data):
    raise ValueError(f"--data={FLAGS.data} does not exist")
  prompts = _prompts(d_task, d_meta, FLAGS.data, FLAGS.num)
  key = jax.random.key(cli.check_seed(FLAGS.seed))
  tokens0, valid0 = prompts[0]
  diffuse, _ = compile_generate(d_params, d_task.config, tokens0, valid0, key, sampler, position_features=features)
  ar_natural, _ = compile_autoregressive(a_params, a_task.config, tokens0, valid0, key,
                                         ARConfig(max_new_tokens=capacity), position_features=features)
  ar_fixed = {}  # exact-length AR decoders, one compiled program per length
  rows = []
  for i, (tokens, valid) in enumerate(prompts):
    d_out, d_s = _timed(diffuse, tokens, valid, key)
    d_tokens = np.asarray(d_out.tokens)[0]
    steps = [int(s) for s in np.asarray(d_out.steps_per_canvas)[0] if s]
    a_out, a_s = _timed(ar_natural, tokens, valid, key)
    a_tokens = np.asarray(a_out.tokens)[0]
    n_d = int((d_tokens != d_task.config.pad_id).sum())
    n_a = int((a_tokens != a_task.config.pad_id).sum())
    if n_d not in ar_fixed:
      ar_fixed[n_d] = compile_autoregressive(a_params, a_task.config, tokens, valid, key,
                                             ARConfig(max_new_tokens=max(n_d, 1), stop_ids=()),
                                             position_features=features)[0]
      _timed(ar_fixed[n_d], tokens, valid, key)  # first call: warm-up
    _, a_same_s = _timed(ar_fixed[n_d], tokens, valid, key)
    rows.append(dict(diffusion_s=d_s, diffusion_tokens=n_d, steps_per_canvas=steps, ar_s=a_s, ar_tokens=n_a,
                     ar_same_length_s=a_same_s,
                     diffusion_text=_text(d_task, d_tokens), ar_text=_text(a_task, a_tokens)))
    print(f"prompt {i + 1}/{len(prompts)}: diffusion {d_s:.2f} s, {n_d} tokens, steps per canvas {steps} | "
          f"AR {a_s:.2f} s, {n_a} tokens | AR at diffusion's length {a_same_s:.2f} s", flush=True)

  def median(key_):
    return statistics.median(r[key_] for r in rows)

  all_steps = [s for r in rows for s in r["steps_per_canvas"]]
  summary = dict(
      prompts=len(rows), data=os.path.abspath(FLAGS.data), canvas_length=sampler.canvas_length,
      max_new_tokens=capacity, max_denoising_steps=sampler.max_denoising_steps,
      diffusion_s_median=median("diffusion_s"), ar_s_median=median("ar_s"),
      ar_same_length_s_median=median("ar_same_length_s"),
      diffusion_tokens_median=median("diffusion_tokens"), ar_tokens_median=median("ar_tokens"),
      steps_per_canvas_mean=sum(all_steps) / len(all_steps), steps_per_canvas_max=max(all_steps),
      diffusion_tokens_per_s=sum(r["diffusion_tokens"] for r in rows) / sum(r["diffusion_s"] for r in rows),
      ar_tokens_per_s=sum(r["ar_tokens"] for r in rows) / sum(r["ar_s"] for r in rows))
  print(f"--- {len(rows)} prompts at batch 1 · medians: diffusion {summary['diffusion_s_median']:.2f} s "
        f"({summary['diffusion_tokens_median']} tokens, {summary['steps_per_canvas_mean']:.1f} steps per canvas "
        f"on average, max {summary['steps_per_canvas_max']}) · AR {summary['ar_s_median']:.2f} s "
        f"({summary['ar_tokens_median']} tokens) · AR at diffusion's length {summary['ar_same_length_s_median']:.2f} s")
  for i, r in enumerate(rows[:FLAGS.show]):
    print(f"\n=== completion {i + 1}, diffusion ({r['diffusion_tokens']} tokens, steps {r['steps_per_canvas']}):\n"
          f"{r['diffusion_text']}\n=== completion {i + 1}, AR ({r['ar_tokens']} tokens):\n{r['ar_text']}")
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(dict(summary=summary, diffusion=os.path.abspath(FLAGS.diffusion), ar=os.path.abspath(FLAGS.ar),
                     seed=FLAGS.seed, per_prompt=rows), f, indent=1)
      f.write("\n")
  return 0


def main(argv: list[str]) -> int:
  return cli.run_main(argv, __doc__, run, FLAGS)


if __name__ == "__main__":
  cli.exit(main(sys.argv))
