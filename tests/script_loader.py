"""The command-line scripts (sample.py, scripts/*.py) are not a package: tests load them as modules by path."""

import importlib.util
import pathlib
import types

ROOT = pathlib.Path(__file__).resolve().parents[1]


def load_script(relative: str) -> types.ModuleType:
  """A fresh module object for ROOT/relative (e.g. "scripts/eval_sudoku.py"); its flags live in its own FlagValues."""
  spec = importlib.util.spec_from_file_location(pathlib.Path(relative).stem + "_under_test", ROOT / relative)
  module = importlib.util.module_from_spec(spec)
  spec.loader.exec_module(module)
  return module
