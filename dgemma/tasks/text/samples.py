"""Generated samples for the in-training evaluation (docs/text.md): the model completes the first few held-out
prompts with its own sampler (block diffusion with the run's sampler defaults, or greedy decoding through the
causal encoder for an objective=ar run), and each completion comes back as a text next to its prompt and the
held-out response. The prompts and the seed are fixed, so successive evaluations differ by the weights alone;
`sample.py --ckpt=WORKDIR/model --prompts_file=<the prompts> --seed=<config.seed>` gives the same diffusion text
for the exported weights."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from jaxtyping import Bool, Int

from dgemma import sharding
from dgemma.sampling import ARConfig, generate, generate_autoregressive, sampler_config, self_conditioning_for

PROMPT, SAMPLE, REFERENCE = "=== prompt", "=== sample", "=== held-out response"  # a text's three parts


@dataclasses.dataclass(frozen=True)
class HeldOut:
  """The examples to complete: right-padded prompt rows and the held-out responses as text."""
  prompt_NxP: Int[np.ndarray, "N P"]
  valid_NxP: Bool[np.ndarray, "N P"]
  prompts: tuple[str, ...]
  references: tuple[str, ...]


def held_out(encoder, task, count: int) -> HeldOut:
  """The first `count` examples of the encoder's records (those it drops are passed over), as training encodes
  them; fewer when the records hold fewer. The prompt is shown as the tokenizer decodes it without its special
tokens (BOS, PAD)."""
  rows = []
  for i in range(len(encoder.records)):
    if len(rows) == count:
      break
    example = encoder(i)
    if example is not None:
      rows.append(example)
  if not rows:
    raise ValueError("eval.num_samples > 0 but the held-out data holds no usable example")
  prompt_NxP = np.stack([r["prompt"] for r in rows])
  pad = task.config.pad_id
  prompts = tuple(task.tokenizer.decode([int(t) for t in row if t != pad], skip_special=True) for row in prompt_NxP)
  references = tuple(str(t) for t in task.decode(np.stack([r["canvas"] for r in rows])))
  return HeldOut(prompt_NxP, prompt_NxP != pad, prompts, references)


def text(prompt: str, sample: str, reference: str) -> str:
  return f"{PROMPT}\n{prompt}\n{SAMPLE}\n{sample}\n{REFERENCE}\n{reference}"


def sample_of(shown: str) -> str:
  """The generated part of a `text` (tests and readers of the logs)."""
  return shown.split(f"\n{SAMPLE}\n", 1)[1].rsplit(f"\n{REFERENCE}\n", 1)[0]


def make_sampler(task, examples: HeldOut, metadata: dict, autoregressive: bool, seed: int):
  """params -> {"eval/sample_<i>": text} for i = 1..N. Diffusion: the run's sampler defaults (`metadata`, as
  sample.py reads them from the exported model); autoregressive: greedy, up to the canvases' capacity."""
  features = metadata.get("position_features")
  config = task.config
  if autoregressive:
    ar = ARConfig(max_new_tokens=config.canvas_length * task.max_canvases, temperature=0.0,
                  stop_ids=config.stop_ids)
  else:
    sampler = task.sampler(sampler_config(metadata, self_conditioning=self_conditioning_for(metadata)))

  def run(params: dict) -> dict[str, str]:
    rng = jax.random.key(seed)
    if autoregressive:
      out = generate_autoregressive(params, config, examples.prompt_NxP, examples.valid_NxP, rng, ar,
                                    position_features=features)
    else:
      out = generate(params, config, examples.prompt_NxP, examples.valid_NxP, rng, sampler,
                     position_features=features)
    completions = task.decode(np.asarray(sharding.to_host(out.tokens)))
    return {f"eval/sample_{i}": text(p, str(s), r)
            for i, (p, s, r) in enumerate(zip(examples.prompts, completions, examples.references), 1)}

  return run
