"""Tiny random Hugging Face DiffusionGemma models, the numerical reference for our tests."""

from __future__ import annotations

import numpy as np
import torch

from dgemma.config import TINY_HF_VISION_CONFIG

torch.set_grad_enabled(False)


def tiny_hf_config(**text_overrides):
  from transformers import DiffusionGemmaConfig
  text = dict(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=5,
              num_attention_heads=4, num_key_value_heads=2, head_dim=8, global_head_dim=16,
              num_global_key_value_heads=1, sliding_window=4,
              layer_types=["sliding_attention", "sliding_attention", "full_attention",
                           "sliding_attention", "full_attention"],
              num_experts=6, top_k_experts=2, moe_intermediate_size=12)
  text.update(text_overrides)
  return DiffusionGemmaConfig(text_config=text, vision_config=dict(TINY_HF_VISION_CONFIG), canvas_length=6)


def random_hf_model(seed: int = 0, **text_overrides):
  """A random model whose norm scales and layer scalars are randomised too, so that a swapped or
  ignored scale shows up in the logits (HF initialises them to one)."""
  from transformers import DiffusionGemmaForBlockDiffusion
  torch.manual_seed(seed)
  model = DiffusionGemmaForBlockDiffusion(tiny_hf_config(**text_overrides)).eval()
  gen = torch.Generator().manual_seed(seed + 1)
  for name, tensor in list(model.named_parameters()) + list(model.named_buffers()):
    if "vision" in name or "inv_freq" in name or "embed_scale" in name:
      continue
    if name.endswith(("norm.weight", "layernorm.weight", "layernorm_1.weight", "layernorm_2.weight",
                      ".scale", "per_expert_scale", "layer_scalar")):
      tensor.copy_(1.0 + 0.3 * torch.randn(tensor.shape, generator=gen))
    else:  # larger weights than the 0.02 default, so that errors are not hidden by tiny activations
      tensor.copy_(0.15 * torch.randn(tensor.shape, generator=gen))
  # The decoder's layer_scalar buffers are clones: keep them equal to the encoder's.
  for enc, dec in zip(model.model.encoder.language_model.layers, model.model.decoder.layers):
    dec.layer_scalar.copy_(enc.layer_scalar)
  return model


def hf_logits(model, hidden):
  logits = model.lm_head(hidden).float()
  cap = model.config.text_config.final_logit_softcapping
  return cap * torch.tanh(logits / cap)


def to_np(t: torch.Tensor) -> np.ndarray:
  return t.detach().float().numpy()
