"""Held-out likelihood of a text checkpoint (docs/text.md, "Held-out likelihood").

  python scripts/eval_text.py --ckpt=PATH --data=FILE.jsonl [--num_t=16] [--draws=1] [--limit=N]
      [--batch_size=16] [--mode=auto|diffusion|ar] [--seed=0] [--json_out=F]

--data is read as the checkpoint's training data was (its recorded task and data settings: JSONL, plain text or
ArrayRecord), in file order, without shuffling. A diffusion checkpoint gets the continuous-time uniform-state
NELBO in bits per response token, estimated on the num_t stratified noise levels t_k = (k + 1/2)/num_t with a
fixed key (--seed), its standard error over examples, and per noise level the bound's integrand and the
cross-entropy of training's loss. An objective=ar checkpoint (recorded as diffusion_loss_weight 0 in its
training config; --mode=ar forces it) gets the exact autoregressive NLL of the same response tokens, by
teacher forcing through the causal encoder. Every canvas of a multi-canvas response is scored against the
prompt and the clean canvases before it, so the number is the whole response's.
"""

from __future__ import annotations

import functools
import json
import math
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
flags.DEFINE_integer("seed", 0, "The key of the corruptions (fixed: runs with the same seed see the same noise).", **_D)
flags.DEFINE_string("json_out", None, "Also write the numbers to this JSON file.", **_D)


def data_config(metadata: dict, path: str):
  """configs/text.py's data settings, overridden by those the checkpoint was trained with, reading `path`."""
  from configs import text as text_config
  c = text_config.get_config(f"data={path}")
  trained = (metadata.get("train_config") or {}).get("data") or {}
  for key, value in trained.items():
    if key in c.data and key != "path":
      c.data[key] = value
  return c


def objective_of(metadata: dict) -> dict:
  d = (metadata.get("train_config") or {}).get("diffusion") or {}
  return {"ar": d.get("diffusion_loss_weight", 1.0) == 0, "schedule": d.get("schedule", "linear"),
          "t_eps": float(d.get("t_eps", 1e-4))}


def batches(encoder, batch_size: int, limit: int):
  """The examples in file order (those the encoder drops are skipped), stacked `batch_size` at a time; the last
  batch may be smaller."""
  import numpy as np
  n = len(encoder.records) if not limit else min(limit, len(encoder.records))
  rows = []
  for i in range(n):
    example = encoder(i)
    if example is not None:
      rows.append(example)
    if len(rows) == batch_size or (i == n - 1 and rows):
      yield {k: np.stack([r[k] for r in rows]) for k in ("prompt", "canvas", "canvas_mask")}
      rows = []


def make_scorers(config, params, position_features):
  """(jitted encode, jitted denoise) for one checkpoint."""
  import jax
  from dgemma.model.cache import init_cache
  from dgemma.model.transformer import DiffusionGemma
  model = DiffusionGemma(config)

  @functools.partial(jax.jit, static_argnums=3)
  def encode(params, tokens, valid, want_logits):
    return model.apply({"params": params}, tokens, init_cache(config, tokens.shape[0], tokens.shape[1]), valid,
                       want_logits, position_features, method=DiffusionGemma.encode)

  @jax.jit
  def denoise(params, canvas, cache, end):
    return model.apply({"params": params}, canvas, cache.with_end(end), position_features=position_features,
                       method=DiffusionGemma.denoise)

  return (lambda tokens, valid: encode(params, tokens, valid, True),
          lambda tokens, valid: encode(params, tokens, valid, False)[1],
          lambda canvas, cache, end: denoise(params, canvas, cache, end))


def evaluate(config, params, metadata: dict, batch_iter, mode: str, num_t: int, draws: int, seed: int) -> dict:
  """The numbers, from batches of (prompt, canvas, canvas_mask)."""
  import jax
  import jax.numpy as jnp
  import numpy as np
  from dgemma.diffusion import elbo, losses
  pf = metadata.get("position_features")
  pf = None if pf is None else jnp.asarray(pf)
  encode_logits, encode_cache, denoise = make_scorers(config, params, pf)
  objective = objective_of(metadata)
  c = config.canvas_length
  key = jax.random.key(seed)
  elbo_rows, ce_rows, tokens, nll_rows = [], [], [], []
  first = 0  # the index of the batch's first example: its key is fold_in(key, index), whatever the batching
  for batch in batch_iter:
    prompt, canvas, mask = (jnp.asarray(batch[k]) for k in ("prompt", "canvas", "canvas_mask"))
    b, p = prompt.shape
    full = jnp.concatenate([prompt, canvas], 1)
    valid = jnp.concatenate([prompt != config.pad_id, mask], 1)
    tokens.append(np.asarray(jnp.sum(mask, 1)))
    keys_B = jax.vmap(lambda i: jax.random.fold_in(key, i))(jnp.arange(first, first + b))
    first += b
    if mode == "ar":  # token j of the response is predicted from everything before it
      logits, _ = encode_logits(full, valid)
      ce = losses.token_cross_entropy(logits[:, :-1], full[:, 1:])
      target = jnp.concatenate([jnp.zeros((b, p - 1), bool), mask], 1)
      nll_rows.append(np.asarray(jnp.sum(ce * target, 1), np.float64))
      continue
    n_canvases = canvas.shape[1] // c
    cache = encode_cache(full[:, :p + (n_canvases - 1) * c], valid[:, :p + (n_canvases - 1) * c])
    e_BxK, ce_BxK = np.zeros((b, num_t)), np.zeros((b, num_t))
    for s in range(n_canvases):
      x0, m = canvas[:, s * c:(s + 1) * c], mask[:, s * c:(s + 1) * c]
      if not bool(jnp.any(m)):
        continue
      end = jnp.full((b,), p + s * c, jnp.int32)
      e, ce = elbo.strata_sums(lambda x_t: denoise(x_t, cache, end), x0, m, config.vocab_size,
                               objective["schedule"], num_t, jax.vmap(lambda k: jax.random.fold_in(k, s))(keys_B),
                               objective["t_eps"], draws)
      e_BxK += np.asarray(e, np.float64)
      ce_BxK += np.asarray(ce, np.float64)
    elbo_rows.append(e_BxK)
    ce_rows.append(ce_BxK)
  if not tokens:
    raise ValueError("no examples to evaluate")
  tokens_B = np.concatenate(tokens).astype(np.float64)
  if tokens_B.sum() == 0:
    raise ValueError("the examples hold no response tokens")
  if mode == "ar":
    nll_B = np.concatenate(nll_rows)
    ratio, n = nll_B.sum() / tokens_B.sum(), len(nll_B)
    se = math.sqrt(n / (n - 1) * np.sum((nll_B - ratio * tokens_B) ** 2)) / tokens_B.sum() if n > 1 else float("nan")
    return {"mode": "ar", "nll_bits_per_token": ratio / math.log(2), "stderr_bits_per_token": se / math.log(2),
            "num_examples": n, "num_tokens": int(tokens_B.sum())}
  out = elbo.summarize(np.concatenate(elbo_rows), np.concatenate(ce_rows), tokens_B)
  return {"mode": "diffusion", "t": [float(t) for t in np.asarray(elbo.stratified_t(num_t, objective["t_eps"]))],
          "draws": draws, "seed": seed, "schedule": objective["schedule"], **out}


def report(out: dict) -> str:
  if out["mode"] == "ar":
    return (f"AR NLL: {out['nll_bits_per_token']:.4f} ± {out['stderr_bits_per_token']:.4f} bits/token (exact; "
            f"{out['num_examples']} examples, {out['num_tokens']} response tokens)")
  lines = ["t        ELBO integrand  cross-entropy  (bits/token)"]
  for t, e, ce in zip(out["t"], out["elbo_integrand_bits_by_t"], out["cross_entropy_bits_by_t"]):
    lines.append(f"{t:.4f}   {e:12.4f}  {ce:13.4f}")
  lines.append(f"ELBO: {out['bits_per_token']:.4f} ± {out['stderr_bits_per_token']:.4f} bits/token (upper bound on "
               f"the NLL; {out['num_t']} stratified t values x {out['draws']} draw(s), seed {out['seed']}; "
               f"{out['num_examples']} examples, {out['num_tokens']} response tokens)")
  return "\n".join(lines)


def run() -> int:
  if not FLAGS.ckpt or not FLAGS.data:
    raise ValueError("--ckpt and --data are required")
  for name in ("num_t", "draws", "batch_size"):
    if FLAGS[name].value < 1:
      raise ValueError(f"--{name} must be >= 1, got {FLAGS[name].value}")
  if FLAGS.limit < 0:
    raise ValueError(f"--limit must be >= 0, got {FLAGS.limit}")
  cli.check_seed(FLAGS.seed)
  if FLAGS.json_out:
    cli.check_output_path(FLAGS.json_out, "--json_out")
  if not os.path.exists(FLAGS.data):
    raise ValueError(f"--data={FLAGS.data} does not exist")
  if not os.path.exists(FLAGS.ckpt):
    raise ValueError(f"--ckpt={FLAGS.ckpt} does not exist")
  from dgemma import tasks
  from dgemma.loading import load_model
  config, params, metadata = load_model(FLAGS.ckpt)
  task = tasks.for_checkpoint(config, metadata, FLAGS.ckpt)
  if task is None or task.name != "text":
    raise ValueError(f"--ckpt={FLAGS.ckpt} is not a text checkpoint (task {tasks.name_of(metadata)!r})")
  mode = FLAGS.mode if FLAGS.mode != "auto" else ("ar" if objective_of(metadata)["ar"] else "diffusion")
  encoder = task.encoder(data_config(metadata, os.path.abspath(FLAGS.data)))
  out = evaluate(task.config, params, metadata, batches(encoder, FLAGS.batch_size, FLAGS.limit), mode,
                 FLAGS.num_t, FLAGS.draws, FLAGS.seed)
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
