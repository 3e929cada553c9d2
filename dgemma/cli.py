"""Command-line plumbing shared by sample.py and the scripts: absl flag parsing without `app.run`, so that bad
input ends in one `error:` line and a non-zero exit code instead of a traceback."""

from __future__ import annotations

import os
import sys
from typing import Callable

from absl import flags

USER_ERRORS = (ValueError, FileNotFoundError, RuntimeError)


def run_main(argv: list[str], doc: str, run: Callable[[], int | None], flag_values: flags.FlagValues,
             errors: tuple[type[BaseException], ...] = USER_ERRORS) -> int:
  """Parses `argv` into `flag_values`, then calls `run()`; returns the process exit code."""
  if any(a in ("-h", "--help", "-help", "--helpshort") for a in argv[1:]):
    print(doc.strip() + "\n\nflags:\n" + flag_values.get_help())
    return 0
  try:
    flag_values.unparse_flags()
    flag_values(argv)
  except flags.Error as e:
    print(f"error: {e}", file=sys.stderr)
    return 2
  try:
    return run() or 0
  except errors as e:
    print(f"error: {e}", file=sys.stderr)
    return 1


def check_seed(seed: int, flag: str = "--seed") -> int:
  """The seed, or a one-line error: JAX keys take 32 bits of an integer seed, so 2**32 would silently repeat 0."""
  if not 0 <= seed < 2 ** 32:
    raise ValueError(f"{flag} must be in [0, 2**32), got {seed}")
  return seed


def check_output_path(path: str, flag: str) -> str:
  """`path`, or a one-line error if a file cannot be written there; checked before a run, not after it."""
  directory = os.path.dirname(os.path.abspath(path))
  if os.path.isdir(path):
    raise ValueError(f"{flag}={path} is a directory, not a file")
  if not os.path.isdir(directory):
    raise ValueError(f"{flag}={path}: directory {directory} does not exist")
  if not os.access(directory, os.W_OK) or (os.path.exists(path) and not os.access(path, os.W_OK)):
    raise ValueError(f"{flag}={path} cannot be written (permission denied)")
  return path


def exit(code: int) -> None:  # noqa: A001 (the scripts' `sys.exit`)
  """Ends a script's process with `code`. After an error it skips the interpreter's clean-up: a checkpoint that
  failed to restore leaves orbax's remaining reads failing on background threads, which would otherwise print
  a screen of tracebacks under the one-line error."""
  sys.stdout.flush()
  sys.stderr.flush()
  if code:
    os._exit(code)
  sys.exit(code)
