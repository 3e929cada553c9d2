"""Train a DiffusionGemma-style model.

    python train.py --config=configs/CONFIG.py[:ARGS] [--workdir=DIR] [--config.key=value ...]

Training runs on a mesh over all devices of all processes (`config.mesh`, `config.sharding_rules`; see
dgemma/sharding.py). Several processes (one per host, or per GPU) start JAX's multi-controller runtime by
themselves under SLURM / Open MPI / Cloud TPU or with JAX_COORDINATOR_ADDRESS set, or from the flags
--coordinator_address, --num_processes and --process_id. Only process 0 prints and writes TensorBoard.

The workdir holds checkpoints (a restarted run resumes from the latest), TensorBoard events (tb/) and,
at the end, the inference checkpoint (model/) that sample.py and the task's eval script read.
"""

from __future__ import annotations

import json
import os
import sys
import time

import jax
import ml_collections
import numpy as np
from absl import app, flags, logging
from ml_collections import config_flags

from dgemma import checkpoints, cli, loading, model, sharding, tasks
from dgemma.checkpoints.native import config_to_dict
from dgemma.cpu import huge_pages
from dgemma.diffusion.config import ObjectiveConfig
from dgemma.training import (checkpointing, data_state as data_state_lib, logs, metrics as metrics_lib, optimizer,
                             run_config, state as state_lib)
from dgemma.training.config_utils import model_config, sampling_metadata
from dgemma.training.workdir_lock import WorkdirBusy, WorkdirLock

_CONFIG = config_flags.DEFINE_config_file("config", None, "Training config file (configs/*.py[:args]).")
_WORKDIR = flags.DEFINE_string("workdir", None, "Checkpoints, logs and the final model (default workdirs/<config>).")
_COORDINATOR = flags.DEFINE_string("coordinator_address", None,
                                   "Multi-process runs: host:port of process 0 (default: from the cluster environment).")
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Multi-process runs: the number of processes.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Multi-process runs: this process's index.")

# Model fields that may differ from an init_from checkpoint: they change computation, not shapes.
_RUNTIME_FIELDS = {"remat", "attention_impl", "moe_impl", "param_dtype", "canvas_length", "stop_ids"}


class TrainingError(Exception):
  """A run stopped for a reason the user must see in one line (e.g. a NaN loss)."""


def mesh_and_rules(c: ml_collections.ConfigDict) -> tuple[jax.sharding.Mesh, tuple]:
  """The run's device mesh and sharding rules (defaults for configs without `mesh` / `sharding_rules`)."""
  mesh_cfg = c.mesh.to_dict() if "mesh" in c and c.mesh is not None else None
  rules = sharding.check_rules(c.sharding_rules if "sharding_rules" in c and c.sharding_rules is not None
                               else sharding.DEFAULT_RULES)
  return sharding.make_mesh(mesh_cfg), rules


def build_model(c: ml_collections.ConfigDict, mesh: jax.sharding.Mesh | None = None,
                rules=sharding.DEFAULT_RULES):
  """(model config, params, metadata); with a mesh, the params come sharded by the rules."""
  overrides = c.model.to_dict()
  if not c.init_from:
    config = model_config(c.model_preset, overrides)
    if mesh is None:
      return config, model.init_params(config, jax.random.key(c.seed)), {}
    shardings = sharding.tree_shardings(model.param_shapes(config), mesh, rules)
    init = jax.jit(lambda rng: model.init_params(config, rng), out_shardings=shardings)
    return config, init(jax.random.key(c.seed)), {}
  config, params, metadata = loading.load_model(os.path.expanduser(c.init_from))
  for key, value in overrides.items():
    value = tuple(value) if isinstance(value, list) else value
    if key not in _RUNTIME_FIELDS and getattr(config, key) != value:
      raise ValueError(f"config.model.{key}={value!r} differs from the init_from checkpoint ({getattr(config, key)!r})")
  config = config.replace(**{k: (tuple(v) if isinstance(v, list) else v) for k, v in overrides.items()
                             if k in _RUNTIME_FIELDS})
  params = jax.tree.map(lambda x: x.astype(config.param_dtype), params)
  if mesh is not None:  # every process holds the whole checkpoint on the host and keeps its own shards
    params = sharding.put(params, sharding.tree_shardings(params, mesh, rules))
  return config, params, metadata


def build_data(c: ml_collections.ConfigDict, config, shard: tuple[int, int, int] | None = None,
               task: tasks.Task | None = None):
  """The training stream and the task metadata that sampling/eval need to read the model's outputs.

  `task` defaults to the registry's for `c.task.name` (dgemma/tasks). `shard` = (index, count, local batch size)
  of this process's part of each global batch (`sharding.data_shard`); default: the whole batch in one shard."""
  shard_index, shard_count, local_batch = shard or (0, 1, c.batch_size)
  noise_rank = c.diffusion.get("ordered_noise_prob", 0.0) > 0  # batches carry the order of corruption
  task = task or tasks.for_config(c, config, noise_rank)
  dataset = task.train_dataset(c, local_batch, shard_index, shard_count, noise_rank)
  return dataset, {"task": task.metadata}


def refuse_another_run(c: ml_collections.ConfigDict, workdir: str, config, task_metadata: dict) -> None:
  """A workdir with checkpoints resumes only the run that wrote them: the same config (less the keys that may
  change on resume, dgemma/training/run_config.py), the same moving averages and the same model. Raises a one-line
  ValueError before anything is written; a new workdir passes."""
  ema_decays = tuple(task_metadata.get("ema_decays", ()))
  saved = checkpointing.read_run_info(workdir)  # a run to resume: its checkpoints hold its averages
  reached = checkpointing.finished_steps(workdir)
  if saved is not None and reached:
    if "config" in saved:  # the whole run's config (older run.json files hold the model only: checked below)
      run_config.check_resume(saved["config"], c, workdir, max(reached))
    elif c.num_train_steps < max(reached):
      raise ValueError(f"{workdir} is already at step {max(reached)}, past num_train_steps={c.num_train_steps}: "
                       f"give at least {max(reached)} steps to continue it, or use a new workdir")
    if list(saved["metadata"].get("ema_decays", [])) != list(ema_decays):
      raise ValueError(f"{workdir} was trained with optimizer.ema_decays="
                       f"{tuple(saved['metadata'].get('ema_decays', []))}, this config has {ema_decays}: resume "
                       "with the same value or use a new workdir")
    # run.json must keep describing the checkpoints: a changed model is refused before anything is written.
    # (How the model is computed may change on resume: _RUNTIME_FIELDS and the matmuls' dtype.)
    before = checkpointing.model_fingerprint(saved["model"], saved["metadata"])
    now = checkpointing.model_fingerprint(json.loads(json.dumps(config_to_dict(config))), task_metadata)
    changed = sorted(k for k in set(before) | set(now)
                     if before.get(k) != now.get(k) and k not in _RUNTIME_FIELDS | {"matmul_dtype"})
    if changed:
      raise ValueError(f"{workdir} holds checkpoints of another model (config.model differs in "
                       f"{', '.join(f'{k}: {before.get(k)!r} -> {now.get(k)!r}' for k in changed[:3])}"
                       f"{', ...' if len(changed) > 3 else ''}): resume with its config or use a new workdir")


def train(c: ml_collections.ConfigDict, workdir: str, stop_at_step: int | None = None) -> dict:
  """Runs (or resumes) training; returns the last logged metrics. `stop_at_step` ends the run early
  without a final checkpoint, as a preemption would (tests use it).

  Runs on the mesh of `c.mesh` over all devices of all processes; every process calls it (multi-process
  runs initialise `jax.distributed` first: `sharding.maybe_initialize_distributed`)."""
  lead = jax.process_index() == 0
  say = print if lead else (lambda *a, **k: None)
  # (0 would divide by zero, keep nothing, or export the random initial weights as the final model)
  for key in ("num_train_steps", "batch_size", "checkpoint_every", "log_every", "keep_checkpoints"):
    if isinstance(c[key], bool) or not isinstance(c[key], int) or c[key] < 1:
      raise ValueError(f"config.{key} must be a positive integer, got {c[key]!r}")
  objective_config = ObjectiveConfig.from_config(c.diffusion)  # a bad objective knob stops the run here
  grad_accum_steps = c.get("grad_accum_steps", 1)  # k > 1: one update from k microbatches of batch_size / k
  if isinstance(grad_accum_steps, bool) or not isinstance(grad_accum_steps, int) or grad_accum_steps < 1:
    raise ValueError(f"config.grad_accum_steps must be a positive integer, got {grad_accum_steps!r}")
  if c.batch_size % grad_accum_steps:
    raise ValueError(f"config.batch_size={c.batch_size} does not split into config.grad_accum_steps="
                     f"{grad_accum_steps} equal microbatches: choose a divisor of the batch size")
  # --- Mesh and model -----------------------------------------------------------------------------
  mesh, rules = mesh_and_rules(c)
  shard = sharding.data_shard(mesh, rules, c.batch_size)  # also checks that the mesh divides the batch
  config, params, init_metadata = build_model(c, mesh, rules)
  # --- Data ---------------------------------------------------------------------------------------
  task = tasks.for_config(c, config, c.diffusion.get("ordered_noise_prob", 0.0) > 0)
  dataset, task_metadata = build_data(c, config, shard, task)
  # Whether the self-conditioning branch learned anything, and the model's own sampling defaults (a bad knob fails
  # now, not at the first evaluation).
  task_metadata.update(sampling_metadata(c, init_metadata))
  # Moving averages of the weights (none by default): each is evaluated beside the weights and exported as
  # model_ema<decay>/ next to model/.
  ema_decays = tuple(float(d) for d in c.optimizer.get("ema_decays", ()))
  if ema_decays:  # which moving averages the checkpoints hold (checkpointing.load_inference reads it)
    task_metadata["ema_decays"] = list(ema_decays)
  # What the run is, recorded in run.json and the exported model: the whole resolved config and the code.
  train_config, code_version = run_config.to_json(c), run_config.code_version()
  refuse_another_run(c, workdir, config, task_metadata)  # resuming: the same run, or one line saying why not
  data_iter = iter(dataset)
  # --- Optimizer and state ------------------------------------------------------------------------
  optimizer_config = c.optimizer
  if c.lora_rank and c.optimizer.get("lr_multipliers"):
    # LoRA trains adapters only: the multipliers name base weights, which stay frozen.
    if lead:
      print(f"LoRA: optimizer.lr_multipliers {dict(c.optimizer.lr_multipliers)} not applied (they name frozen weights)")
    optimizer_config = ml_collections.ConfigDict({**c.optimizer.to_dict(), "lr_multipliers": {}})
  tx = optimizer.make_optimizer(optimizer_config)
  lr_schedule = optimizer.learning_rate_schedule(c.optimizer)
  state = state_lib.create(params, tx, c.lora_rank, jax.random.key(c.seed + 1), c.optimizer.master_dtype,
                           mesh=mesh, rules=rules, ema_decays=ema_decays)
  del params
  state_shardings = jax.tree.map(lambda x: x.sharding, state)
  train_step = state_lib.make_train_step(config, objective_config, tx, c.seed, state_shardings,
                                         sharding.batch_sharding(mesh, rules, c.batch_size), ema_decays,
                                         task_metadata.get("position_features"), grad_accum_steps)

  def weight_sets() -> list[tuple[str, object]]:
    """(name, trainable weights): the weights themselves ("") and each moving average ("_ema<decay>")."""
    return [("", state.trainable)] + [(f"_ema{d:g}", state_lib.ema_trainable(state, i, d))
                                      for i, d in enumerate(ema_decays)]
  # --- Evaluation (the task's held-out scores every eval.every steps, logged as eval/*) ---------------
  evaluator = task.make_evaluator(c, task_metadata)
  # --- Resume -------------------------------------------------------------------------------------
  ckpt = checkpointing.Checkpointer(workdir, keep=c.keep_checkpoints)
  start = ckpt.latest_step() or 0
  if start:  # restored straight into this run's shardings, whatever mesh or process count saved it
    state, data_state = ckpt.restore(start, sharding.abstract(state, state_shardings))
    data_iter.set_state(data_state_lib.this_process(data_state, os.path.join(ckpt.directory, str(start))))
    say(f"Resumed from step {start} ({ckpt.directory})", flush=True)
  if lead:  # (after the restore: a run that cannot resume leaves the workdir as it was)
    checkpointing.write_run_info(workdir, config, task_metadata, train_config, code_version)
  last_saved = start
  # --- Loop ---------------------------------------------------------------------------------------
  tokens_per_example = task.prompt_len + config.canvas_length
  logger = metrics_lib.MetricsLogger(os.path.join(workdir, "tb") if lead else None,
                                     c.num_train_steps, tokens_per_example, c.batch_size, echo=lead)
  last_scalars: dict = {}
  pending = None  # (step, device metrics) read one step late, so the host never stalls the device

  # A checkpoint is known good once the loss computed from its weights (the next step's) is finite.
  good, unconfirmed = start, None

  def fall_back(step: int) -> str:
    """Where to resume from after a failure: checkpoint `step`, or none written yet (step 0)."""
    return (f"The last good checkpoint is step {step} in {ckpt.directory}" if step else
            "No checkpoint was written before it: the run has nothing to resume from (lower the learning rate, or "
            "check the data)")

  def consume(step: int, device_metrics: dict) -> None:
    nonlocal last_scalars, good, unconfirmed
    host = jax.device_get(device_metrics)
    if not np.isfinite(host["loss"]):
      if unconfirmed == step - 1:  # the weights just saved gave this loss: resuming from them would repeat it
        raise TrainingError(f"loss is {host['loss']} at step {step}, computed from the weights checkpointed at step "
                            f"{unconfirmed}; stopping. The last good checkpoint is step {good}: move "
                            f"{os.path.join(ckpt.directory, str(unconfirmed))} away to resume from it")
      raise TrainingError(f"loss is {host['loss']} at step {step}; stopping. {fall_back(last_saved)}")
    if unconfirmed == step - 1:
      good, unconfirmed = unconfirmed, None
    logger.add(step, host)
    if step % c.log_every == 0 or step == c.num_train_steps:
      last_scalars = logger.flush(step, {"learning_rate": float(lr_schedule(step - 1))})

  def run_eval(step: int) -> None:
    for suffix, trainable in weight_sets():  # eval/* for the weights, eval_ema<decay>/* for each average
      start_s = time.perf_counter()
      scores = evaluator(state_lib.model_params(trainable, state.frozen, config))
      scores["eval/seconds"] = time.perf_counter() - start_s
      logger.write(step, {k.replace("eval/", f"eval{suffix}/"): v for k, v in scores.items()})
      logger.exclude(scores["eval/seconds"])
      texts = {k.replace("eval/", f"eval{suffix}/"): v for k, v in scores.items() if isinstance(v, str)}
      numbers = {k: v for k, v in scores.items() if not isinstance(v, str)}
      say(f"eval{suffix} at step {step}: {task.describe(numbers)} ({scores['eval/seconds']:.0f} s)", flush=True)
      for tag, text in texts.items():  # (e.g. generated samples; also in TensorBoard's Text tab)
        say(f"{tag}:\n" + "\n".join("  " + line for line in text.split("\n")), flush=True)

  say(f"Training {sum(x.size for x in jax.tree.leaves(state.trainable)):,} parameters "
      f"({'LoRA rank %d' % c.lora_rank if c.lora_rank else 'full'}) for {c.num_train_steps} steps on "
      f"{jax.device_count()} device(s), {jax.process_count()} process(es), mesh "
      f"{dict(mesh.shape)}; workdir {workdir}", flush=True)
  try:
    for step in range(start, c.num_train_steps):
      if stop_at_step is not None and step >= stop_at_step:
        break
      batch = next(data_iter)
      batch = sharding.global_batch({k: batch[k] for k in ("prompt", "canvas", "canvas_mask", "noise_rank")
                                     if k in batch}, mesh, rules, c.batch_size)
      state, step_metrics = train_step(state, batch)
      if pending is not None:
        consume(*pending)
      pending = (step + 1, step_metrics)
      if (step + 1) % c.checkpoint_every == 0 or step + 1 == c.num_train_steps:
        consume(*pending)  # never checkpoint a state whose loss was not finite
        pending = None
        if not bool(state_lib.all_finite(state)):  # nor one that the last update overflowed
          raise TrainingError(f"the weights or optimizer state after step {step + 1} are not finite (the loss "
                              f"was); stopping. {fall_back(good)}")
        ckpt.save(step + 1, state, data_state_lib.gather(data_iter.get_state()))  # (every process's)
        last_saved = unconfirmed = step + 1
      if evaluator and ((step + 1) % c.eval.every == 0 or step + 1 == c.num_train_steps):
        run_eval(step + 1)
    if pending is not None:
      consume(*pending)
  finally:
    ckpt.wait()
    ckpt.close()
    logger.close()
  # --- Export -------------------------------------------------------------------------------------
  if stop_at_step is None:  # every process takes part in gathering the shards; process 0 writes
    for suffix, trainable in weight_sets():
      final = sharding.to_host(state_lib.model_params(trainable, state.frozen, config))
      if lead:  # the task's files (a tokenizer) travel with the model, named relative to its directory
        model_dir = os.path.join(workdir, f"model{suffix}")
        checkpoints.save_model(model_dir, config, final,
                               {**task_metadata, "task": task.export_files(model_dir), "train_config": train_config,
                                "code_version": code_version})
        say(f"Saved the final model{' (moving average, decay ' + suffix[4:] + ')' if suffix else ''} to "
            f"{os.path.join(workdir, 'model' + suffix)}", flush=True)
  return last_scalars


def workdir_from_flags() -> str:
  """--workdir, or workdirs/<config file name> (train.py and the scripts that drive it)."""
  name = os.path.splitext(os.path.basename(flags.FLAGS["config"].config_filename))[0]
  return _WORKDIR.value or os.path.join("workdirs", name)


def check_workdir(workdir: str) -> None:
  """A workdir this run can write, or a one-line ValueError saying why not (before anything is written)."""
  if os.path.exists(workdir) and not os.path.isdir(workdir):
    raise ValueError(f"workdir {workdir} is a file, not a directory: choose another --workdir")
  try:
    os.makedirs(workdir, exist_ok=True)
    probe = os.path.join(workdir, f".write_test.{os.getpid()}")
    with open(probe, "w"):
      pass
    os.remove(probe)
  except OSError as e:
    raise ValueError(f"workdir {workdir} cannot be written ({e.strerror or e}): choose another --workdir") from None


def main(argv):
  del argv
  c = _CONFIG.value
  if c is None:
    raise app.UsageError("--config is required, e.g. --config=configs/<file>.py")
  workdir = workdir_from_flags()
  lock = None
  try:
    check_workdir(workdir)
    distributed = sharding.maybe_initialize_distributed(_COORDINATOR.value, _NUM_PROCESSES.value, _PROCESS_ID.value)
    # One run per workdir (workdir_lock.py), held until this process ends: a single process takes it before writing
    # anything; in a multi-process run process 0 does, once JAX knows which process this is.
    if not distributed:
      lock = WorkdirLock(workdir).acquire()
    # Before JAX starts its backends (they log at INFO): library INFO logging to WORKDIR/train.log, the terminal
    # keeps warnings.
    logs.log_to_workdir(workdir)
    if distributed and jax.process_index() == 0:
      lock = WorkdirLock(workdir).acquire()
    elif distributed:
      logging.set_verbosity(logging.WARNING)  # library INFO logs (orbax, jax) from process 0 only
    train(c, workdir)
  except (TrainingError, ValueError, FileNotFoundError, WorkdirBusy) as e:
    if os.environ.get("DGEMMA_TRACEBACK"):
      raise
    print(f"train.py: error: {e}", file=sys.stderr)
    cli.exit(1)  # (the kernel releases the lock with the process)
  if lock is not None:
    lock.release()


def parse_flags(argv: list[str]) -> list[str]:
  """absl parsing, with config-file and `--config.key=value` mistakes reported in one line."""
  try:
    rest = flags.FLAGS(argv)
    config_file = flags.FLAGS["config"].config_filename.split(":")[0] if flags.FLAGS["config"].present else None
    if config_file and not os.path.isfile(config_file):
      sys.exit(f"{os.path.basename(argv[0])}: error: config file {config_file} does not exist")
    if _CONFIG.value is not None:
      _CONFIG.value.keys()  # (a config file that failed to load raises only when first read)
    return rest
  except OSError as e:  # ml_collections: the config file could not be loaded
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    sys.exit(f"{os.path.basename(argv[0])}: error: {lines[0]}" + (f": {lines[-1]}" if len(lines) > 1 else ""))
  except AttributeError as e:  # ml_collections: an override names a key the config does not have
    sys.exit(f"{os.path.basename(argv[0])}: error: unknown config key {str(e).strip(chr(34))} in a --config override")
  except (ValueError, TypeError, KeyError, flags.Error) as e:
    lines = [line for line in str(e).splitlines() if line.strip()]  # config errors arrive with a traceback
    sys.exit(f"{os.path.basename(argv[0])}: error: {lines[0].rstrip(':')}" + (f": {lines[-1]}" if len(lines) > 1 else ""))


if __name__ == "__main__":
  huge_pages.restart_with_huge_pages()  # faster XLA:CPU buffers (dgemma/cpu/huge_pages.py)
  app.run(main, flags_parser=parse_flags)
