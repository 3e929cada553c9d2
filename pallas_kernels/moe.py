"""Grouped matmul (dropless MoE) kernels, forward and backward, beside their XLA references (`reference.py`).

    out = gmm(lhs_MxC, rhs_ExCxO, group_sizes_E)                 # rows sorted by group: lhs[r] @ rhs[g(r)]
    y   = moe_experts(x_TxD, weights_TxK, experts_TxK, gate_up_ExDx2F, down_ExFxD)

`gmm` has `jax.lax.ragged_dot`'s contract: rows [ends[g-1], ends[g]) of lhs belong to group g, rows past
sum(group_sizes) give 0, empty groups cost nothing. Its custom VJP uses two more kernels:
dlhs = gmm(dout, rhs^T) (the same kernel reading rhs transposed in place, so the expert weights are never
copied) and drhs = tgmm(lhs, dout): per group, lhs_g^T @ dout_g.

Kernel layout (Triton-style grid + BlockSpecs; interpret mode off GPU):
- gmm is output-stationary: program (i, j) owns output tile [rows i·bm.., cols j·bo..] and loops over the
  non-empty groups whose rows touch that tile (a per-tile start group plus a "next non-empty group" table),
  accumulating each group's product in f32 and keeping only that group's rows. Every output tile is written
  once by one program: no atomics, no races, no masked stores.
- tgmm is group-stationary: program (g, a, c) owns drhs[g, a-tile, c-tile] and loops over the row tiles
  of group g only (zero iterations for an empty group), zeroing the rows of neighbouring groups.

`moe_experts` is `reference.experts_sorted` (the model's XLA path, with `lax.ragged_dot`) with `gmm` for both
grouped matmuls: sort the (token, expert) pairs by expert, one gmm for the fused gate/up projection, one for the
down projection, weighted scatter-add back to tokens.
"""

from __future__ import annotations

import dataclasses
import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.experimental import pallas as pl
from jaxtyping import Array, Float, Int

from pallas_kernels.attention import interpret_default, triton_compiler_params
from pallas_kernels.reference import experts_sorted, gmm_reference, moe_dense_reference  # (the last two re-exported)

__all__ = ["DEFAULT_TILING", "GmmTiling", "gmm", "tgmm", "moe_experts", "gmm_reference", "moe_dense_reference"]


@dataclasses.dataclass(frozen=True)
class GmmTiling:
  """Tile sizes (powers of two; >= 16 on a GPU). block_c is the contraction chunk, block_o the output tile."""
  block_m: int = 64
  block_c: int = 64
  block_o: int = 128
  num_warps: int = 4
  num_stages: int = 3


DEFAULT_TILING = GmmTiling()  # what the model's MoE hook gets (it passes no tiling)


# -------------------------------------------------------------------------------------------------
# Group tables (tiny XLA pass over group_sizes)
# -------------------------------------------------------------------------------------------------
def _group_tables(group_sizes_E: Array, num_row_tiles: int, block_m: int):
  """(starts, ends, next_nonempty [E], tile_first_group, tile_num_groups [num_row_tiles])."""
  sizes = group_sizes_E.astype(jnp.int32)
  num_groups = sizes.shape[0]
  ends = jnp.cumsum(sizes)
  starts = ends - sizes
  total = ends[-1]
  nonempty = sizes > 0
  # next_nonempty[g]: the first non-empty group after g (a suffix minimum); clamped so reads stay in range.
  idx = jnp.where(nonempty, jnp.arange(num_groups, dtype=jnp.int32), num_groups)
  later = jnp.concatenate([idx[1:], jnp.array([num_groups], jnp.int32)])
  next_nonempty = jnp.minimum(lax.cummin(later, reverse=True), num_groups - 1)
  tile_start = jnp.arange(num_row_tiles, dtype=jnp.int32) * block_m
  tile_last = jnp.minimum(tile_start + block_m, total) - 1
  # searchsorted(ends, r, 'right') is the group holding row r (always a non-empty one).
  first = jnp.searchsorted(ends, tile_start, side="right").astype(jnp.int32)
  last = jnp.searchsorted(ends, tile_last, side="right").astype(jnp.int32)
  rank = jnp.cumsum(nonempty.astype(jnp.int32))  # non-empty groups up to and including g
  clamp = lambda g: jnp.minimum(g, num_groups - 1)
  count = jnp.where(tile_start < total, rank[clamp(last)] - rank[clamp(first)] + 1, 0)
  return starts, ends, next_nonempty, clamp(first), count.astype(jnp.int32)


# -------------------------------------------------------------------------------------------------
# Kernels
# -------------------------------------------------------------------------------------------------
def _gmm_kernel(first_ref, count_ref, next_ref, starts_ref, ends_ref, lhs_ref, rhs_ref, out_ref, *,
                block_c: int, num_c: int, transpose_rhs: bool):
  block_m, block_o = out_ref.shape
  rows = pl.program_id(0) * block_m + jnp.arange(block_m, dtype=jnp.int32)

  def group(_, carry):
    acc, g = carry

    def chunk(c, part):
      cs = pl.ds(pl.multiple_of(c * block_c, block_c), block_c)
      x = lhs_ref[:, cs]
      if transpose_rhs:  # rhs[g] is [O, C]: contract both operands' last axis, no transposed copy
        w = rhs_ref[g, :, cs]
        return part + lax.dot_general(x, w, (((1,), (1,)), ((), ())), preferred_element_type=jnp.float32)
      return part + jnp.dot(x, rhs_ref[g, cs, :], preferred_element_type=jnp.float32)

    part = lax.fori_loop(0, num_c, chunk, jnp.zeros((block_m, block_o), jnp.float32))
    mine = (rows >= starts_ref[g]) & (rows < ends_ref[g])
    return acc + jnp.where(mine[:, None], part, 0.0), next_ref[g]

  init = (jnp.zeros((block_m, block_o), jnp.float32), first_ref[()])
  acc, _ = lax.fori_loop(0, count_ref[()], group, init)
  out_ref[...] = acc.astype(out_ref.dtype)


def _tgmm_kernel(starts_ref, ends_ref, lhs_ref, dout_ref, out_ref, *, block_m: int):
  start, end = starts_ref[()], ends_ref[()]
  first_tile = lax.div(start, block_m)
  num_tiles = jnp.where(end > start, lax.div(end + block_m - 1, block_m) - first_tile, 0)

  def body(t, acc):
    r0 = pl.multiple_of((first_tile + t) * block_m, block_m)
    rows = r0 + jnp.arange(block_m, dtype=jnp.int32)
    mine = (rows >= start) & (rows < end)
    x = lhs_ref[pl.ds(r0, block_m), :]
    x = jnp.where(mine[:, None], x, jnp.zeros_like(x))  # rows of the neighbouring groups contribute 0
    y = dout_ref[pl.ds(r0, block_m), :]
    return acc + lax.dot_general(x, y.astype(x.dtype), (((0,), (0,)), ((), ())),
                                 preferred_element_type=jnp.float32)

  acc = lax.fori_loop(0, num_tiles, body, jnp.zeros(out_ref.shape, jnp.float32))
  out_ref[...] = acc.astype(out_ref.dtype)


@dataclasses.dataclass(frozen=True)
class _Config:
  block_m: int
  block_c: int  # contraction chunk of the forward product (lhs columns)
  block_o: int  # output tile of the forward product
  num_warps: int
  num_stages: int
  interpret: bool

  def compiler_params(self):
    return triton_compiler_params(self.interpret, self.num_warps, self.num_stages)


def _gmm_call(lhs, rhs, group_sizes, cfg: _Config, *, transpose_rhs: bool, block_c: int, block_o: int):
  """lhs [Mp, C] times rhs[g] ([C, O], or [O, C] read transposed) -> [Mp, O]. All dims already tiled."""
  mp, c = lhs.shape
  num_groups = rhs.shape[0]
  o = rhs.shape[1] if transpose_rhs else rhs.shape[2]
  bm = cfg.block_m
  starts, ends, nxt, first, count = _group_tables(group_sizes, mp // bm, bm)
  whole_e = pl.BlockSpec((num_groups,), lambda i, j: (0,))
  rhs_spec = (pl.BlockSpec((num_groups, block_o, c), lambda i, j: (0, j, 0)) if transpose_rhs
              else pl.BlockSpec((num_groups, c, block_o), lambda i, j: (0, 0, j)))
  return pl.pallas_call(
      functools.partial(_gmm_kernel, block_c=block_c, num_c=c // block_c, transpose_rhs=transpose_rhs),
      grid=(mp // bm, o // block_o),
      in_specs=[pl.BlockSpec((None,), lambda i, j: (i,)), pl.BlockSpec((None,), lambda i, j: (i,)),
                whole_e, whole_e, whole_e,
                pl.BlockSpec((bm, c), lambda i, j: (i, 0)), rhs_spec],
      out_specs=pl.BlockSpec((bm, block_o), lambda i, j: (i, j)),
      out_shape=jax.ShapeDtypeStruct((mp, o), lhs.dtype),
      compiler_params=cfg.compiler_params(),
      interpret=cfg.interpret,
      name="dgemma_gmm",
  )(first, count, nxt, starts, ends, lhs, rhs)


def _tgmm_call(lhs, dout, group_sizes, cfg: _Config, out_dtype):
  """Per group g: lhs[rows of g]^T @ dout[rows of g] -> [E, C, O]. All dims already tiled."""
  mp, c = lhs.shape
  o = dout.shape[1]
  num_groups = group_sizes.shape[0]
  bc, bo = cfg.block_c, cfg.block_o
  starts, ends, _, _, _ = _group_tables(group_sizes, 1, cfg.block_m)
  scalar = pl.BlockSpec((None,), lambda g, a, b: (g,))
  return pl.pallas_call(
      functools.partial(_tgmm_kernel, block_m=cfg.block_m),
      grid=(num_groups, c // bc, o // bo),
      in_specs=[scalar, scalar, pl.BlockSpec((mp, bc), lambda g, a, b: (0, a)),
                pl.BlockSpec((mp, bo), lambda g, a, b: (0, b))],
      out_specs=pl.BlockSpec((None, bc, bo), lambda g, a, b: (g, a, b)),
      out_shape=jax.ShapeDtypeStruct((num_groups, c, o), out_dtype),
      compiler_params=cfg.compiler_params(),
      interpret=cfg.interpret,
      name="dgemma_tgmm",
  )(starts, ends, lhs, dout)


@functools.partial(jax.custom_vjp, nondiff_argnums=(3,))
def _gmm(lhs, rhs, group_sizes, cfg: _Config):
  return _gmm_call(lhs, rhs, group_sizes, cfg, transpose_rhs=False, block_c=cfg.block_c, block_o=cfg.block_o)


def _gmm_fwd(lhs, rhs, group_sizes, cfg: _Config):
  return _gmm(lhs, rhs, group_sizes, cfg), (lhs, rhs, group_sizes)


def _gmm_bwd(cfg: _Config, residuals, dout):
  lhs, rhs, group_sizes = residuals
  # dlhs[r] = dout[r] @ rhs[g(r)]^T: contraction over O (chunks of block_o), output tiles over C (block_c).
  dlhs = _gmm_call(dout, rhs, group_sizes, cfg, transpose_rhs=True, block_c=cfg.block_o, block_o=cfg.block_c)
  drhs = _tgmm_call(lhs, dout, group_sizes, cfg, rhs.dtype)
  return dlhs.astype(lhs.dtype), drhs, None


_gmm.defvjp(_gmm_fwd, _gmm_bwd)


def _round_up(x: int, m: int) -> int:
  return -(-x // m) * m


def _tile(dim: int, preferred: int, minimum: int) -> tuple[int, int]:
  """(block, padded dim): the largest power of two <= preferred dividing dim, else pad to a fitting block."""
  b = preferred
  while b >= minimum:
    if dim % b == 0:
      return b, dim
    b //= 2
  b = min(preferred, max(minimum, pl.next_power_of_2(dim)))
  return b, _round_up(dim, b)


def _pad_to(x: Array, shape: tuple[int, ...]) -> Array:
  """Zero-pads up to `shape`; a no-op (no copy) when the shape already fits, as for the real model."""
  if x.shape == shape:
    return x
  return jnp.pad(x, [(0, s - d) for d, s in zip(x.shape, shape)])


def _configure(m: int, c: int, o: int, tiling: GmmTiling | None, interpret: bool | None):
  interpret = interpret_default() if interpret is None else interpret
  tiling = tiling or DEFAULT_TILING
  minimum = 1 if interpret else 16
  bm = min(tiling.block_m, max(minimum, pl.next_power_of_2(m)))
  bc, cp = _tile(c, tiling.block_c, minimum)
  bo, op = _tile(o, tiling.block_o, minimum)
  cfg = _Config(block_m=bm, block_c=bc, block_o=bo, num_warps=tiling.num_warps,
                num_stages=tiling.num_stages, interpret=interpret)
  return cfg, _round_up(m, bm), cp, op


def gmm(lhs_MxC: Float[Array, "M C"], rhs_ExCxO: Float[Array, "E C O"], group_sizes_E: Int[Array, "E"], *,
        tiling: GmmTiling | None = None, interpret: bool | None = None) -> Float[Array, "M O"]:
  """Grouped matmul with `lax.ragged_dot`'s contract; differentiable in lhs and rhs.

  Rows of lhs are sorted by group: group g owns group_sizes[g] consecutive rows; rows past
  sum(group_sizes) (which must not exceed M) give 0. Accumulates in f32, returns lhs's dtype.
  """
  m, c = lhs_MxC.shape
  num_groups, c2, o = rhs_ExCxO.shape
  if c2 != c or group_sizes_E.shape != (num_groups,):
    raise ValueError(f"gmm shapes: lhs {lhs_MxC.shape}, rhs {rhs_ExCxO.shape}, group_sizes {group_sizes_E.shape}")
  cfg, mp, cp, op = _configure(m, c, o, tiling, interpret)
  out = _gmm(_pad_to(lhs_MxC, (mp, cp)), _pad_to(rhs_ExCxO, (num_groups, cp, op)),
             group_sizes_E.astype(jnp.int32), cfg)
  return out[:m, :o]


def tgmm(lhs_MxC: Float[Array, "M C"], dout_MxO: Float[Array, "M O"], group_sizes_E: Int[Array, "E"], *,
         tiling: GmmTiling | None = None, interpret: bool | None = None) -> Float[Array, "E C O"]:
  """Per-group lhs_g^T @ dout_g (the weight gradient of gmm); empty groups give zeros."""
  m, c = lhs_MxC.shape
  o = dout_MxO.shape[1]
  cfg, mp, cp, op = _configure(m, c, o, tiling, interpret)
  out = _tgmm_call(_pad_to(lhs_MxC, (mp, cp)), _pad_to(dout_MxO, (mp, op)), group_sizes_E.astype(jnp.int32),
                   cfg, jnp.result_type(lhs_MxC, dout_MxO))
  return out[:, :c, :o]


def moe_experts(x_TxD: Float[Array, "T D"], weights_TxK: Float[Array, "T K"], experts_TxK: Int[Array, "T K"],
                gate_up_ExDx2F: Float[Array, "E D 2F"], down_ExFxD: Float[Array, "E F D"], *,
                tiling: GmmTiling | None = None, interpret: bool | None = None) -> Float[Array, "T D"]:
  """Dropless MoE with Pallas grouped matmuls: `reference.experts_sorted` with `gmm`."""
  return experts_sorted(x_TxD, weights_TxK, experts_TxK, gate_up_ExDx2F, down_ExFxD,
                        grouped_matmul=functools.partial(gmm, tiling=tiling, interpret=interpret))
