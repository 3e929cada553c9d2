"""The position-feature table of a model with `ModelConfig.num_position_features` = F > 0.

An int table [L, F]: row p holds the F feature ids of position p (ids into the learned position rows; positions
past L take row L - 1). It is supplied by the task (e.g. a grid's segment / row / column / box of each position),
reaches the model as an array argument (`position_features=` of encode and denoise), never through the hashed,
jit-static ModelConfig, and travels with the weights as the checkpoint's `metadata["position_features"]`, a JSON
list of rows (`dgemma.checkpoints.native`).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from dgemma.config import ModelConfig

METADATA_KEY = "position_features"  # where a checkpoint's metadata (and a run's run.json) keeps the table


def check(config: ModelConfig, table: Any) -> Any:
  """`table` as an int32 [L, F] array, checked against `config`; None for a model without position features.
  A missing, misshapen or out-of-range table is a one-line ValueError (a traced table: its shape only)."""
  f = config.num_position_features
  if isinstance(table, jax.core.Tracer):
    if table.ndim != 2 or table.shape[1] != f or not jnp.issubdtype(table.dtype, jnp.integer):
      raise ValueError(f"position_features must be an integer table [L, num_position_features={f}], got "
                       f"{table.dtype} {table.shape}")
    return table.astype(jnp.int32)
  given = table is not None and np.size(table) > 0
  if not f:
    if given:
      raise ValueError("a position-feature table was given for a model without position features "
                       "(num_position_features=0)")
    return None
  if not given:
    raise ValueError(f"this model reads an [L, {f}] position-feature table: pass position_features= (a checkpoint "
                     f"keeps it in metadata[{METADATA_KEY!r}], a training config in config.position_features)")
  ids = np.asarray(table)
  if ids.ndim != 2 or ids.shape[1] != f or not np.issubdtype(ids.dtype, np.integer):
    raise ValueError(f"position_features must be an integer table [L, num_position_features={f}], got "
                     f"{ids.dtype} {ids.shape}")
  if ids.min() < 0 or ids.max() >= config.learned_positions:
    raise ValueError(f"position_features ids must lie in [0, learned_positions={config.learned_positions}), got "
                     f"[{ids.min()}, {ids.max()}]")
  return ids.astype(np.int32)


def to_json(table: Any) -> list[list[int]]:
  """The table as the list of rows a checkpoint's JSON metadata records."""
  return np.asarray(table, np.int64).tolist()
