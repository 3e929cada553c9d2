"""Diffusionize: start a DiffusionGemma-style model from a pretrained autoregressive Gemma, as DiffusionGemma
itself was made (at small scale: Gemma 3 270M from its GGUF file).

    config, params = checkpoints.load_gguf(path)                    # the AR backbone
    config, params = diffusionize(config, params, jax.random.key(0))  # + self-conditioning, canvas length

    python -m dgemma.diffusionize --out=DIR [--gguf=FILE] [--canvas_length=256]   # a checkpoint for train.py

The backbone is used unchanged, in both modes (causal encoder, bidirectional denoiser). The only new module is
self-conditioning (spec §3), `h_in = RMSNorm_noscale(E[x]·√D + down(gelu(RMSNorm(s)·gate) ⊙ RMSNorm(s)·up))`.
It starts as a no-op: `down` is zero, so the signal is exactly 0 whatever the previous logits are, and
`gate`/`up` are random (normal 0.02, as `model.init_params`) so that `down`'s first gradients are not zero.
"No-op" is up to the block's scale-free post-norm, which Gemma 3's input does not have. It stays (the
DiffusionGemma structure, no extra switch): Gemma 3 270M's scaled embeddings E[x]·√D have RMS 1.030-1.032 for
every token, so the post-norm only rescales the denoiser input by ~0.97. Measured on a 19-token canvas after a
13-token prompt, skipping it would change the denoiser's initial predictions by a mean KL of 0.001 nats (max
0.004) with the same argmax everywhere.
"""

from __future__ import annotations

import argparse
import os
import sys

import jax
import jax.numpy as jnp

from dgemma.config import ModelConfig
from dgemma.model import param_shapes

SC = "self_conditioning"


def init_self_conditioning(config: ModelConfig, rng: jax.Array) -> dict:
  """Self-conditioning parameters whose output is exactly zero: pre-norm scale 1, `down` 0."""
  dtype = jnp.dtype(config.param_dtype)
  d, f = config.width, config.mlp_hidden
  gate_key, up_key = jax.random.split(rng)
  return {
      "pre_norm": {"scale": jnp.ones((d,), dtype)},
      "mlp": {
          "gate": (0.02 * jax.random.normal(gate_key, (d, f), jnp.float32)).astype(dtype),
          "up": (0.02 * jax.random.normal(up_key, (d, f), jnp.float32)).astype(dtype),
          "down": jnp.zeros((f, d), dtype),
      },
  }


def diffusionize(config: ModelConfig, params: dict, rng: jax.Array,
                 canvas_length: int | None = None) -> tuple[ModelConfig, dict]:
  """(config, params) of an AR backbone (no self-conditioning block) -> a diffusion model at its start."""
  if SC in params:
    raise ValueError("these params already have a self-conditioning block: they are a diffusion model")
  if canvas_length is not None:
    config = config.replace(canvas_length=canvas_length)
  expected = {k: v for k, v in param_shapes(config).items() if k != SC}
  got_shapes = jax.tree.map(lambda x: tuple(x.shape), params)
  want_shapes = jax.tree.map(lambda x: tuple(x.shape), expected)
  if got_shapes != want_shapes:
    raise ValueError("the params do not match the config's backbone; diffusionize takes (config, params) as "
                     "checkpoints.load_gguf returns them")
  return config, {**params, SC: init_self_conditioning(config, rng)}


def load_gguf_diffusion(path: str, rng: jax.Array, canvas_length: int = 256,
                        **config_overrides) -> tuple[ModelConfig, dict]:
  """A Gemma 3 GGUF file as a diffusion model at its start (float32)."""
  from dgemma.checkpoints.gguf import load_gguf
  config, params = load_gguf(path, **config_overrides)
  return diffusionize(config, params, rng, canvas_length)


def write_checkpoint(out_dir: str, gguf_path: str, canvas_length: int = 256, seed: int = 0) -> None:
  """Writes the diffusionized model as our checkpoint (dgemma.json, params.safetensors) with the GGUF's
  tokenizer as tokenizer.json, so train.py (`init_from`), sample.py and the text pipelines read it."""
  from dgemma.checkpoints import save_model
  from dgemma.data.tokenizer import gguf_tokenizer
  config, params = load_gguf_diffusion(gguf_path, jax.random.key(seed), canvas_length)
  metadata = {"diffusionized_from": os.path.abspath(gguf_path), "self_conditioning_init": f"zero down, seed {seed}"}
  save_model(out_dir, config, params, metadata)
  gguf_tokenizer(gguf_path).save(os.path.join(out_dir, "tokenizer.json"))


def main(argv: list[str] | None = None) -> int:
  parser = argparse.ArgumentParser(prog="python -m dgemma.diffusionize", description=__doc__.split("\n\n")[0])
  parser.add_argument("--out", required=True, help="checkpoint directory to write")
  parser.add_argument("--gguf", default="", help="a Gemma 3 GGUF file (default: the packaged Gemma 3 270M)")
  parser.add_argument("--canvas_length", type=int, default=256)
  parser.add_argument("--seed", type=int, default=0, help="seed of the self-conditioning gate/up init")
  args = parser.parse_args(argv)
  try:
    if args.gguf:
      path = args.gguf
    else:
      from dgemma.checkpoints.gguf import packaged_gemma3_270m
      path = packaged_gemma3_270m()
    write_checkpoint(args.out, path, args.canvas_length, args.seed)
  except (ValueError, FileNotFoundError, ImportError) as e:
    if os.environ.get("DGEMMA_TRACEBACK"):
      raise
    sys.exit(f"diffusionize: error: {e}")
  print(f"Wrote {args.out} (from {path})")
  return 0


if __name__ == "__main__":
  sys.exit(main())
