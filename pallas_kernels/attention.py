"""Flash attention for DiffusionGemma's three masks, forward and backward, beside its XLA reference (`reference.py`).

    out = attention(q_BxTxNxH, k_BxSxKxH, v_BxSxKxH, mask)        # mask: mask_spec.AttentionMask

- Blocked online softmax (FlashAttention-2) with float32 statistics and accumulators; bf16 or f32 inputs.
- GQA: query head n reads KV head n // (N / K), through the BlockSpec index map (no repeat_kv copy).
- K = V sharing: pass the same array as k and v and the kernels read it once per block (one operand,
  one load, one fused dK+dV output); nothing duplicates it.
- The mask is structured (`AttentionMask`), never dense: before the kernel runs, a tiny XLA pass turns it
  into per-(row, query block) lists of the key blocks that hold at least one visible key, and the kernels
  loop over those lists only. A block the mask fully hides (outside the causal range or the window, past
  the denoiser's `end`, or all padding) is never loaded, so it costs nothing (and NaNs there cannot leak).
- Rows that see no key at all produce 0 (the XLA reference would average every value; those rows are
  padding whose outputs nothing reads). `reference_attention` states that convention.
- Backward: a dQ kernel (grid over query blocks) and a dK/dV kernel (grid over key blocks, looping over
  the G query heads of its KV head), both driven by the same block lists, recomputing probabilities from
  the saved log-sum-exp. Nothing of size T x S is ever materialised.

Pallas on GPU lowers through Triton (grid + BlockSpecs); on any other backend the kernels run in
interpret mode, which is how the CPU tests check them.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from pallas_kernels.mask_spec import AttentionMask
from pallas_kernels.reference import reference_attention  # (re-exported: the kernel's contract)

try:  # Triton compiler parameters (num_warps, num_stages); only used when compiling for a GPU.
  from jax.experimental.pallas import triton as _plgpu
except ImportError:  # pragma: no cover - a jax without the Triton backend
  _plgpu = None

__all__ = ["AttentionMask", "BlockSizes", "attention", "default_block_sizes", "reference_attention", "block_tables"]

_NEG = -1e30  # running-max start value: finite, so exp(m_old - m_new) never computes inf - inf
_BIG_LSE = 1e30  # log-sum-exp stored for rows that see nothing: exp(s - _BIG_LSE) == 0
_NO_RANGE = 2**30  # `lo` of padded queries: their ranged part is empty
_HIDDEN, _RANGED, _TAIL = 0, 1, 2  # per-key class in the kernels' `kinfo` row


def interpret_default() -> bool:
  """Compile with Triton on GPUs; everywhere else run the kernels in Pallas' interpreter."""
  return jax.default_backend() != "gpu"


def triton_compiler_params(interpret: bool, num_warps: int, num_stages: int):
  """Triton's CompilerParams (named TritonCompilerParams in older jax), or None in interpret mode."""
  if interpret or _plgpu is None:
    return None
  params = getattr(_plgpu, "CompilerParams", None) or getattr(_plgpu, "TritonCompilerParams")
  return params(num_warps=num_warps, num_stages=num_stages)


@dataclasses.dataclass(frozen=True)
class BlockSizes:
  """Tile sizes. Powers of two; on a GPU every one must be >= 16 (Triton's smallest dot)."""
  block_q: int = 64
  block_k: int = 64
  block_q_bwd: int = 32
  block_k_bwd: int = 32
  num_warps: int = 8
  num_stages: int = 2

  @classmethod
  def for_head_dim(cls, head_dim: int) -> "BlockSizes":
    # Head dim 512 (global layers): a [64, 512] bf16 K and V tile double-buffered would need 256 KiB of
    # shared memory, more than an H100/H200 SM has, and the f32 accumulators would spill; halve the tiles.
    if head_dim >= 512:
      return cls(block_q=32, block_k=32, block_q_bwd=32, block_k_bwd=16)
    if head_dim <= 64:
      return cls(num_warps=4)
    return cls()


def default_block_sizes(head_dim: int) -> BlockSizes:
  """What the model's attention hook gets (it passes no block sizes)."""
  return BlockSizes.for_head_dim(head_dim)


# -------------------------------------------------------------------------------------------------
# Block tables: which key blocks each query block must visit (and the transpose, for dK/dV)
# -------------------------------------------------------------------------------------------------
def _key_info(mask: AttentionMask, padded_len: int) -> Int[Array, "B Sp"]:
  """Per key slot: _RANGED (valid cache slot, subject to lo/hi), _TAIL (always visible) or _HIDDEN."""
  b = mask.key_valid.shape[0]
  ranged = jnp.where(mask.key_valid, _RANGED, _HIDDEN).astype(jnp.int32)
  tail = jnp.full((b, mask.num_tail), _TAIL, jnp.int32)
  pad = jnp.full((b, padded_len - mask.num_keys), _HIDDEN, jnp.int32)
  return jnp.concatenate([ranged, tail, pad], axis=1)


def block_tables(kinfo_BxSp: Int[Array, "B Sp"], lo_BxTp: Int[Array, "B Tp"], hi_BxTp: Int[Array, "B Tp"],
                 num_queries: int, block_q: int, block_k: int):
  """Visibility of (query block, key block) pairs, compacted into loop lists.

  Returns (kv_count [B, nq], kv_list [B, nq, nk], q_count [B, nk], q_list [B, nk, nq]): for query block i
  the kernels visit key blocks kv_list[b, i, :kv_count[b, i]] (ascending), and for key block j the query
  blocks q_list[b, j, :q_count[b, j]]. A pair is listed iff some key of the block is either a tail key or
  a valid slot inside [min lo, max hi) of the query block: a superset of the truly visible pairs (exact
  for contiguous query ranges), so it is always correct, and it excludes every block the mask hides.
  """
  b, sp = kinfo_BxSp.shape
  tp = lo_BxTp.shape[1]
  nq, nk = tp // block_q, sp // block_k
  q_lo = jnp.clip(jnp.min(lo_BxTp.reshape(b, nq, block_q), axis=2), 0, sp)
  q_hi = jnp.clip(jnp.max(hi_BxTp.reshape(b, nq, block_q), axis=2), 0, sp)
  # Valid slots in [x0, x1) = prefix[x1] - prefix[x0], for every (query block, key block) intersection.
  prefix = jnp.concatenate([jnp.zeros((b, 1), jnp.int32),
                            jnp.cumsum((kinfo_BxSp == _RANGED).astype(jnp.int32), axis=1)], axis=1)
  k_start = (jnp.arange(nk) * block_k)[None, None, :]
  x0 = jnp.maximum(q_lo[:, :, None], k_start)
  x1 = jnp.maximum(jnp.minimum(q_hi[:, :, None], k_start + block_k), x0)
  take = lambda x: jnp.take_along_axis(prefix, x.reshape(b, -1), axis=1).reshape(b, nq, nk)
  ranged_visible = take(x1) > take(x0)
  tail_block = jnp.any((kinfo_BxSp == _TAIL).reshape(b, nk, block_k), axis=2)
  has_query = (jnp.arange(nq) * block_q < num_queries)[None, :, None]  # blocks of padding only: skip
  vis = (ranged_visible | tail_block[:, None, :]) & has_query
  kv_list = jnp.argsort(~vis, axis=2, stable=True).astype(jnp.int32)
  q_list = jnp.argsort(~jnp.swapaxes(vis, 1, 2), axis=2, stable=True).astype(jnp.int32)
  return (jnp.sum(vis, axis=2, dtype=jnp.int32), kv_list, jnp.sum(vis, axis=1, dtype=jnp.int32), q_list)


# -------------------------------------------------------------------------------------------------
# Kernels
# -------------------------------------------------------------------------------------------------
def _visible(info_K, k_start, lo_Q, hi_Q):
  """[Q, K] element mask of one block: tail keys, or valid keys inside each query's [lo, hi)."""
  pos = k_start + jnp.arange(info_K.shape[0], dtype=jnp.int32)
  in_range = (pos[None, :] >= lo_Q[:, None]) & (pos[None, :] < hi_Q[:, None])
  return (info_K[None, :] == _TAIL) | ((info_K[None, :] == _RANGED) & in_range)


def _qk(q_QxH, k_KxH):
  return lax.dot_general(q_QxH, k_KxH, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)


def _dot_t(a_RxA, b_RxB):
  """a^T @ b, contracting the leading (row) axis, accumulated in f32."""
  return lax.dot_general(a_RxA.astype(b_RxB.dtype), b_RxB, (((0,), (0,)), ((), ())),
                         preferred_element_type=jnp.float32)


def _fwd_kernel(kv_count_ref, kv_list_ref, lo_ref, hi_ref, kinfo_ref, q_ref, k_ref, *refs,
                block_k: int, shared: bool):
  v_ref, o_ref, lse_ref = (k_ref, *refs) if shared else refs
  q = q_ref[...]
  lo, hi = lo_ref[...], hi_ref[...]
  block_q, head_dim = q.shape

  def body(j, carry):
    acc, m, l = carry
    start = pl.multiple_of(kv_list_ref[j] * block_k, block_k)
    s = _qk(q, k_ref[pl.ds(start, block_k), :])
    vis = _visible(kinfo_ref[pl.ds(start, block_k)], start, lo, hi)
    m_new = jnp.maximum(m, jnp.max(jnp.where(vis, s, _NEG), axis=1))
    # Select, not add -inf: a row with nothing visible yet keeps p = 0 (and l = 0) exactly.
    p = jnp.where(vis, jnp.exp(s - m_new[:, None]), 0.0)
    corr = jnp.exp(m - m_new)
    v = v_ref[pl.ds(start, block_k), :]
    acc = acc * corr[:, None] + jnp.dot(p.astype(v.dtype), v, preferred_element_type=jnp.float32)
    return acc, m_new, l * corr + jnp.sum(p, axis=1)

  init = (jnp.zeros((block_q, head_dim), jnp.float32), jnp.full((block_q,), _NEG, jnp.float32),
          jnp.zeros((block_q,), jnp.float32))
  acc, m, l = lax.fori_loop(0, kv_count_ref[()], body, init)
  seen = l > 0.0
  l_safe = jnp.where(seen, l, 1.0)
  o_ref[...] = (acc / l_safe[:, None]).astype(o_ref.dtype)
  lse_ref[...] = jnp.where(seen, m + jnp.log(l_safe), _BIG_LSE)


def _dq_kernel(kv_count_ref, kv_list_ref, lo_ref, hi_ref, kinfo_ref, q_ref, do_ref, lse_ref, delta_ref,
               k_ref, *refs, block_k: int, shared: bool):
  v_ref, dq_ref = (k_ref, *refs) if shared else refs
  q, do = q_ref[...], do_ref[...]
  lse, delta = lse_ref[...], delta_ref[...]
  lo, hi = lo_ref[...], hi_ref[...]

  def body(j, dq):
    start = pl.multiple_of(kv_list_ref[j] * block_k, block_k)
    k = k_ref[pl.ds(start, block_k), :]
    v = v_ref[pl.ds(start, block_k), :]
    vis = _visible(kinfo_ref[pl.ds(start, block_k)], start, lo, hi)
    p = jnp.where(vis, jnp.exp(_qk(q, k) - lse[:, None]), 0.0)
    ds = p * (_qk(do, v) - delta[:, None])
    return dq + jnp.dot(ds.astype(k.dtype), k, preferred_element_type=jnp.float32)

  dq = lax.fori_loop(0, kv_count_ref[()], body, jnp.zeros(q.shape, jnp.float32))
  dq_ref[...] = dq.astype(dq_ref.dtype)


def _dkv_kernel(q_count_ref, q_list_ref, lo_ref, hi_ref, kinfo_ref, k_ref, *refs, block_q: int,
                groups: int, shared: bool):
  if shared:
    q_ref, do_ref, lse_ref, delta_ref, dkv_ref = refs
    v_ref = k_ref
  else:
    v_ref, q_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref = refs
  block_k = k_ref.shape[0]
  k_start = pl.program_id(0) * block_k
  num_q_blocks = q_count_ref[()]

  def accumulate():
    k, v = k_ref[...], v_ref[...]
    info = kinfo_ref[...]

    def head(g, carry):  # the G query heads that read this KV head all add into its dK/dV
      def body(j, carry):
        dk, dv = carry
        rows = pl.ds(pl.multiple_of(q_list_ref[j] * block_q, block_q), block_q)
        q, do = q_ref[rows, g, :], do_ref[rows, g, :]
        vis = _visible(info, k_start, lo_ref[rows], hi_ref[rows])
        p = jnp.where(vis, jnp.exp(_qk(q, k) - lse_ref[g, rows][:, None]), 0.0)
        dv = dv + _dot_t(p, do)
        ds = p * (_qk(do, v) - delta_ref[g, rows][:, None])
        return dk + _dot_t(ds, q), dv
      return lax.fori_loop(0, num_q_blocks, body, carry)

    return lax.fori_loop(0, groups, head, (zeros, zeros))

  zeros = jnp.zeros(k_ref.shape, jnp.float32)
  # A key block no query sees is not even loaded: its gradient is exactly zero.
  dk, dv = lax.cond(num_q_blocks > 0, accumulate, lambda: (zeros, zeros))
  if shared:  # one array was both K and V: its gradient is the sum, written once
    dkv_ref[...] = (dk + dv).astype(dkv_ref.dtype)
  else:
    dk_ref[...] = dk.astype(dk_ref.dtype)
    dv_ref[...] = dv.astype(dv_ref.dtype)


# -------------------------------------------------------------------------------------------------
# pallas_call wrappers and the custom VJP
# -------------------------------------------------------------------------------------------------
@dataclasses.dataclass(frozen=True)
class _Config:
  num_queries: int  # before padding
  block_q: int
  block_k: int
  block_q_bwd: int
  block_k_bwd: int
  num_warps: int
  num_stages: int
  shared: bool
  interpret: bool

  def compiler_params(self):
    return triton_compiler_params(self.interpret, self.num_warps, self.num_stages)


def _forward(q, k, v, kinfo, lo, hi, cfg: _Config):
  b, tp, n, h = q.shape
  sp, kv_heads = k.shape[1], k.shape[2]
  groups = n // kv_heads
  bq, bk = cfg.block_q, cfg.block_k
  nq, nk = tp // bq, sp // bk
  kv_count, kv_list, _, _ = block_tables(kinfo, lo, hi, cfg.num_queries, bq, bk)
  kv_spec = pl.BlockSpec((None, sp, None, h), lambda i, bi, ni: (bi, 0, lax.div(ni, groups), 0))
  in_specs = [
      pl.BlockSpec((None, None), lambda i, bi, ni: (bi, i)),  # kv_count
      pl.BlockSpec((None, None, nk), lambda i, bi, ni: (bi, i, 0)),  # kv_list
      pl.BlockSpec((None, bq), lambda i, bi, ni: (bi, i)),  # lo
      pl.BlockSpec((None, bq), lambda i, bi, ni: (bi, i)),  # hi
      pl.BlockSpec((None, sp), lambda i, bi, ni: (bi, 0)),  # kinfo
      pl.BlockSpec((None, bq, None, h), lambda i, bi, ni: (bi, i, ni, 0)),  # q
      kv_spec,  # k
  ] + ([] if cfg.shared else [kv_spec])
  operands = [kv_count, kv_list, lo, hi, kinfo, q, k] + ([] if cfg.shared else [v])
  o, lse = pl.pallas_call(
      functools.partial(_fwd_kernel, block_k=bk, shared=cfg.shared),
      grid=(nq, b, n),
      in_specs=in_specs,
      out_specs=[pl.BlockSpec((None, bq, None, h), lambda i, bi, ni: (bi, i, ni, 0)),
                 pl.BlockSpec((None, None, bq), lambda i, bi, ni: (bi, ni, i))],
      out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, n, tp), jnp.float32)],
      compiler_params=cfg.compiler_params(),
      interpret=cfg.interpret,
      name="dgemma_flash_fwd",
  )(*operands)
  return o, lse


def _backward(q, k, v, kinfo, lo, hi, o, lse, do, cfg: _Config):
  b, tp, n, h = q.shape
  sp, kv_heads = k.shape[1], k.shape[2]
  groups = n // kv_heads
  bq, bk = cfg.block_q_bwd, cfg.block_k_bwd
  nq, nk = tp // bq, sp // bk
  kv_count, kv_list, q_count, q_list = block_tables(kinfo, lo, hi, cfg.num_queries, bq, bk)
  # delta_i = sum_h dO_ih O_ih (FlashAttention-2): one fused elementwise pass in XLA.
  delta = jnp.einsum("btnh,btnh->bnt", o.astype(jnp.float32), do.astype(jnp.float32))
  kvs = [k] if cfg.shared else [k, v]

  full_kv = pl.BlockSpec((None, sp, None, h), lambda i, bi, ni: (bi, 0, lax.div(ni, groups), 0))
  q_block = pl.BlockSpec((None, bq, None, h), lambda i, bi, ni: (bi, i, ni, 0))
  row_block = pl.BlockSpec((None, None, bq), lambda i, bi, ni: (bi, ni, i))
  dq = pl.pallas_call(
      functools.partial(_dq_kernel, block_k=bk, shared=cfg.shared),
      grid=(nq, b, n),
      in_specs=[pl.BlockSpec((None, None), lambda i, bi, ni: (bi, i)),
                pl.BlockSpec((None, None, nk), lambda i, bi, ni: (bi, i, 0)),
                pl.BlockSpec((None, bq), lambda i, bi, ni: (bi, i)),
                pl.BlockSpec((None, bq), lambda i, bi, ni: (bi, i)),
                pl.BlockSpec((None, sp), lambda i, bi, ni: (bi, 0)),
                q_block, q_block, row_block, row_block] + [full_kv] * len(kvs),
      out_specs=q_block,
      out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
      compiler_params=cfg.compiler_params(),
      interpret=cfg.interpret,
      name="dgemma_flash_dq",
  )(kv_count, kv_list, lo, hi, kinfo, q, do, lse, delta, *kvs)

  kv_block = pl.BlockSpec((None, bk, None, h), lambda j, bi, ki: (bi, j, ki, 0))
  group_q = pl.BlockSpec((None, tp, groups, h), lambda j, bi, ki: (bi, 0, ki, 0))  # the G heads of KV head ki
  group_rows = pl.BlockSpec((None, groups, tp), lambda j, bi, ki: (bi, ki, 0))
  dkv = pl.pallas_call(
      functools.partial(_dkv_kernel, block_q=bq, groups=groups, shared=cfg.shared),
      grid=(nk, b, kv_heads),
      in_specs=[pl.BlockSpec((None, None), lambda j, bi, ki: (bi, j)),
                pl.BlockSpec((None, None, nq), lambda j, bi, ki: (bi, j, 0)),
                pl.BlockSpec((None, tp), lambda j, bi, ki: (bi, 0)),
                pl.BlockSpec((None, tp), lambda j, bi, ki: (bi, 0)),
                pl.BlockSpec((None, bk), lambda j, bi, ki: (bi, j))]
               + [kv_block] * len(kvs) + [group_q, group_q, group_rows, group_rows],
      out_specs=[kv_block] * len(kvs),
      out_shape=[jax.ShapeDtypeStruct(x.shape, x.dtype) for x in kvs],
      compiler_params=cfg.compiler_params(),
      interpret=cfg.interpret,
      name="dgemma_flash_dkv",
  )(q_count, q_list, lo, hi, kinfo, *kvs, q, do, lse, delta)
  return dq, dkv


@functools.partial(jax.custom_vjp, nondiff_argnums=(6,))
def _flash(q, k, v, kinfo, lo, hi, cfg: _Config):
  return _forward(q, k, v, kinfo, lo, hi, cfg)[0]


def _flash_fwd(q, k, v, kinfo, lo, hi, cfg: _Config):
  o, lse = _forward(q, k, v, kinfo, lo, hi, cfg)
  return o, (q, k, v, kinfo, lo, hi, o, lse)


def _flash_bwd(cfg: _Config, residuals, do):
  q, k, v, kinfo, lo, hi, o, lse = residuals
  dq, dkv = _backward(q, k, v, kinfo, lo, hi, o, lse, do, cfg)
  dk, dv = (dkv[0], None) if cfg.shared else dkv
  return dq, dk, dv, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _fit(block: int, n: int, minimum: int) -> int:
  """The block, shrunk (to a power of two, at least `minimum`) when the whole axis is shorter."""
  return min(block, max(minimum, pl.next_power_of_2(n)))


def _pad_axis1(x: Array, length: int) -> Array:
  """Pads axis 1 (only when needed: aligned shapes never pay for a copy)."""
  if x.shape[1] == length:
    return x
  widths = [(0, 0)] * x.ndim
  widths[1] = (0, length - x.shape[1])
  return jnp.pad(x, widths)


def _pad_last(x: Array, length: int) -> Array:
  if x.shape[-1] == length:
    return x
  return jnp.pad(x, [(0, 0)] * (x.ndim - 1) + [(0, length - x.shape[-1])])


def attention(q_BxTxNxH: Float[Array, "B T N H"], k_BxSxKxH: Float[Array, "B S K H"],
              v_BxSxKxH: Float[Array, "B S K H"], mask: AttentionMask, *,
              block_sizes: BlockSizes | None = None, interpret: bool | None = None) -> Float[Array, "B T N H"]:
  """Flash attention of q over keys/values under a structured mask; differentiable in q, k and v.

  The drop-in for `reference.dot_product_attention(q, k, v, mask.dense())` (up to rows that
  see nothing, which give 0). Pass the same array as k and v to share it (read once, no copy).
  """
  if not isinstance(mask, AttentionMask):
    raise TypeError("pallas attention needs a structured pallas_kernels.mask_spec.AttentionMask "
                    f"(a dense mask would defeat block skipping), got {type(mask).__name__}")
  b, t, n, h = q_BxTxNxH.shape
  s, kv_heads = k_BxSxKxH.shape[1], k_BxSxKxH.shape[2]
  shared = v_BxSxKxH is k_BxSxKxH
  if k_BxSxKxH.shape != v_BxSxKxH.shape or (k_BxSxKxH.shape[0], k_BxSxKxH.shape[3]) != (b, h):
    raise ValueError(f"k {k_BxSxKxH.shape} and v {v_BxSxKxH.shape} must both be [B={b}, S, K, H={h}]")
  if n % kv_heads:
    raise ValueError(f"{n} query heads are not a multiple of {kv_heads} KV heads")
  if (mask.num_queries, mask.num_keys) != (t, s) or mask.key_valid.shape[0] != b:
    raise ValueError(f"mask covers {mask.num_queries} queries x {mask.num_keys} keys (batch "
                     f"{mask.key_valid.shape[0]}); attention has {t} x {s} (batch {b})")
  interpret = interpret_default() if interpret is None else interpret
  bs = block_sizes or default_block_sizes(h)
  minimum = 1 if interpret else 16
  cfg = _Config(num_queries=t,
                block_q=_fit(bs.block_q, t, minimum), block_k=_fit(bs.block_k, s, minimum),
                block_q_bwd=_fit(bs.block_q_bwd, t, minimum), block_k_bwd=_fit(bs.block_k_bwd, s, minimum),
                num_warps=bs.num_warps, num_stages=bs.num_stages, shared=shared, interpret=interpret)
  # Block sizes are powers of two, so padding to the larger one suits both passes.
  tp = _round_up(t, max(cfg.block_q, cfg.block_q_bwd))
  sp = _round_up(s, max(cfg.block_k, cfg.block_k_bwd))
  # Triton tiles are powers of two and its dots need K >= 16: zero-pad an odd or tiny head dim (zeros add
  # nothing to q·k, and the padded output columns are dropped). The real model's 256 and 512 need nothing.
  hp = h if interpret else max(16, pl.next_power_of_2(h))
  q = _pad_axis1(_pad_last(q_BxTxNxH, hp), tp)
  k = _pad_axis1(_pad_last(k_BxSxKxH, hp), sp)
  v = None if shared else _pad_axis1(_pad_last(v_BxSxKxH, hp), sp)
  kinfo = _key_info(mask, sp)
  lo = jnp.pad(mask.lo.astype(jnp.int32), ((0, 0), (0, tp - t)), constant_values=_NO_RANGE)
  hi = jnp.pad(mask.hi.astype(jnp.int32), ((0, 0), (0, tp - t)))
  return _flash(q, k, v, kinfo, lo, hi, cfg)[:, :t, :, :h]
