"""The Pallas flash-attention kernel (interpret mode) against the model's XLA attention.

Each kernel test runs one batch whose rows are different situations of the same mask kind (rows differ only
in mask *data*, so one compilation covers them all) and checks the output and the q/k/v gradients against
the reference. The shapes hit the edges: lengths that are not multiples of the blocks, windows that cut
blocks, right padding and holes, rows that see nothing, per-row cache lengths, GQA ratios 2 and 8, head dims
256 and 512. Every key block that a row hides entirely is filled with NaN in the kernel's inputs: a block
that was computed and then masked would turn the result into NaN (0 · NaN), so exact results prove that
hidden blocks are skipped.
"""

import jax
import jax.extend.core
import jax.numpy as jnp
import numpy as np
import pytest

from dgemma.model import masks
from dgemma.model.attention import dot_product_attention
from pallas_kernels.attention import (AttentionMask, BlockSizes, _key_info, attention, block_tables,
                                      reference_attention)

F32_TOL = dict(atol=2e-5, rtol=2e-5)
SMALL = BlockSizes(block_q=4, block_k=4, block_q_bwd=8, block_k_bwd=4)


def _qkv(seed, b, t, s, n, kv, h, dtype=jnp.float32):
  rng = np.random.default_rng(seed)
  q, k, v = (rng.normal(size=shape) for shape in [(b, t, n, h), (b, s, kv, h), (b, s, kv, h)])
  # Attention scale is 1.0 in this model: keep logits O(1) whatever the head dim.
  return jnp.asarray(q / h ** 0.25, dtype), jnp.asarray(k / h ** 0.25, dtype), jnp.asarray(v, dtype)


def _stack(*row_masks: AttentionMask) -> AttentionMask:
  """One batch from masks built separately (e.g. with different windows), row after row."""
  assert len({m.num_tail for m in row_masks}) == 1
  cat = lambda name: jnp.concatenate([getattr(m, name) for m in row_masks], axis=0)
  return AttentionMask(key_valid=cat("key_valid"), lo=cat("lo"), hi=cat("hi"), num_tail=row_masks[0].num_tail)


# ------------------------------------------------------------------------------------------------
# The three mask kinds, built the way the model builds them
# ------------------------------------------------------------------------------------------------
def _causal_row(cap, t, start, valid_slots, window):
  """Prefill (start 0) or append (start > 0): queries at positions start + i over a cache of `cap` slots."""
  q_pos = jnp.asarray(start + np.arange(t))[None, :]
  valid = np.zeros((1, cap), bool)
  valid[0, valid_slots] = True
  return AttentionMask.causal(q_pos, jnp.asarray(valid), window)


def _denoiser_row(end, valid, canvas_len, window):
  return AttentionMask.denoiser(jnp.asarray([end], jnp.int32), jnp.asarray(valid)[None, :], canvas_len, window)


def _training_row(prompt_len, prompt_length, canvas_len, canvas_valid, selected, window):
  """Spec §4.3: cache = [prompt ‖ all clean canvases], valid = [prompt != PAD ‖ canvas_mask], end = P + s·C."""
  prompt_valid = np.arange(prompt_len) < prompt_length
  canvas_mask = np.repeat(np.asarray(canvas_valid, bool), canvas_len)
  valid = np.concatenate([prompt_valid, canvas_mask])
  return _denoiser_row(prompt_len + selected * canvas_len, valid, canvas_len, window)


def causal_scenario(t=7, cap=16):
  """Prefill and append rows; T = 7 and S = 16 are no multiples of the 8-row backward blocks."""
  return _stack(
      _causal_row(cap, t, 0, slice(0, 7), 5),  # prefill, local layer (window 5 cuts the 4-wide blocks)
      _causal_row(cap, t, 0, slice(0, 4), None),  # prefill, right-padded prompt, global layer
      _causal_row(cap, t, 6, slice(0, 11), 4),  # append after 6 cached tokens; last 2 appended are padding
      _causal_row(cap, t, 9, slice(0, 16), None),  # append that fills the cache
      _causal_row(cap, t, 0, slice(3, 7), None),  # slots 0-2 are padding: queries 0-2 see nothing
  )


def denoiser_scenario(canvas_len=4, cap=13):
  """Canvas queries over [cache ‖ canvas] with per-row ends, plus two training rows (spec §4.3)."""
  rng = np.random.default_rng(1)
  holes = rng.random(cap) > 0.25
  return _stack(
      _denoiser_row(9, holes, canvas_len, 4),  # local layer: last W-1 = 3 cache slots before end
      _denoiser_row(13, holes, canvas_len, None),  # global layer, whole cache
      _denoiser_row(0, np.ones(cap, bool), canvas_len, 4),  # empty cache: the canvas alone
      _training_row(5, 3, canvas_len, [1, 0], 1, None),  # prompt 3/5 real, canvas 0 clean, canvas 1 empty
      _training_row(5, 5, canvas_len, [1, 1], 2, 6),  # local layer, both clean canvases before the noisy one
  )


# ------------------------------------------------------------------------------------------------
# The structured masks are exactly the model's masks
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("window", [None, 1, 3])
def test_causal_mask_equals_encoder_mask(window):
  rng = np.random.default_rng(0)
  valid = jnp.asarray(rng.random((3, 12)) > 0.3)
  q_pos = jnp.asarray([[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [7, 8, 9, 10, 11]])
  np.testing.assert_array_equal(AttentionMask.causal(q_pos, valid, window).dense(),
                                masks.encoder_mask(q_pos, valid, window))


@pytest.mark.parametrize("window", [None, 1, 4])
def test_denoiser_mask_equals_model_denoiser_mask(window):
  rng = np.random.default_rng(1)
  valid = jnp.asarray(rng.random((3, 10)) > 0.3)
  end = jnp.asarray([0, 6, 10])
  np.testing.assert_array_equal(AttentionMask.denoiser(end, valid, 5, window).dense(),
                                masks.denoiser_mask(end, valid, 5, window))


def test_training_mask_is_the_spec_4_3_mask():
  """Key j of [prompt ‖ clean canvases] is visible iff (j < P and prompt[j] != PAD) or
  ((j - P) // C < s and canvas_mask[j]); the noisy canvas (the tail) is visible (spec §4.3, step 5)."""
  p, c, n = 5, 4, 3
  for prompt_length, canvas_valid, s in [(5, [1, 1, 1], 2), (3, [1, 1, 0], 1), (2, [1, 0, 0], 0)]:
    mask = _training_row(p, prompt_length, c, canvas_valid, s, None).dense()[0]
    j = np.arange(p + n * c)
    canvas_mask = np.concatenate([np.zeros(p, bool), np.repeat(np.asarray(canvas_valid, bool), c)])
    visible = ((j < p) & (j < prompt_length)) | ((j >= p) & ((j - p) // c < s) & canvas_mask)
    expected = np.concatenate([visible, np.ones(c, bool)])
    np.testing.assert_array_equal(mask, np.broadcast_to(expected, (c, expected.size)))


# ------------------------------------------------------------------------------------------------
# Kernel == reference, values and gradients
# ------------------------------------------------------------------------------------------------
def _hidden_slots(mask: AttentionMask, block_sizes: BlockSizes) -> np.ndarray:
  """[B, S]: slots whose forward and backward key blocks no query of the row may see."""
  slot_hidden = ~np.asarray(mask.dense()).any(axis=1)
  b, s = slot_hidden.shape
  out = np.ones_like(slot_hidden)
  for bk in {block_sizes.block_k, block_sizes.block_k_bwd}:
    padded = np.pad(slot_hidden, ((0, 0), (0, -s % bk)), constant_values=True)
    out &= np.repeat(padded.reshape(b, -1, bk).all(axis=2), bk, axis=1)[:, :s]
  return out


def _kernel_and_reference(q, k, v, mask, block_sizes, *, shared=False, reference_dtype=None):
  """(out, grads) of the kernel with NaN in hidden blocks, and of the reference on clean inputs
  (cast to `reference_dtype` if given)."""
  ct = np.random.default_rng(99).normal(size=q.shape)

  def value_and_grads(fn):
    def run(q, k, v, mask):
      ct_ = jnp.asarray(ct, q.dtype)
      if shared:
        out, vjp = jax.vjp(lambda q, k: fn(q, k, k, mask), q, k)
      else:
        out, vjp = jax.vjp(lambda q, k, v: fn(q, k, v, mask), q, k, v)
      return out, vjp(ct_)
    return jax.jit(run)

  poison = jnp.asarray(_hidden_slots(mask, block_sizes))[:, :, None, None]
  bad = lambda x: jnp.where(poison, jnp.nan, x)
  kernel = lambda q, k, v, m: attention(q, k, v, m, block_sizes=block_sizes, interpret=True)
  got = value_and_grads(kernel)(q, bad(k), bad(v), mask)
  cast = (lambda x: x) if reference_dtype is None else (lambda x: x.astype(reference_dtype))
  want = value_and_grads(reference_attention)(cast(q), cast(k), cast(v), mask)
  return got, want, np.asarray(poison[:, :, 0, 0])


def _check(q, k, v, mask, block_sizes, tol=F32_TOL, shared=False):
  (out, grads), (ref, ref_grads), hidden = _kernel_and_reference(q, k, v, mask, block_sizes, shared=shared)
  np.testing.assert_allclose(np.asarray(out, np.float32), np.asarray(ref, np.float32), **tol)
  for name, g, r in zip("qkv", grads, ref_grads):
    np.testing.assert_allclose(np.asarray(g, np.float32), np.asarray(r, np.float32), **tol, err_msg=f"d{name}")
  for g in grads[1:]:  # keys nobody sees get exactly zero gradient, never NaN
    assert np.all(np.asarray(g, np.float32)[hidden] == 0.0)
  return out, hidden


@pytest.mark.parametrize("heads", [(4, 2), (8, 1)], ids=["gqa2", "gqa8"])
def test_causal_prefill_and_append(heads):
  mask = causal_scenario()
  out, hidden = _check(*_qkv(0, 5, 7, 16, *heads, 8), mask, SMALL)
  np.testing.assert_array_equal(out[4, :3], 0.0)  # rows that see no key give 0
  assert hidden[[0, 1, 2, 4]].sum(axis=1).min() >= 4  # whole hidden blocks (NaN there) in most rows


@pytest.mark.parametrize("heads", [(4, 2), (8, 1)], ids=["gqa2", "gqa8"])
def test_denoiser_and_training_denoiser(heads):
  mask = denoiser_scenario()
  _, hidden = _check(*_qkv(1, 5, 4, 17, *heads, 8), mask, SMALL)
  assert hidden[[0, 2, 4]].sum(axis=1).min() >= 4  # before the window, past `end`, an empty cache


def test_rows_that_see_something_equal_the_model_attention_unmodified():
  """Outside empty rows the reference is the model's own `dot_product_attention` on the dense mask."""
  mask = causal_scenario()
  q, k, v = _qkv(0, 5, 7, 16, 4, 2, 8)
  nonempty = np.asarray(mask.dense()).any(axis=2)
  ours = attention(q, k, v, mask, block_sizes=SMALL, interpret=True)
  np.testing.assert_allclose(np.asarray(ours)[nonempty], np.asarray(dot_product_attention(q, k, v, mask.dense()))[
      nonempty], **F32_TOL)


@pytest.mark.parametrize("head_dim,heads,window", [(256, (4, 2), 3), (512, (8, 1), None)],
                         ids=["local-h256-gqa2", "global-h512-gqa8"])
def test_real_head_dims(head_dim, heads, window):
  mask = _stack(_denoiser_row(5, np.ones(6, bool), 4, window), _denoiser_row(2, np.ones(6, bool), 4, window))
  _check(*_qkv(5, 2, 4, 10, *heads, head_dim), mask, BlockSizes(4, 4, 4, 4))


def test_bf16_inputs_f32_accumulation():
  """bf16 in, bf16 out; both sides see the same bf16 inputs, so only the rounding of P, O and grads differs."""
  mask = denoiser_scenario()
  q, k, v = _qkv(6, 5, 4, 17, 4, 2, 8, dtype=jnp.bfloat16)
  (out, grads), (ref, ref_grads), _ = _kernel_and_reference(q, k, v, mask, SMALL, reference_dtype=jnp.float32)
  assert out.dtype == jnp.bfloat16 and all(g.dtype == jnp.bfloat16 for g in grads)
  f32 = lambda x: np.asarray(x, np.float32)
  np.testing.assert_allclose(f32(out), ref, atol=2e-2, rtol=2e-2)
  for name, g, r in zip("qkv", grads, ref_grads):
    np.testing.assert_allclose(f32(g), r, atol=5e-2, rtol=5e-2, err_msg=f"d{name}")


def _all_eqns(jaxpr):
  """Every equation of a jaxpr, including those of nested jaxprs (jit, custom_vjp, loops)."""
  for eqn in jaxpr.eqns:
    yield eqn
    for param in eqn.params.values():
      for sub in param if isinstance(param, (tuple, list)) else (param,):
        if isinstance(sub, jax.extend.core.ClosedJaxpr):
          yield from _all_eqns(sub.jaxpr)
        elif isinstance(sub, jax.extend.core.Jaxpr):
          yield from _all_eqns(sub)


def test_shared_k_v_is_one_operand():
  """K = V sharing: one array passed as both is handed to every kernel once; its gradient is dK + dV."""
  mask = denoiser_scenario()
  q, k, _ = _qkv(7, 5, 4, 17, 8, 1, 8)
  _check(q, k, k, mask, SMALL, shared=True)
  grad = jax.grad(lambda q, k: jnp.sum(attention(q, k, k, mask, block_sizes=SMALL, interpret=True)), argnums=(0, 1))
  calls = [e for e in _all_eqns(jax.make_jaxpr(grad)(q, k).jaxpr) if e.primitive.name == "pallas_call"]
  assert len(calls) == 3  # forward, dQ, dK/dV
  for call in calls:
    # K/V-shaped operands ([B, S padded, 1 KV head, H]; q, dO are [B, T, 8 heads, H]).
    kv_operands = [x for x in call.invars if x.aval.ndim == 4 and x.aval.shape[2] == 1]
    assert len(kv_operands) == 1, call.params["name"]


def test_dense_mask_is_rejected():
  q, k, v = _qkv(8, 1, 2, 3, 2, 1, 8)
  with pytest.raises(TypeError, match="structured"):
    attention(q, k, v, jnp.ones((1, 2, 3), bool))


# ------------------------------------------------------------------------------------------------
# The visit lists are exactly the blocks holding a visible key
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("scenario", [causal_scenario, denoiser_scenario])
@pytest.mark.parametrize("bq,bk", [(4, 4), (2, 8)])
def test_visit_lists_are_exactly_the_visible_blocks(scenario, bq, bk):
  mask = scenario()
  t, s = mask.num_queries, mask.num_keys
  tp, sp = -(-t // bq) * bq, -(-s // bk) * bk
  lo = jnp.pad(mask.lo, ((0, 0), (0, tp - t)), constant_values=2**30)
  hi = jnp.pad(mask.hi, ((0, 0), (0, tp - t)))
  tables = jax.jit(block_tables, static_argnums=(3, 4, 5))(_key_info(mask, sp), lo, hi, t, bq, bk)
  kv_count, kv_list, q_count, q_list = map(np.asarray, tables)
  dense = np.zeros((mask.key_valid.shape[0], tp, sp), bool)
  dense[:, :t, :s] = np.asarray(mask.dense())
  expected = dense.reshape(dense.shape[0], tp // bq, bq, sp // bk, bk).any(axis=(2, 4))  # [B, nq, nk]
  assert 0 < expected.sum() < expected.size
  for b in range(expected.shape[0]):
    for i in range(expected.shape[1]):
      np.testing.assert_array_equal(kv_list[b, i, :kv_count[b, i]], np.nonzero(expected[b, i])[0])
    for j in range(expected.shape[2]):
      np.testing.assert_array_equal(q_list[b, j, :q_count[b, j]], np.nonzero(expected[b, :, j])[0])


# ------------------------------------------------------------------------------------------------
# GPU lowering, checked without a GPU
# ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("head_dim,heads,window", [(256, (16, 8), 1024), (512, (16, 2), None), (8, (4, 2), 4)],
                         ids=["local-h256", "global-h512", "tiny-h8-padded"])
def test_kernels_lower_to_triton(head_dim, heads, window):
  """Forward, dQ and dK/dV kernels pass the Pallas -> Triton lowering for CUDA (power-of-two tiles, >= 16
  wide dots, supported primitives), at the real shapes, in bf16; compiling and running need a GPU."""
  n, kv = heads
  q = jnp.zeros((1, 256, n, head_dim), jnp.bfloat16)
  k = jnp.zeros((1, 1024 + 256, kv, head_dim), jnp.bfloat16)
  mask = AttentionMask.denoiser(jnp.asarray([900]), jnp.ones((1, 1024), bool), 256, window)

  def fwd_bwd(q, k, v):
    out, vjp = jax.vjp(lambda q, k, v: attention(q, k, v, mask, interpret=False), q, k, v)
    return vjp(out)

  for v in (k, k + 1):  # shared K = V, and separate V
    text = jax.jit(fwd_bwd).trace(q, k, v).lower(lowering_platforms=("cuda",)).as_text()
    assert text.count("xla.gpu.triton") == 3
