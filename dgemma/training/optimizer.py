"""The optax chain of the official recipe: clip -> Adam (or factored RMS) -> weight decay -> warmup+cosine LR.

`name="muon"` (not in the official recipe): clip -> Muon on the weight matrices (momentum orthogonalised by
Newton-Schulz iterations; optax.contrib.muon) and Adam on everything else (embeddings, norms, scalars, the
relation bias, the router), both on the same warmup+cosine schedule. Muon's updates are rescaled to Adam's
RMS (`consistent_rms=0.2`, Moonlight's rule), so one learning rate serves both halves; `muon_lr_multiplier`
scales Muon's.

`lr_multipliers` (not in the official recipe) scales the final update of every parameter with a given name:
{"relation_bias": 10} moves those weights ten times as fast. Adam moves a weight by about the learning rate per
step whatever its gradient's size, so a weight that starts at zero and must grow large (a relation bias that
confines a head to its row wants logits of ~5-10) is otherwise bounded by the sum of the schedule (~4 for the
default config's 2,500 steps).
"""

from __future__ import annotations

from typing import Any

import jax
import ml_collections
import optax
import optax.contrib

from dgemma import sharding

# Logical axes that make a parameter one of the network's weight matrices (beside "embed"); "expert" is a
# batch axis (each expert's matrix is orthogonalised on its own).
_MATRIX_AXES = ("heads", "kv_heads", "head_dim", "mlp")


def learning_rate_schedule(cfg: ml_collections.ConfigDict) -> optax.Schedule:
  """Linear warmup from 0 to `learning_rate`, then cosine decay to `end_learning_rate` at `decay_steps`."""
  return optax.warmup_cosine_decay_schedule(
      init_value=0.0, peak_value=cfg.learning_rate, warmup_steps=cfg.warmup_steps,
      decay_steps=max(cfg.decay_steps, cfg.warmup_steps + 1), end_value=cfg.end_learning_rate)


def muon_axes(axes: tuple[str | None, ...]) -> optax.contrib.MuonDimensionNumbers | None:
  """Muon's (input, output) axes for a parameter with these logical axes; None: not a weight matrix (Adam).

  [embed, heads, head_dim] (q/k/v) and [embed, mlp] map embed -> the rest; [heads, head_dim, embed] (o) and
  [mlp, embed] (down) map the rest -> embed.
  """
  if "embed" not in axes or not any(a in _MATRIX_AXES for a in axes):
    return None
  matrix = [i for i, a in enumerate(axes) if a != "expert"]
  embed = axes.index("embed")
  if embed == matrix[-1]:
    return optax.contrib.MuonDimensionNumbers(reduction_axis=tuple(matrix[:-1]), output_axis=embed)
  return optax.contrib.MuonDimensionNumbers(reduction_axis=embed,
                                            output_axis=tuple(i for i in matrix if i != embed))


def muon_dimension_numbers(params: Any) -> Any:
  """The tree of `muon_axes` for a parameter tree (named by its dict keys, as sharding.py names them)."""
  def one(path, leaf):
    axes = sharding.param_logical_axes(sharding.path_names(path))
    return None if axes is None or len(axes) != leaf.ndim else muon_axes(axes)
  return jax.tree_util.tree_map_with_path(one, params)


def scale_by_name(multipliers: dict[str, float]) -> optax.GradientTransformation:
  """Multiplies the updates of the parameters whose name (last dict key of their path) is in `multipliers`.

  A name that no parameter has is an error (a typo would otherwise change nothing, silently)."""
  multipliers = {str(k): float(v) for k, v in multipliers.items()}

  def factors(tree):
    found = set()

    def one(path, _):
      names = sharding.path_names(path)
      if names and names[-1] in multipliers:
        found.add(names[-1])
        return multipliers[names[-1]]
      return 1.0
    out = jax.tree_util.tree_map_with_path(one, tree)
    if set(multipliers) - found:
      raise ValueError(f"optimizer.lr_multipliers names {sorted(set(multipliers) - found)}, which no trainable "
                       f"parameter has")
    return out

  def init_fn(params):
    factors(params)
    return optax.EmptyState()

  def update_fn(updates, state, params=None):
    del params
    return jax.tree.map(lambda u, m: u if m == 1.0 else u * m, updates, factors(updates)), state

  return optax.GradientTransformation(init_fn, update_fn)


def make_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  multipliers = dict(cfg.get("lr_multipliers", None) or {})
  tx = _base_optimizer(cfg)
  return optax.chain(tx, scale_by_name(multipliers)) if multipliers else tx


def _base_optimizer(cfg: ml_collections.ConfigDict) -> optax.GradientTransformation:
  schedule = learning_rate_schedule(cfg)
  clip = optax.clip_by_global_norm(cfg.grad_clip_norm)
  if cfg.name == "muon":
    multiplier = cfg.get("muon_lr_multiplier", 1.0)
    return optax.chain(clip, optax.contrib.muon(
        learning_rate=lambda step: multiplier * schedule(step), adam_learning_rate=schedule,
        beta=cfg.b1, adam_b1=cfg.b1, adam_b2=cfg.b2, eps=cfg.eps,
        weight_decay=cfg.weight_decay, adam_weight_decay=cfg.weight_decay,
        consistent_rms=0.2, muon_weight_dimension_numbers=muon_dimension_numbers))
  if cfg.name == "adam":
    scale = optax.scale_by_adam(b1=cfg.b1, b2=cfg.b2, eps=cfg.eps)
  elif cfg.name == "factored_rms":  # Adafactor-style second moments: far less state for huge matrices
    scale = optax.scale_by_factored_rms()
  else:
    raise ValueError(f"unknown optimizer {cfg.name!r}; choose 'adam', 'factored_rms' or 'muon'")
  return optax.chain(clip, scale, optax.add_decayed_weights(cfg.weight_decay),
                     optax.scale_by_learning_rate(schedule))
