"""Completions at batch 1: a diffusion text checkpoint against its autoregressive twin (docs/text_results.md).

  python scripts/bench_text_decoding.py --diffusion=DIR/model --ar=DIR_AR/model --data=data/stdlib_code/test.jsonl
      [--num=20] [--show=3] [--seed=0] [--steps=N and any other sampler flag] [--python_syntax] [--json_out=F]
      [--ar_temperature=0] [--judge=DIR/model] [--nosame_length]

For each of the first --num prompts of --data (read as the checkpoint's training data was, in file order), one
prompt at a time (batch 1), each model completes it with its own decoder and its recorded defaults: the diffusion
model with the block-diffusion sampler (adaptive stop, so the denoising steps per canvas vary), the AR twin with
greedy decoding (--ar_temperature > 0: sampled), one encoder pass per token; both stop at the model's stop ids, at most the canvases the
checkpoint trained with. Reported per model: the wall time per completion (each call compiled beforehand and ended
by block_until_ready), tokens per completion, and for diffusion the denoising steps per canvas. To compare at the
same length, the AR twin is also timed decoding exactly the tokens the diffusion model produced for the prompt
(no early stop; one compiled program per distinct length, which on a GPU costs more time to compile than the
benchmark takes to run: --nosame_length skips it). The first --show completions of each are printed unedited.
Prompt i's draws come from fold_in(key(--seed), i), so the completions of different prompts do not share their noise.

Two measures of what the completions are worth, both independent of the diffusion model: the AR twin's (or
--judge's) negative log-likelihood of each completion (bits per token, its stop token included; lower: more likely text to the twin;
its own greedy completions are its most likely, so read it across diffusion settings, such as --steps), and with
--python_syntax the share of non-empty completions that make the prompt a function Python parses (`ast.parse` of
the prompt, the body's first-line indentation and the completion: the chat template trims the response, so its
first line comes without its indentation; every test-split reference passes). Sampler flags (--steps, --t_max,
...) change the diffusion sampler's knobs as in sample.py.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root
sys.path.insert(1, os.path.dirname(os.path.abspath(__file__)))  # scripts/, for eval_text

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402
from dgemma.sampling import flags as sampler_flags  # noqa: E402

FLAGS = flags.FlagValues()
_D = dict(flag_values=FLAGS)
flags.DEFINE_string("diffusion", None, "A diffusion text checkpoint (exported model/ or a training workdir).", **_D)
flags.DEFINE_string("ar", None, "Its objective=ar twin (same task and tokenizer).", **_D)
flags.DEFINE_string("data", None, "Prompts: a file in a format the text task reads (its responses are ignored).",
                    **_D)
flags.DEFINE_integer("num", 20, "Prompts to complete (the first ones of --data).", **_D)
flags.DEFINE_integer("show", 3, "Completions of each model to print.", **_D)
flags.DEFINE_integer("seed", 0, "Random seed of the samplers (prompt i: fold_in(key(seed), i)).", **_D)
flags.DEFINE_float("ar_temperature", 0.0, "Temperature of the AR decoder (0: greedy).", **_D)
flags.DEFINE_string("judge", None, "The AR model whose NLL scores every completion, read like --ar (unset: --ar).",
                    **_D)
flags.DEFINE_bool("same_length", True, "Also time the AR twin decoding exactly the diffusion completion's length "
                  "(one compile per distinct length).", **_D)
flags.DEFINE_bool("python_syntax", False, "Also report the share of non-empty completions that parse as Python "
                  "with their prompt (the stdlib code-completion task).", **_D)
flags.DEFINE_string("body_indent", "    ", "--python_syntax: the indentation the completion's first line gets.", **_D)
flags.DEFINE_string("json_out", None, "Also write the numbers and the shown completions to this JSON file.", **_D)
sampler_flags.define(FLAGS, skip=("max_new_tokens", "canvas_length", "stop_ids", "return_trajectory"))


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


def _completion_mask(tokens, stop_ids) -> "np.ndarray":
  """True on a completion's tokens through its first stop id (all of them when it has none)."""
  import numpy as np
  stops = np.flatnonzero(np.isin(tokens, stop_ids))
  end = int(stops[0]) + 1 if stops.size else len(tokens)
  return np.arange(len(tokens)) < end


def _parses(prompt: str, completion: str, indent: str) -> bool:
  """Whether the completion is a body that makes the prompt a function Python parses; an empty one is not (a
  docstring alone parses)."""
  import ast
  if not completion.strip():
    return False
  try:
    ast.parse(prompt + indent + completion)
  except (SyntaxError, ValueError):  # ValueError: a NUL byte in the text
    return False
  return True


def _prompt_texts(path: str, num: int) -> list[str]:
  """The raw prompt strings of the first `num` examples of a prompt/response JSONL file (--python_syntax)."""
  if not path.endswith(".jsonl"):
    raise ValueError(f"--python_syntax reads the prompts' text from a prompt/response .jsonl file, got {path}")
  out = []
  with open(path) as f:
    for number, line in enumerate(f, 1):
      if line.strip() and len(out) < num:
        prompt = json.loads(line).get("prompt")
        if not isinstance(prompt, str):
          raise ValueError(f"--python_syntax: {path}:{number} has no string 'prompt' field")
        out.append(prompt)
  return out


def run() -> int:
  import jax
  import numpy as np

  from dgemma.sampling.autoregressive import ARConfig, compile_autoregressive
  from dgemma.sampling.generate import compile_generate
  from dgemma.tasks.text import likelihood

  for name in ("diffusion", "ar", "data"):
    if not FLAGS[name].value:
      raise ValueError(f"--{name} is required")
  if FLAGS.num < 1:
    raise ValueError(f"--num must be >= 1, got {FLAGS.num}")
  if not FLAGS.ar_temperature >= 0:
    raise ValueError(f"--ar_temperature must be >= 0, got {FLAGS.ar_temperature}")
  if FLAGS.json_out:
    cli.check_output_path(FLAGS.json_out, "--json_out")
  d_task, d_params, d_meta = _load_text(FLAGS.diffusion)
  a_task, a_params, a_meta = _load_text(FLAGS.ar)
  j_task, j_params, j_meta = _load_text(FLAGS.judge) if FLAGS.judge else (a_task, a_params, a_meta)
  features = d_meta.get("position_features")
  sampler = d_task.sampler(sampler_flags.sampler_config(FLAGS, d_meta))
  capacity = sampler.max_new_tokens
  if not os.path.exists(FLAGS.data):
    raise ValueError(f"--data={FLAGS.data} does not exist")
  prompts = _prompts(d_task, d_meta, FLAGS.data, FLAGS.num)
  for other, (o_task, o_meta) in ((FLAGS.ar, (a_task, a_meta)), (FLAGS.judge, (j_task, j_meta))):
    twin_prompts = _prompts(o_task, o_meta, FLAGS.data, FLAGS.num) if other else prompts
    if len(twin_prompts) != len(prompts) or any(
        not np.array_equal(p[0], q[0]) for p, q in zip(prompts, twin_prompts)):
      raise ValueError(f"{other} reads the prompts of --data differently from {FLAGS.diffusion} (another "
                       "tokenizer, chat template or prompt length): it is not the diffusion model's twin")
  prompt_texts = _prompt_texts(FLAGS.data, FLAGS.num) if FLAGS.python_syntax else None
  if prompt_texts is not None and len(prompt_texts) != len(prompts):
    raise ValueError(f"--python_syntax: {FLAGS.data} has {len(prompt_texts)} prompts, the task read {len(prompts)}")
  scorer = likelihood.Scorer(j_task.config, features)
  stop_ids = np.array(j_task.config.stop_ids)

  def twin_bits(tokens, completion, mask):
    """(the twin's NLL of `completion`'s tokens under `mask` after `tokens`, in bits; their count)."""
    batch = dict(prompt=np.asarray(tokens), canvas=completion[None], canvas_mask=mask[None])
    out = likelihood.evaluate(scorer, j_params, [batch], likelihood.Settings(mode="ar"))
    return out["nll_bits_per_token"] * out["num_tokens"], out["num_tokens"]

  key = jax.random.key(cli.check_seed(FLAGS.seed))
  tokens0, valid0 = prompts[0]
  diffuse, _ = compile_generate(d_params, d_task.config, tokens0, valid0, key, sampler, position_features=features)
  ar_natural, _ = compile_autoregressive(a_params, a_task.config, tokens0, valid0, key,
                                         ARConfig(max_new_tokens=capacity, temperature=FLAGS.ar_temperature),
                                         position_features=features)
  ar_fixed = {}  # exact-length AR decoders, one compiled program per length
  rows = []
  for i, (tokens, valid) in enumerate(prompts):
    key_i = jax.random.fold_in(key, i)
    d_out, d_s = _timed(diffuse, tokens, valid, key_i)
    d_tokens = np.asarray(d_out.tokens)[0]
    steps = [int(s) for s in np.asarray(d_out.steps_per_canvas)[0] if s]
    a_out, a_s = _timed(ar_natural, tokens, valid, key_i)
    a_tokens = np.asarray(a_out.tokens)[0]
    n_d = int((d_tokens != d_task.config.pad_id).sum())
    n_a = int((a_tokens != a_task.config.pad_id).sum())
    a_same_s = None
    if FLAGS.same_length:
      if n_d not in ar_fixed:
        ar_fixed[n_d] = compile_autoregressive(a_params, a_task.config, tokens, valid, key,
                                               ARConfig(max_new_tokens=max(n_d, 1), stop_ids=()),
                                               position_features=features)[0]
        _timed(ar_fixed[n_d], tokens, valid, key)  # first call: warm-up
      _, a_same_s = _timed(ar_fixed[n_d], tokens, valid, key)
    d_mask, a_mask = _completion_mask(d_tokens, stop_ids), _completion_mask(a_tokens, stop_ids)
    d_bits, d_scored = twin_bits(tokens, d_tokens, d_mask)
    a_bits, a_scored = twin_bits(tokens, a_tokens, a_mask)
    d_ids, a_ids = [int(t) for t in d_tokens[d_mask]], [int(t) for t in a_tokens[a_mask]]
    row = dict(diffusion_s=d_s, diffusion_tokens=n_d, steps_per_canvas=steps, ar_s=a_s, ar_tokens=n_a,
               ar_same_length_s=a_same_s, diffusion_twin_bits=d_bits, diffusion_twin_scored=d_scored,
               ar_twin_bits=a_bits, ar_twin_scored=a_scored,
               diffusion_text=_text(d_task, d_tokens), ar_text=_text(a_task, a_tokens), diffusion_ids=d_ids,
               ar_ids=a_ids)
    if prompt_texts is not None:
      row.update(diffusion_parses=_parses(prompt_texts[i], row["diffusion_text"], FLAGS.body_indent),
                 ar_parses=_parses(prompt_texts[i], row["ar_text"], FLAGS.body_indent))
    rows.append(row)
    same = f" | AR at diffusion's length {a_same_s:.2f} s" if FLAGS.same_length else ""
    print(f"prompt {i + 1}/{len(prompts)}: diffusion {d_s:.2f} s, {n_d} tokens, steps per canvas {steps} | "
          f"AR {a_s:.2f} s, {n_a} tokens{same}", flush=True)

  def median(key_):
    return statistics.median(r[key_] for r in rows)

  all_steps = [s for r in rows for s in r["steps_per_canvas"]]
  summary = dict(
      prompts=len(rows), data=os.path.abspath(FLAGS.data), canvas_length=sampler.canvas_length,
      max_new_tokens=capacity, max_denoising_steps=sampler.max_denoising_steps,
      diffusion_s_median=median("diffusion_s"), ar_s_median=median("ar_s"),
      ar_same_length_s_median=median("ar_same_length_s") if FLAGS.same_length else None,
      diffusion_tokens_median=median("diffusion_tokens"), ar_tokens_median=median("ar_tokens"),
      steps_per_canvas_mean=sum(all_steps) / len(all_steps), steps_per_canvas_max=max(all_steps),
      diffusion_tokens_per_s=sum(r["diffusion_tokens"] for r in rows) / sum(r["diffusion_s"] for r in rows),
      ar_tokens_per_s=sum(r["ar_tokens"] for r in rows) / sum(r["ar_s"] for r in rows),
      diffusion_twin_bits_per_token=sum(r["diffusion_twin_bits"] for r in rows) / sum(
          r["diffusion_twin_scored"] for r in rows),
      ar_twin_bits_per_token=sum(r["ar_twin_bits"] for r in rows) / sum(r["ar_twin_scored"] for r in rows),
      sampler={k: v for k, v in dataclasses.asdict(sampler).items() if k != "stop_ids"},
      ar_temperature=FLAGS.ar_temperature, judge=os.path.abspath(FLAGS.judge or FLAGS.ar),
      device=jax.devices()[0].device_kind)
  if prompt_texts is not None:
    summary.update(diffusion_parse_share=sum(r["diffusion_parses"] for r in rows) / len(rows),
                   ar_parse_share=sum(r["ar_parses"] for r in rows) / len(rows))
  print(f"--- {len(rows)} prompts at batch 1 on {summary['device']} · medians: diffusion {summary['diffusion_s_median']:.2f} s "
        f"({summary['diffusion_tokens_median']} tokens, {summary['steps_per_canvas_mean']:.1f} steps per canvas "
        f"on average, max {summary['steps_per_canvas_max']}) · AR {summary['ar_s_median']:.2f} s "
        f"({summary['ar_tokens_median']} tokens)" + (
            f" · AR at diffusion's length {summary['ar_same_length_s_median']:.2f} s" if FLAGS.same_length else ""))
  print(f"--- the {'judge' if FLAGS.judge else 'AR twin'}'s NLL of the completions: diffusion {summary['diffusion_twin_bits_per_token']:.2f}, "
        f"AR {summary['ar_twin_bits_per_token']:.2f} bits/token" + (
            f" · parse as Python: diffusion {summary['diffusion_parse_share']:.0%}, AR {summary['ar_parse_share']:.0%}"
            if prompt_texts is not None else ""))
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
