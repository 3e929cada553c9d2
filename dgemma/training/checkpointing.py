"""Orbax checkpoints of a training run: train state + data-iterator state, async, atomic, keep-N.

Layout of a workdir:
    workdir/run.json          model config, task metadata, the whole training config and the code version
                              (rewritten by each (re)start, read by sample.py / eval and by a resume's checks)
    workdir/.lock             who holds the workdir (workdir_lock.py)
    workdir/checkpoints/<step>/{state,data}
    workdir/tb/               TensorBoard events
Orbax writes each step into a temporary directory and renames it when complete, so a run killed mid-save
leaves the previous checkpoint intact. The state is saved sharded (every process writes its own shards) and
restored onto whatever mesh the restoring run has: a target of ShapeDtypeStructs with shardings makes orbax
read each device's part straight into place, also from a checkpoint written by another mesh shape or process
count. The data item holds every process's data-iterator state (dgemma/training/data_state.py).
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import sys
from typing import Any, Callable

import jax
import numpy as np
import orbax.checkpoint as ocp

from dgemma.checkpoints.native import config_and_metadata, config_to_dict, upgrade_config_dict
from dgemma.config import ModelConfig
from dgemma.training.state import debiased_average, model_params

RUN_FILE = "run.json"


class Checkpointer:
  def __init__(self, workdir: str, keep: int = 3):
    self.directory = os.path.abspath(os.path.join(workdir, "checkpoints"))
    self._manager = ocp.CheckpointManager(
        self.directory, options=ocp.CheckpointManagerOptions(max_to_keep=keep, create=True),
        item_names=("state", "data"))

  def latest_step(self) -> int | None:
    return self._manager.latest_step()

  def all_steps(self) -> list[int]:
    return sorted(self._manager.all_steps())

  def save(self, step: int, state: Any, data_state: dict) -> None:
    self._manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                                     data=ocp.args.JsonSave(data_state)))

  def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
    """(state, data-iterator state). `abstract_state`: the state's tree of jax.ShapeDtypeStructs with
    shardings (`sharding.abstract`), or of arrays (jax arrays keep their shardings; numpy leaves come back
    as numpy)."""
    abstract_state = jax.tree.map(
        lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding) if isinstance(x, jax.Array) else x,
        abstract_state)
    def read(s: int):
      return self._manager.restore(s, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract_state),
                                                             data=ocp.args.JsonRestore()))
    try:
      out = read(step)
    except Exception as e:  # orbax / TensorStore fail in many ways on a damaged or mismatched checkpoint
      # (The caller should not close this checkpointer: its remaining reads are still failing, and closing would
      # print their tracebacks. The scripts end the process at once: cli.exit.)
      raise unreadable(self.directory, step, e, self.all_steps(), read) from e
    return out["state"], out["data"]

  def wait(self) -> None:
    self._manager.wait_until_finished()

  def close(self) -> None:
    self._manager.close()


def _quiet_failed_reads() -> None:
  """After a failed restore, orbax's remaining reads keep failing on its threads, each printing a traceback
  (tensor reads, and callbacks into its closed event loop). Drops exactly those, so that the error the caller
  reports stays one line; everything else still reaches the previous hooks."""
  def leftover(exc: BaseException | None, origin: object = None) -> bool:
    return (isinstance(exc, RuntimeError) and str(exc) == "Event loop is closed") or \
        "_read_array_index" in repr(origin) or "Encountered error while reading array index" in str(exc)
  excepthook, unraisablehook = sys.excepthook, sys.unraisablehook
  sys.excepthook = lambda t, e, tb: None if leftover(e) else excepthook(t, e, tb)
  sys.unraisablehook = lambda u: None if leftover(u.exc_value, u.object) else unraisablehook(u)


class CheckpointError(ValueError):
  """A checkpoint that cannot be read (one line: the step, the first line of the cause, what to do)."""


def unreadable(directory: str, step: int, error: BaseException, steps: list[int],
               read: Callable[[int], Any] | None = None) -> CheckpointError:
  """The error for a failed restore of `step`, its leftovers quieted. It names the newest older checkpoint that
  `read` (a restore of one step) can read, or says that none can: every checkpoint is damaged."""
  _quiet_failed_reads()
  cause = next((line.strip() for line in str(error).splitlines() if line.strip()), type(error).__name__)
  cause = cause.split(". See full TensorStore details")[0]  # (the rest is a multi-line spec dump)
  older = [s for s in steps if s < step]
  good = next((s for s in reversed(older) if read is None or _readable(read, s)), None)
  if good is not None:
    damaged = [s for s in older if s > good]
    remedy = (f"move it{' and step ' + ', '.join(map(str, damaged)) if damaged else ''} away to resume from step "
              f"{good}")
  elif older:
    remedy = (f"the older checkpoints (step {', '.join(map(str, older))}) cannot be read either: every checkpoint "
              "of this workdir is damaged, start again in a new workdir")
  else:
    remedy = "no older checkpoint is left"
  return CheckpointError(f"checkpoint {os.path.join(directory, str(step))} cannot be read ({cause[:300]}); {remedy}")


def _readable(read: Callable[[int], Any], step: int) -> bool:
  try:
    read(step)
  except Exception:  # (any failure: this checkpoint is no place to resume from)
    return False
  return True


def write_run_info(workdir: str, config: ModelConfig, metadata: dict, train_config: dict | None = None,
                   code_version: str | None = None) -> None:
  os.makedirs(workdir, exist_ok=True)
  info = {"model": config_to_dict(config), "metadata": metadata}
  if train_config is not None:
    info["config"] = train_config
  if code_version is not None:
    info["code_version"] = code_version
  tmp = os.path.join(workdir, RUN_FILE + ".tmp")
  with open(tmp, "w") as f:
    json.dump(info, f, indent=2)
  os.replace(tmp, os.path.join(workdir, RUN_FILE))


def _read_json(path: str) -> dict:
  """A run.json, or a one-line ValueError naming it when it is not (e.g. half-written by a tool or a full disk)."""
  try:
    with open(path) as f:
      info = json.load(f)
  except (json.JSONDecodeError, UnicodeDecodeError) as e:
    raise ValueError(f"{path} is damaged (not valid JSON: {e}); restore it, or use a new workdir") from None
  if not isinstance(info, dict) or "model" not in info:
    raise ValueError(f"{path} is damaged (no \"model\" entry); restore it, or use a new workdir")
  return info


def finished_steps(workdir: str) -> list[int]:
  """The steps of the finished checkpoints in workdir/checkpoints (orbax's temporary directories excluded)."""
  directory = os.path.join(workdir, "checkpoints")
  if not os.path.isdir(directory):
    return []
  return sorted(int(name) for name in os.listdir(directory) if name.isdigit())
def model_fingerprint(model: dict, metadata: dict) -> dict:
  """A model config dict (as JSON reads it back; older formats upgraded) with its position-feature table as a short
  digest under "position_features": what must not change when a run resumes (train.py compares them)."""
  model, legacy_table = upgrade_config_dict(model)
  table = metadata.get("position_features", legacy_table)
  if table:
    digest = hashlib.sha256(json.dumps(table).encode()).hexdigest()[:12]
    model["position_features"] = f"{len(table)}x{len(table[0])} table {digest}"
  return model


def read_run_info(workdir: str) -> dict | None:
  """{"model", "metadata"[, "config", "code_version"]} of a workdir that has checkpoints/ and run.json; None
  otherwise (a new run)."""
  run_file = os.path.join(workdir, RUN_FILE)
  if not (os.path.isdir(os.path.join(workdir, "checkpoints")) and os.path.exists(run_file)):
    return None
  return _read_json(run_file)


def load_inference(workdir: str, step: int | None = None,
                   ema_decay: float | None = None) -> tuple[ModelConfig, dict, dict]:
  """(config, params, metadata) of a run's latest (or given) checkpoint, LoRA merged into the weights; with
  `ema_decay`, the run's moving average of that decay (bias-corrected, as train.py exports it)."""
  run_file = os.path.join(workdir, RUN_FILE)
  if not os.path.exists(run_file):
    raise FileNotFoundError(f"{workdir} has checkpoints/ but no {RUN_FILE}; is it a dgemma training workdir?")
  info = _read_json(run_file)
  config, run_metadata = config_and_metadata(info)  # (an older run.json: its position features move to the metadata)
  # Everything but the optimizer state, whose moments would double or triple the memory an export needs (orbax's
  # partial restore; an orbax without it restores the whole state, the same weights).
  partial = "partial_restore" in inspect.signature(ocp.args.PyTreeRestore).parameters
  manager = ocp.CheckpointManager(os.path.join(os.path.abspath(workdir), "checkpoints"),
                                  item_names=("state", "data"),
                                  item_handlers={"state": ocp.PyTreeCheckpointHandler() if partial
                                                 else ocp.StandardCheckpointHandler(),
                                                 "data": ocp.JsonCheckpointHandler()})
  step = manager.latest_step() if step is None else step
  if step is None:
    raise FileNotFoundError(f"{workdir}/checkpoints holds no finished checkpoint")
  # Onto this process's first device, whatever mesh wrote the checkpoint.
  device = jax.sharding.SingleDeviceSharding(jax.local_devices()[0])

  def read(s: int) -> dict:
    metadata = manager.item_metadata(s)["state"]
    tree = getattr(metadata, "tree", metadata)
    if partial:
      tree = {k: v for k, v in tree.items() if k != "opt_state"}
    target = jax.tree.map(lambda m: jax.ShapeDtypeStruct(tuple(m.shape), np.dtype(m.dtype), sharding=device), tree)
    if partial:
      args = ocp.args.PyTreeRestore(item=target, partial_restore=True,
                                    restore_args=jax.tree.map(lambda _: ocp.ArrayRestoreArgs(sharding=device), target))
    else:
      args = ocp.args.StandardRestore(target)
    return manager.restore(s, args=ocp.args.Composite(state=args))["state"]
  try:
    state = read(step)
  except Exception as e:  # orbax / TensorStore fail in many ways on a damaged checkpoint
    # (Not closed: its remaining reads are still failing, and closing would print their tracebacks.)
    raise unreadable(str(manager.directory), step, e, sorted(manager.all_steps()), read) from e
  manager.close()
  trainable = state["trainable"]
  if ema_decay is not None:
    kept = list(run_metadata.get("ema_decays", []))
    if ema_decay not in kept:
      raise ValueError(f"{workdir} keeps no moving average with decay {ema_decay} (it keeps: {kept or 'none'})")
    trainable = debiased_average(state["ema"][kept.index(ema_decay)], trainable, state["step"], ema_decay)
  params = model_params(trainable, state.get("frozen"), config)
  metadata = dict(run_metadata)  # (+ what the run was, as train.py's export records it)
  metadata.update({k: info[v] for k, v in (("train_config", "config"), ("code_version", "code_version")) if v in info})
  return config, jax.device_get(params), metadata
