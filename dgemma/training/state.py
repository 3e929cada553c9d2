"""The train state and the jitted train step.

Under LoRA the optimizer sees only the adapters (`trainable`) and the base weights sit in `frozen`;
under full fine-tuning `trainable` is the whole model and `frozen` is None. Trainable weights are kept in
`master_dtype` (float32) while the forward pass runs in the model's param dtype (e.g. bf16).

With `ema_decays` the state also carries one exponential moving average of the trainable weights per decay d,
kept unnormalised from zero (e <- d e + (1 - d) p) and divided by 1 - d^step when read (`ema_trainable`), so
after n updates it is exactly the average of the n weight iterates with weights proportional to d^(n - s).
"""

from __future__ import annotations

from typing import Any, Callable

import flax.struct
import jax
import jax.numpy as jnp
import optax

from dgemma import sharding
from dgemma.config import ModelConfig
from dgemma.diffusion import objective
from dgemma.diffusion.config import ObjectiveConfig
from dgemma.model import position_features as position_features_lib
from dgemma.training import lora


@flax.struct.dataclass
class TrainState:
  step: jax.Array  # int32 scalar: number of updates applied
  trainable: Any
  frozen: Any  # None unless LoRA
  opt_state: Any
  ema: Any = None  # None, or a tuple of trainable-shaped trees, one per EMA decay (float32, unnormalised)


def create(params: dict, tx: optax.GradientTransformation, lora_rank: int, rng: jax.Array,
           master_dtype: str = "float32", mesh: jax.sharding.Mesh | None = None,
           rules=sharding.DEFAULT_RULES, ema_decays: tuple[float, ...] = ()) -> TrainState:
  """The initial state. With a mesh, it is built by one jitted program straight into its shardings
  (parameters, LoRA adapters and optimizer state by logical axis; see dgemma/sharding.py)."""
  if mesh is not None:
    fn = lambda p, r: create(p, tx, lora_rank, r, master_dtype, ema_decays=ema_decays)
    shardings = sharding.tree_shardings(jax.eval_shape(fn, params, rng), mesh, rules)
    return jax.jit(fn, out_shardings=shardings)(params, rng)
  if lora_rank > 0:
    trainable, frozen = lora.init(params, lora_rank, rng), params
  else:
    trainable, frozen = jax.tree.map(lambda x: x.astype(master_dtype), params), None
  check_ema_decays(ema_decays)
  ema = tuple(jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), trainable) for _ in ema_decays) or None
  return TrainState(step=jnp.zeros((), jnp.int32), trainable=trainable, frozen=frozen,
                    opt_state=tx.init(trainable), ema=ema)


def check_ema_decays(ema_decays) -> None:
  for d in ema_decays:
    if not 0.0 < d < 1.0:
      raise ValueError(f"optimizer.ema_decays must lie strictly between 0 and 1, got {d!r}")


def debiased_average(ema: Any, trainable: Any, step: Any, decay: float) -> Any:
  """An unnormalised moving average divided by 1 - decay^step (an average of the iterates); at step 0 there is
  nothing to average: the current weights. Works on device arrays (no host read of the step) and on numpy."""
  norm = 1.0 - jnp.float32(decay) ** jnp.asarray(step).astype(jnp.float32)
  return jax.tree.map(lambda e, p: jnp.where(step > 0, e / jnp.maximum(norm, 1e-30), p).astype(p.dtype),
                      ema, trainable)


@jax.jit
def all_finite(tree: Any) -> jax.Array:
  """Whether every floating-point leaf is finite (a scalar bool on device). train.py checks the state with it
  before each checkpoint: an update can overflow the weights while the loss it was computed from is finite."""
  checks = [jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(tree) if jnp.issubdtype(x.dtype, jnp.inexact)]
  return jnp.all(jnp.stack(checks)) if checks else jnp.bool_(True)


def ema_trainable(state: TrainState, index: int, decay: float) -> Any:
  """The `index`-th moving average of the trainable weights, bias-corrected."""
  if state.ema is None:
    raise ValueError("this train state keeps no moving averages (optimizer.ema_decays is empty)")
  return debiased_average(state.ema[index], state.trainable, state.step, decay)


def model_params(trainable, frozen, config: ModelConfig) -> dict:
  """The parameters the forward pass runs on, in the model's dtype."""
  if frozen is not None:
    return lora.merge(frozen, trainable)
  return jax.tree.map(lambda x: x.astype(config.param_dtype), trainable)


def microbatches(batch: dict, k: int) -> dict:
  """[B, ...] -> [k, B/k, ...]: microbatch i holds rows i, i + k, i + 2k, ... Strided, so that a batch split over
  devices in contiguous blocks gives each device its share of every microbatch (no data moves between them)."""
  def split(x):
    if x.shape[0] % k:
      raise ValueError(f"a batch of {x.shape[0]} rows does not split into grad_accum_steps={k} equal microbatches")
    return jnp.swapaxes(x.reshape((x.shape[0] // k, k) + x.shape[1:]), 0, 1)
  return jax.tree.map(split, batch)


def microbatch_rng(rng: jax.Array, index: Any) -> jax.Array:
  """The randomness of microbatch `index` of a step whose key is `rng`."""
  return jax.random.fold_in(rng, index)


def accumulate_gradients(grad_fn: Callable, trainable: Any, batch: dict, rng: jax.Array, k: int) -> tuple[Any, dict]:
  """(mean gradient, metrics) over k microbatches, one after the other in a lax.scan (one microbatch's activations
  live at a time). grad_fn(trainable, microbatch, rng) -> ((loss, metrics), grads), as jax.value_and_grad makes it.

  The losses are means over rows, so with equal microbatches the mean of their gradients is the whole batch's
  gradient (exactly so for a loss without randomness); each microbatch draws its own noise (`microbatch_rng`).
  Metrics are averaged over microbatches, except sums and counts (`*_sum`, `*_count`), which add up."""
  def body(carry, xs):
    index, micro = xs
    (_, metrics), grads = grad_fn(trainable, micro, microbatch_rng(rng, index))
    grad_sum, metric_sum = carry
    grad_sum = jax.tree.map(lambda a, g: a + g.astype(jnp.float32), grad_sum, grads)
    metric_sum = jax.tree.map(lambda a, m: a + m.astype(jnp.float32), metric_sum, metrics)
    return (grad_sum, metric_sum), None

  micro = microbatches(batch, k)
  first = jax.tree.map(lambda x: x[0], micro)
  (_, metric_shapes), _ = jax.eval_shape(grad_fn, trainable, first, rng)
  zeros = lambda tree: jax.tree.map(lambda x: jnp.zeros(x.shape, jnp.float32), tree)
  (grad_sum, metric_sum), _ = jax.lax.scan(body, (zeros(trainable), zeros(metric_shapes)), (jnp.arange(k), micro))
  grads = jax.tree.map(lambda g, p: (g / k).astype(p.dtype), grad_sum, trainable)
  metrics = {name: value if name.endswith(("_sum", "_count")) else value / k for name, value in metric_sum.items()}
  return grads, metrics


def make_train_step(config: ModelConfig, objective_config: ObjectiveConfig,
                    tx: optax.GradientTransformation, seed: int, state_shardings: Any = None,
                    batch_sharding: jax.sharding.Sharding | None = None,
                    ema_decays: tuple[float, ...] = (), position_features: Any = None,
                    grad_accum_steps: int = 1) -> Callable:
  """(state, batch) -> (state, metrics), jitted; the step's randomness is fold_in(key(seed), step), so a
  resumed run draws exactly the numbers an uninterrupted one would (and, JAX's random bits being
  partitionable, the same numbers on any mesh).

  With `state_shardings` (a TrainState of shardings, `sharding.tree_shardings`) and `batch_sharding`, the step
  runs on their mesh: the state keeps its shardings, the batch is split over the batch axes and the metrics
  come back replicated (readable on every process).

  `position_features`: the model's feature table (config.num_position_features > 0), a constant of the step.

  `grad_accum_steps` = k > 1: one update from the mean gradient of k microbatches of B/k rows each
  (`accumulate_gradients`), for a batch whose activations do not fit at once.
  """
  if not isinstance(objective_config, ObjectiveConfig):  # a config section: convert it where the config is read
    raise TypeError(f"make_train_step takes an ObjectiveConfig (ObjectiveConfig.from_config(c.diffusion)), "
                    f"got {type(objective_config).__name__}")
  features = position_features_lib.check(config, position_features)

  if isinstance(grad_accum_steps, bool) or not isinstance(grad_accum_steps, int) or grad_accum_steps < 1:
    raise ValueError(f"grad_accum_steps must be a positive integer, got {grad_accum_steps!r}")

  def step_fn(state: TrainState, batch: dict) -> tuple[TrainState, dict]:
    rng = jax.random.fold_in(jax.random.key(seed), state.step)

    def loss(trainable, batch, rng):
      return objective.loss_fn(model_params(trainable, state.frozen, config), config, objective_config, batch, rng,
                                state.step, position_features=features)

    grad_fn = jax.value_and_grad(loss, has_aux=True)
    if grad_accum_steps == 1:
      (_, metrics), grads = grad_fn(state.trainable, batch, rng)
    else:
      grads, metrics = accumulate_gradients(grad_fn, state.trainable, batch, rng, grad_accum_steps)
    updates, opt_state = tx.update(grads, state.opt_state, state.trainable)
    trainable = optax.apply_updates(state.trainable, updates)
    metrics["grad_norm"] = optax.tree.norm(grads)
    ema = state.ema
    if ema is not None:
      ema = tuple(jax.tree.map(lambda e, p: d * e + (1.0 - d) * p.astype(jnp.float32), tree, trainable)
                  for d, tree in zip(ema_decays, ema, strict=True))
    return state.replace(step=state.step + 1, trainable=trainable, opt_state=opt_state, ema=ema), metrics

  if state_shardings is None:
    return jax.jit(step_fn, donate_argnums=(0,))
  mesh = jax.tree.leaves(state_shardings)[0].mesh
  return jax.jit(step_fn, donate_argnums=(0,), in_shardings=(state_shardings, batch_sharding),
                 out_shardings=(state_shardings, sharding.replicated(mesh)))
