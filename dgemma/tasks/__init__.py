"""Tasks as plug-ins: the registry from `config.task.name` (recorded in every checkpoint's metadata as
`metadata["task"]["name"]`) to the class implementing `dgemma.tasks.base.Task`.

A new task is one folder under dgemma/tasks/ plus one line in `_REGISTRY` (or a `register` call); docs/tasks.md.
Entries are "module:Class" strings, imported on first use: the registry does not import every task.
"""

from __future__ import annotations

import importlib
from typing import Any

from dgemma.tasks.base import Evaluator, Task

_REGISTRY: dict[str, Any] = {
    "sudoku_digits": "dgemma.tasks.sudoku.task:DigitsTask",
    "sudoku_text": "dgemma.tasks.sudoku.task:TextTask",
    "text": "dgemma.tasks.text.task:TextTask",
}

__all__ = ["Task", "Evaluator", "register", "names", "get", "for_config", "for_checkpoint", "name_of",
           "export_files"]


def register(name: str, task_class: Any) -> None:
  """Adds (or replaces) a task: `task_class` is a class with `from_config` / `from_metadata`, or "module:Class"."""
  if not name or not isinstance(name, str):
    raise ValueError(f"a task name must be a non-empty string, got {name!r}")
  _REGISTRY[name] = task_class


def names() -> list[str]:
  return sorted(_REGISTRY)


def get(name: str) -> Any:
  """The class registered under `name`; a one-line ValueError naming the registered tasks otherwise."""
  if name not in _REGISTRY:
    raise ValueError(f"unknown task {name!r}; registered tasks: {', '.join(names())}")
  entry = _REGISTRY[name]
  if isinstance(entry, str):
    module, _, attr = entry.partition(":")
    entry = _REGISTRY[name] = getattr(importlib.import_module(module), attr)
  return entry


def for_config(c, config, noise_rank: bool = False) -> Task:
  """The task of a training run: `c.task.name` from the registry, built from the run's config. `noise_rank`:
  the run needs batches with a noise order (refused now, before any data is built, for a task without one)."""
  task = c.get("task")
  name = task.get("name") if task is not None else None
  if not name:
    raise ValueError(f"the config has no task.name; registered tasks: {', '.join(names())}")
  task_class = get(name)
  if noise_rank and not getattr(task_class, "supports_noise_rank", False):
    ordered = [n for n in names() if getattr(get(n), "supports_noise_rank", False)]
    raise ValueError(f"diffusion.ordered_noise_prob > 0 needs a task whose batches carry a noise order; "
                     f"task.name={name!r} has none (tasks with one: {', '.join(ordered) or 'none'})")
  return task_class.from_config(c, config)


def name_of(metadata: Any) -> str | None:
  """The task name a checkpoint's metadata records (None: a plain language model)."""
  task = metadata.get("task") if isinstance(metadata, dict) else None
  name = task.get("name") if isinstance(task, dict) else None
  return name if isinstance(name, str) and name else None


def for_checkpoint(config, metadata: dict, ckpt_path: str | None = None) -> Task | None:
  """The task a checkpoint was trained on, from its metadata; None for a checkpoint without a task."""
  name = name_of(metadata)
  where = f" {ckpt_path}" if ckpt_path else ""
  if name is None:
    recorded = metadata.get("task") if isinstance(metadata, dict) else None
    if recorded not in (None, "", {}):  # a task entry without a name: not a language model either
      raise ValueError(f"the checkpoint{where} records a task this dgemma cannot read ({str(recorded)[:60]!r}; "
                       f"registered tasks: {', '.join(names())})")
    return None
  if name not in _REGISTRY:  # (not "has no tokenizer": a task model is no language model)
    raise ValueError(f"the checkpoint{where} was trained on task {name!r}, which is "
                     f"not registered here (registered tasks: {', '.join(names())}; docs/tasks.md)")
  return get(name).from_metadata(config, metadata["task"], ckpt_path)


def export_files(config, metadata: dict, ckpt_path: str, directory: str) -> dict:
  """A checkpoint's metadata for a copy of it written to `directory` (by scripts that derive one model from
  another): the task's files (a tokenizer) written there too, named relative to it. Unchanged without a task, or
  for a task not registered here (whose files this code cannot know: the copy keeps its metadata as it is)."""
  if name_of(metadata) not in _REGISTRY:
    return metadata
  task = for_checkpoint(config, metadata, ckpt_path)
  return metadata if task is None else {**metadata, "task": task.export_files(directory)}
