"""Where a training run's log records go: library INFO logging (orbax, absl, jax) to a file in the workdir, the
terminal only WARNING and above, so that it shows the run's own printed lines (progress, evaluations) and warnings.
Python warnings are logged too, as one line each."""

from __future__ import annotations

import logging
import os
import warnings

from absl import logging as absl_logging

LOG_FILE = "train.log"


def _one_line_warning(message, category, filename, lineno, line=None) -> str:
  return f"{os.path.basename(filename)}:{lineno}: {category.__name__}: {str(message).strip().replace(chr(10), ' ')}"


def log_to_workdir(workdir: str, name: str = LOG_FILE) -> str:
  """Sends log records to `workdir/name` (appended; INFO and above) and raises every terminal handler of the root
  logger (absl's stderr handler) to WARNING; returns the file's path. Called again, it replaces its file."""
  os.makedirs(workdir, exist_ok=True)
  path = os.path.join(workdir, name)
  root = logging.getLogger()
  for handler in list(root.handlers):
    if getattr(handler, "_dgemma_log_file", False):  # a previous call's file
      root.removeHandler(handler)
      handler.close()
    else:
      handler.setLevel(max(handler.level, logging.WARNING))
  file_handler = logging.FileHandler(path)
  file_handler.setLevel(logging.INFO)
  file_handler.setFormatter(absl_logging.PythonFormatter())
  file_handler._dgemma_log_file = True
  root.addHandler(file_handler)
  warnings.formatwarning = _one_line_warning
  logging.captureWarnings(True)  # warnings.warn -> the "py.warnings" logger: one terminal line, and the file
  return path
