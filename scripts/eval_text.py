"""Held-out likelihood of a text checkpoint (docs/text.md, "Held-out likelihood").

  python scripts/eval_text.py --ckpt=PATH --data=FILE.jsonl [--num_t=16] [--draws=1] [--limit=N]
      [--batch_size=16] [--mode=auto|diffusion|ar] [--denoiser_output=auto|context|full] [--seed=0]
      [--json_out=F]

--data is read as the checkpoint's training data was (its recorded task and data settings: JSONL, plain text or
ArrayRecord), in file order, without shuffling. A diffusion checkpoint gets the continuous-time uniform-state
NELBO in bits per response token, estimated on the num_t stratified noise levels t_k = (k + 1/2)/num_t with a
fixed key (--seed), its standard error over examples, and per noise level the bound's integrand and the
cross-entropy of training's loss. An objective=ar checkpoint (recorded as diffusion_loss_weight 0 in its
training config; --mode=ar forces it) gets the exact autoregressive NLL of the same response tokens, by
teacher forcing through the causal encoder. Both are also given per byte of the response text the scored tokens
spell (special ids dropped): the unit that compares models with different tokenizers. Every canvas of a multi-canvas response is scored against the
prompt and the clean canvases before it, so the number is the whole response's.
"""

from __future__ import annotations

import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the repo root

from absl import flags  # noqa: E402

from dgemma import cli  # noqa: E402

FLAGS = flags.FlagValues()
_D = dict(flag_values=FLAGS)
flags.DEFINE_string("ckpt", None, "A text checkpoint (task 'text'): exported model/ or a training workdir.", **_D)
flags.DEFINE_string("data", None, "Held-out data, in a format the text task reads (JSONL, plain text, ArrayRecord).",
                    **_D)
flags.DEFINE_integer("num_t", 16, "Stratified noise levels of the ELBO's midpoint rule.", **_D)
flags.DEFINE_integer("draws", 1, "Corruptions per example and noise level.", **_D)
flags.DEFINE_integer("limit", 0, "Evaluate only the first N examples (0: all).", **_D)
flags.DEFINE_integer("batch_size", 16, "Examples per batch.", **_D)
flags.DEFINE_enum("mode", "auto", ["auto", "diffusion", "ar"],
                  "auto: ar for a checkpoint trained with diffusion_loss_weight 0, else diffusion.", **_D)
flags.DEFINE_enum("denoiser_output", "auto", ["auto", "context", "full"],
                  "How the bound reads the denoiser's softmax at a token: context = p(x0 | the other noisy tokens), "
                  "what diffusion.loss=elbo trains and the bound is tight for; full = p(x0 | all noisy tokens, its "
                  "own included), what the recipe's flat cross-entropy trains, converted by Bayes before the bound; "
                  "auto: what the checkpoint's training loss trains (docs/text.md).", **_D)
flags.DEFINE_integer("self_cond_passes", 0, "Denoiser passes after the first, each fed its predecessor's logits as "
                     "the self-conditioning signal, as training's self-conditioning rows are (the bound stays a "
                     "bound: the denoiser is still a function of the noisy canvas and the context).", **_D)
flags.DEFINE_integer("seed", 0, "The key of the corruptions (fixed: runs with the same seed see the same noise).", **_D)
flags.DEFINE_string("json_out", None, "Also write the numbers to this JSON file.", **_D)


def data_config(metadata: dict, path: str):
  """configs/text.py's data settings, overridden by those the checkpoint was trained with, reading `path`."""
  from configs import text as text_config
  c = text_config.get_config(f"data={path},tokenizer=bytes")  # (the tokenizer: the checkpoint's, below)
  trained = (metadata.get("train_config") or {}).get("data") or {}
  for key, value in trained.items():
    if key in c.data and key != "path":
      c.data[key] = value
  return c


def report(out: dict) -> str:
  if out["mode"] == "ar":
    return (f"AR NLL: {out['nll_bits_per_token']:.4f} ± {out['stderr_bits_per_token']:.4f} bits/token (exact; "
            f"{out['num_examples']} examples, {out['num_tokens']} response tokens){_per_byte(out)}")
  lines = ["t        ELBO integrand  cross-entropy  (bits/token)"]
  for t, e, ce in zip(out["t"], out["elbo_integrand_bits_by_t"], out["cross_entropy_bits_by_t"]):
    lines.append(f"{t:.4f}   {e:12.4f}  {ce:13.4f}")
  lines.append(f"ELBO: {out['bits_per_token']:.4f} ± {out['stderr_bits_per_token']:.4f} bits/token (upper bound on "
               f"the NLL; {out['num_t']} stratified t values x {out['draws']} draw(s), seed {out['seed']}, "
               f"denoiser output read as {out['denoiser_output']}"
               + (f" after {out['self_cond_passes']} self-conditioning pass(es)" if out.get("self_cond_passes") else "")
               + f"; {out['num_examples']} examples, {out['num_tokens']} response tokens){_per_byte(out)}")
  return "\n".join(lines)


def _per_byte(out: dict) -> str:
  if "bits_per_byte" not in out:
    return ""
  return f"\n= {out['bits_per_byte']:.4f} bits per byte of the {out['num_text_bytes']} bytes of text those tokens spell"


def run() -> int:
  if not FLAGS.ckpt or not FLAGS.data:
    raise ValueError("--ckpt and --data are required")
  for name in ("num_t", "draws", "batch_size"):
    if FLAGS[name].value < 1:
      raise ValueError(f"--{name} must be >= 1, got {FLAGS[name].value}")
  if FLAGS.limit < 0:
    raise ValueError(f"--limit must be >= 0, got {FLAGS.limit}")
  if FLAGS.self_cond_passes < 0:
    raise ValueError(f"--self_cond_passes must be >= 0, got {FLAGS.self_cond_passes}")
  cli.check_seed(FLAGS.seed)
  if FLAGS.json_out:
    cli.check_output_path(FLAGS.json_out, "--json_out")
  if not os.path.exists(FLAGS.data):
    raise ValueError(f"--data={FLAGS.data} does not exist")
  if not os.path.exists(FLAGS.ckpt):
    raise ValueError(f"--ckpt={FLAGS.ckpt} does not exist")
  from dgemma import tasks
  from dgemma.loading import load_model
  try:
    config, params, metadata = load_model(FLAGS.ckpt)
  except Exception as e:  # a damaged checkpoint fails in many ways; the user needs one line naming it
    raise ValueError(f"cannot load checkpoint {FLAGS.ckpt}: {str(e).splitlines()[0] if str(e) else type(e).__name__}") \
        from None
  task = tasks.for_checkpoint(config, metadata, FLAGS.ckpt)
  if task is None or task.name != "text":
    raise ValueError(f"--ckpt={FLAGS.ckpt} is not a text checkpoint (task {tasks.name_of(metadata)!r})")
  from dgemma.tasks.text import decoding, likelihood
  settings = likelihood.settings_from(decoding.trained_diffusion(metadata), FLAGS.mode,
                                      num_t=FLAGS.num_t, draws=FLAGS.draws, seed=FLAGS.seed,
                                      denoiser_output=FLAGS.denoiser_output,
                                      self_cond_passes=FLAGS.self_cond_passes)
  encoder = task.encoder(data_config(metadata, os.path.abspath(FLAGS.data)))
  scorer = likelihood.Scorer(task.config, metadata.get("position_features"))
  out = likelihood.evaluate(scorer, params, likelihood.batches(encoder, FLAGS.batch_size, FLAGS.limit), settings)
  out = {"ckpt": os.path.abspath(FLAGS.ckpt), "data": os.path.abspath(FLAGS.data), **out}
  print(report(out))
  if FLAGS.json_out:
    with open(FLAGS.json_out, "w") as f:
      json.dump(out, f, indent=1)
  return 0


def main(argv: list[str]) -> int:
  """Runs with command-line `argv`; bad input prints one `error:` line and returns a non-zero code."""
  return cli.run_main(argv, __doc__, run, FLAGS)


if __name__ == "__main__":
  cli.exit(main(sys.argv))
