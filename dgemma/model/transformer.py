"""The DiffusionGemma text model: one set of weights, two modes.

- `encode`: causal Gemma-4 forward that writes K/V into the cache (prompt prefill, or appending a committed
  canvas; positions continue from the cache) and returns next-token logits.
- `denoise`: bidirectional pass over a canvas that reads the cache and never writes it, with the
  self-conditioning block in front (spec §2-3).
"""

from __future__ import annotations

import flax.linen as nn
import jax.numpy as jnp
from jaxtyping import Array, Bool, Float, Int

from dgemma.config import GLOBAL, LOCAL, ModelConfig
from dgemma.model import masks
from dgemma.model.attention import Attention, write_rows
from dgemma.model.cache import KVCache
from dgemma.model.layers import MoE, Embedder, GeGLU, RMSNorm, param_dtype


class Block(nn.Module):
  """One layer (spec §1.7): attention, then the dense GeGLU and MoE branches in parallel, then the layer scalar."""
  config: ModelConfig
  layer_idx: int

  @nn.compact
  def __call__(self, x_BxTxD: Array, positions_BxT: Array, mask: Array,
               layer_kv: tuple[Array, Array], write_at: Array | None, shared_features: Array | None = None):
    cfg = self.config
    dt = param_dtype(cfg)
    kind = cfg.layer_types[self.layer_idx]

    def norm(name, with_scale=True):
      return RMSNorm(cfg.rms_norm_eps, with_scale=with_scale, dtype=dt, name=name)

    attn_out, new_kv = Attention(cfg, kind, name="attn")(
        norm("pre_attention_norm")(x_BxTxD), positions_BxT, mask, layer_kv, write_at, shared_features)
    x1 = x_BxTxD + norm("post_attention_norm")(attn_out)

    ffw = GeGLU(cfg.mlp_hidden, dtype=dt, matmul_dtype=cfg.matmul_dtype, name="mlp")(norm("pre_mlp_norm")(x1))
    if cfg.num_experts:
      ffw = norm("post_mlp_norm")(ffw)
      ffw = ffw + norm("post_moe_norm")(MoE(cfg, name="moe")(norm("pre_moe_norm")(x1), x1))
    x2 = x1 + norm("post_ffw_norm")(ffw)
    layer_scalar = self.param("layer_scalar", nn.initializers.ones, (1,), dt)
    return x2 * layer_scalar, new_kv


class SelfConditioning(nn.Module):
  """h_in = RMSNorm_noscale(E[x]·√D + GeGLU(RMSNorm(soft_embedding(previous logits)))) (spec §3)."""
  config: ModelConfig

  @nn.compact
  def __call__(self, token_embeds_BxCxD: Array, soft_embeds_BxCxD: Array | None) -> Array:
    """`soft_embeds_BxCxD=None` is "no signal": the branch is skipped, since RMSNorm(0) = 0 and the bias-free
    GeGLU maps 0 to 0 exactly (the same numbers as zeros, without a wasted MLP pass in training)."""
    cfg = self.config
    dt = param_dtype(cfg)
    if soft_embeds_BxCxD is None:
      return RMSNorm(cfg.rms_norm_eps, with_scale=False, name="post_norm")(token_embeds_BxCxD)
    normed = RMSNorm(cfg.rms_norm_eps, dtype=dt, name="pre_norm")(soft_embeds_BxCxD)
    signal = GeGLU(cfg.mlp_hidden, dtype=dt, matmul_dtype=cfg.matmul_dtype, name="mlp")(normed)
    return RMSNorm(cfg.rms_norm_eps, with_scale=False, name="post_norm")(token_embeds_BxCxD + signal)


class DiffusionGemma(nn.Module):
  config: ModelConfig

  def setup(self):
    cfg = self.config
    block = nn.remat(Block) if cfg.remat else Block
    self.embedder = Embedder(cfg)
    self.blocks = [block(cfg, i, name=f"layer_{i}") for i in range(cfg.num_layers)]
    self.final_norm = RMSNorm(cfg.rms_norm_eps, dtype=param_dtype(cfg))
    self.self_conditioning = SelfConditioning(cfg)

  def _features(self, position_features_LxF: Array | None) -> Array | None:
    """The position-feature table (config.num_position_features), checked as far as its shape: the static half.
    The values are checked on the host where a table enters (`position_features.check`)."""
    f = self.config.num_position_features
    if not f:
      if position_features_LxF is not None:
        raise ValueError("position_features given to a model without position features (num_position_features=0)")
      return None
    if position_features_LxF is None:
      raise ValueError(f"this model reads an [L, {f}] position-feature table: pass position_features= (its "
                       "checkpoint keeps it in metadata['position_features'])")
    if position_features_LxF.ndim != 2 or position_features_LxF.shape[1] != f:
      raise ValueError(f"position_features must have shape [L, {f}], got {position_features_LxF.shape}")
    return position_features_LxF

  def _layers(self, x, positions, masks_by_kind, cache: KVCache, write_at, key_positions, features_LxF):
    shared = None
    if self.config.relation_bias:  # computed once, read by every layer
      shared = masks.shared_features(features_LxF, positions, key_positions)
    keys, values = [], []
    for i, block in enumerate(self.blocks):
      kind = self.config.layer_types[i]
      x, new_kv = block(x, positions, masks_by_kind[kind], (cache.keys[i], cache.values[i]), write_at, shared)
      if new_kv is not None:
        keys.append(new_kv[0])
        values.append(new_kv[1])
    return self.final_norm(x), keys, values

  def _window(self, kind: str) -> int | None:
    return self.config.sliding_window if kind == LOCAL else None

  def _mask_builder(self, mode: str, kind: str):
    """The mask builder of a mode ("encode" or "denoise") for layers of a kind: dense boolean masks for the XLA
    attention; for the Pallas kernel the same masks in structured form (same arguments), which let it skip every
    key block they hide (config.attention_for chooses per mode and kind)."""
    if self.config.attention_for(kind, mode) == "pallas":
      from pallas_kernels.mask_spec import AttentionMask  # jax.numpy only: importing it pulls in no Pallas
      return AttentionMask.causal if mode == "encode" else AttentionMask.denoiser
    return masks.encoder_mask if mode == "encode" else masks.denoiser_mask

  def encode(self, tokens_BxT: Int[Array, "B T"], cache: KVCache,
             token_valid_BxT: Bool[Array, "B T"] | None = None, compute_logits: bool = True,
             position_features: Int[Array, "L F"] | None = None, return_hidden: bool = False):
    """`position_features`: the model's [L, F] feature table when config.num_position_features > 0.
    `return_hidden`: the final-norm hidden states [B, T, D] in place of the logits (`logits_from_hidden` turns
    them into logits, e.g. a few tokens at a time in a chunked loss)."""
    features = self._features(position_features)
    b, t = tokens_BxT.shape
    if token_valid_BxT is None:
      token_valid_BxT = jnp.ones((b, t), bool)
    start = cache.end
    positions = start[:, None] + jnp.arange(t)[None, :]
    valid = write_rows(cache.valid, token_valid_BxT, start)
    masks_by_kind = {k: self._mask_builder("encode", k)(positions, valid, self._window(k)) for k in (LOCAL, GLOBAL)}
    x = self.embedder.encode(tokens_BxT, positions, features)
    x, keys, values = self._layers(x, positions, masks_by_kind, cache, start, cache.slot_positions, features)
    new_cache = KVCache(keys=tuple(keys), values=tuple(values), valid=valid, end=start + t)
    if return_hidden:
      return x, new_cache
    logits = self.embedder.decode(x) if compute_logits else None
    return logits, new_cache

  def denoise(self, canvas_BxC: Int[Array, "B C"], cache: KVCache,
              self_conditioning_logits: Float[Array, "B C V"] | None = None,
              self_conditioning_mask: Bool[Array, "B"] | None = None,
              self_conditioning_probs: Float[Array, "B C V"] | None = None,
              self_conditioning_table: Array | None = None,
              position_features: Int[Array, "L F"] | None = None,
              self_conditioning_embeds: Float[Array, "B C D"] | None = None,
              return_hidden: bool = False) -> Float[Array, "B C V"]:
    """`self_conditioning_probs`: softmax(self_conditioning_logits) instead of the logits, from a caller that
    computed it already (the sampler), which saves a vocabulary-wide softmax per step.
    `self_conditioning_table`: `embedding_table_transposed()`, built once outside a caller's loop, for the product
    of the self-conditioning probabilities with the embedding (`Embedder.encode_probs`).
    `position_features`: as in `encode`.
    `self_conditioning_embeds`: the soft embedding itself (`soft_embeds` of a previous pass's logits), from a
    caller that never held the [B, C, V] logits (a chunked loss). `return_hidden`: as in `encode`."""
    features = self._features(position_features)
    given = [a is not None for a in (self_conditioning_logits, self_conditioning_probs, self_conditioning_embeds)]
    if sum(given) > 1:
      raise ValueError("give self-conditioning logits, probabilities or embeddings, not several")
    c = canvas_BxC.shape[1]
    positions = cache.end[:, None] + jnp.arange(c)[None, :]
    x = self.embedder.encode(canvas_BxC, positions, features)
    if not any(given):
      soft = None  # "no signal": exactly HF's self_conditioning_logits=None
    elif self_conditioning_embeds is not None:
      soft = self_conditioning_embeds
      if self_conditioning_mask is not None:
        soft = soft * self_conditioning_mask[:, None, None].astype(soft.dtype)
    else:
      soft = (self.embedder.encode_soft(self_conditioning_logits, self_conditioning_table)
              if self_conditioning_probs is None
              else self.embedder.encode_probs(self_conditioning_probs, self_conditioning_table))
      if self_conditioning_mask is not None:
        soft = soft * self_conditioning_mask[:, None, None].astype(soft.dtype)
    x = self.self_conditioning(x, soft)
    masks_by_kind = {k: self._mask_builder("denoise", k)(cache.end, cache.valid, c, self._window(k))
                     for k in (LOCAL, GLOBAL)}
    x, _, _ = self._layers(x, positions, masks_by_kind, cache, None,
                           jnp.concatenate([cache.slot_positions, positions], axis=1), features)
    return x if return_hidden else self.embedder.decode(x)

  def logits_from_hidden(self, x_BxTxD: Array) -> Float[Array, "B T V"]:
    """The logits of final-norm hidden states (`return_hidden=True`): what `encode` and `denoise` return."""
    return self.embedder.decode(x_BxTxD)

  def soft_embeds(self, logits_BxTxV: Array) -> Array:
    """The self-conditioning soft embedding of logits (before any row mask): what `denoise` makes of
    `self_conditioning_logits`."""
    return self.embedder.encode_soft(logits_BxTxV)

  def embedding_table_transposed(self) -> Array:
    return self.embedder.transposed_table()

  def __call__(self, tokens_BxT, cache, canvas_BxC, position_features=None):
    """Touches every parameter once; used by `init`."""
    logits, cache = self.encode(tokens_BxT, cache, position_features=position_features)
    return self.denoise(canvas_BxC, cache, self_conditioning_logits=logits[:, :canvas_BxC.shape[1]],
                        position_features=position_features)
