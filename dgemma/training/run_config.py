"""The whole resolved training config, saved with a run and compared on resume.

A resumed run continues the same run: every setting that shapes the weights (data, objective, optimizer, model,
seed, batch) must be what the checkpoints were trained with. A few settings may change on resume because they only
change how often something is done, or how the same numbers are computed; `config.allow_changes` names more keys
when a user means to change them (e.g. a learning rate for the rest of a run).
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
from importlib import metadata as package_metadata
from typing import Any

# Keys (flattened with '.') that may differ on resume. num_train_steps is checked separately: it may only
# extend the run beyond the step the workdir has reached.
MAY_CHANGE_ON_RESUME = (
    "num_train_steps", "log_every", "checkpoint_every", "keep_checkpoints", "allow_changes",
    "eval", "sampler",  # what is measured during the run and the sampling defaults it records, not the weights
    "model.remat", "model.attention_impl", "model.moe_impl",
    "mesh", "sharding_rules",  # (and every key under them: checkpoints restore onto any mesh or process count)
    "data.cache_dir",  # where generated data is cached, not what it is
    "diffusion.loss_chunk_tokens",  # the same losses computed a chunk of tokens at a time (memory, not numbers)
)


# Keys added after some runs were saved, and the value their absence means (the behaviour of those runs).
ABSENT_MEANS = {"grad_accum_steps": 1, "diffusion.loss_chunk_tokens": 0, "diffusion.cache_gradient": True}


# Config keys that name files or directories (compared as absolute paths).
PATH_KEYS = ("init_from", "data.path", "data.csv", "eval.data")


def to_json(config: Any) -> dict:
  """A ConfigDict (or dict) as plain JSON data: tuples become lists, so a saved and a live config compare equal."""
  data = json.loads(json.dumps(config.to_dict() if hasattr(config, "to_dict") else dict(config), default=str))
  for key in PATH_KEYS:  # absolute: the same file named from another directory is the same run
    *parents, leaf = key.split(".")
    node = data
    for p in parents:
      node = node.get(p) if isinstance(node, dict) else None
    if isinstance(node, dict) and isinstance(node.get(leaf), str) and node[leaf]:
      node[leaf] = os.path.abspath(os.path.expanduser(node[leaf]))
  return data


def flatten(tree: dict, prefix: str = "") -> dict[str, Any]:
  out = {}
  for key, value in tree.items():
    name = f"{prefix}{key}"
    if isinstance(value, dict) and value:
      out.update(flatten(value, name + "."))
    else:
      out[name] = value
  return out


def allowed_changes(config: Any) -> set[str]:
  """`config.allow_changes`: a comma-separated string (or list) of flattened keys."""
  value = config.get("allow_changes", "") if hasattr(config, "get") else ""
  names = value.split(",") if isinstance(value, str) else list(value or ())
  return {n.strip() for n in names if n.strip()}


def changed_keys(saved: dict, now: dict, allowed: set[str] = frozenset()) -> list[str]:
  """Flattened keys whose values differ between two JSON configs, less those that may change on resume."""
  before, after = ABSENT_MEANS | flatten(saved), ABSENT_MEANS | flatten(now)
  free = set(MAY_CHANGE_ON_RESUME) | set(allowed)  # a key frees the keys under it too ("mesh": "mesh.data", ...)
  return sorted(k for k in set(before) | set(after)
                if before.get(k, "<absent>") != after.get(k, "<absent>")
                and not any(k == f or k.startswith(f + ".") for f in free))


def check_resume(saved: dict, config: Any, workdir: str, step: int) -> None:
  """Refuses, in one line, a resume of `workdir` (at `step`) with a config that is not the same run's."""
  now = to_json(config)
  changed = changed_keys(saved, now, allowed_changes(config))
  if changed:
    before, after = ABSENT_MEANS | flatten(saved), ABSENT_MEANS | flatten(now)
    shown = ", ".join(f"{k}: {before.get(k, '<absent>')!r} -> {after.get(k, '<absent>')!r}" for k in changed[:4])
    more = f" and {len(changed) - 4} more" if len(changed) > 4 else ""
    raise ValueError(f"{workdir} holds a run with another config ({shown}{more}): resume with the same settings, "
                     f"use a new workdir, or allow them with --config.allow_changes={','.join(changed)}")
  if now["num_train_steps"] < step:
    raise ValueError(f"{workdir} is already at step {step}, past num_train_steps={now['num_train_steps']}: give at "
                     f"least {step} steps to continue it, or use a new workdir")


@functools.cache
def code_version() -> str:
  """The code that trains: "git <commit>[+changes]" of the checkout dgemma runs from, else "dgemma <version>"."""
  root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
  try:
    commit = subprocess.run(["git", "-C", root, "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
    if commit.returncode == 0 and commit.stdout.strip():
      dirty = subprocess.run(["git", "-C", root, "status", "--porcelain", "--untracked-files=no"],
                             capture_output=True, text=True, timeout=10)
      return f"git {commit.stdout.strip()}" + ("+changes" if dirty.returncode == 0 and dirty.stdout.strip() else "")
  except (OSError, subprocess.SubprocessError):  # no git on this machine
    pass
  try:
    return f"dgemma {package_metadata.version('dgemma')}"
  except package_metadata.PackageNotFoundError:
    return "unknown"
