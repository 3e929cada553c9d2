"""Sudoku as two tasks behind `dgemma.tasks.base.Task`, one per token format of the same puzzles:

- `DigitsTask` ("sudoku_digits"): the compact digit vocabulary of `digits` (prompt BOS + 81 cells, one
  81-token canvas whose tokens are the cells; stops at EOS). Metadata {"name", "prompt_len"}.
- `TextTask` ("sudoku_text"): the official text format of `text`, through the checkpoint's tokenizer (the
  solution is the last 81 digits of the canvas text; stops at EOS and `<turn|>`). Metadata adds "tokenizer".

Inputs are [B, 81] digit puzzles (0: blank), answers [B, 81] digits. `load_task` is the Sudoku-only entry
point (scripts/eval_sudoku.py); `solve` and `solve_autoregressive` (from `solving`) run a batch through a task.
"""

from __future__ import annotations

import dataclasses
import os
import re
from typing import Any

import jax
import ml_collections
import numpy as np

from dgemma.config import ModelConfig
from dgemma.data.tokenizer import Tokenizer, load_tokenizer
from dgemma.tasks.base import TaskBase
from dgemma.tasks.sudoku import digits as sudoku_task
from dgemma.tasks.sudoku import display, evaluation, formats, rules
from dgemma.tasks.sudoku import puzzles as sudoku
from dgemma.tasks.sudoku import text as sudoku_text
from dgemma.tasks.sudoku.solving import (SudokuResult, ar_config, check_puzzles, parse_puzzle, solve,  # noqa: F401
                                         solve_autoregressive)

TASKS = ("sudoku_digits", "sudoku_text")


@dataclasses.dataclass(frozen=True)
class SudokuTask(TaskBase):
  """What both formats share: the puzzles, their checks, the evaluator and the grid display."""

  title = "Sudoku"

  # --- Training -----------------------------------------------------------------------------------
  @staticmethod
  def training_puzzles(c: ml_collections.ConfigDict) -> dict[str, np.ndarray]:
    """The training set: c.data.csv, else generated from c.data.seed; oversampled by c.data.search_repeat."""
    d = c.data
    if d.csv:
      data, skipped = formats.read_checked_csv(os.path.expanduser(d.csv), skip_bad_rows=d.get("skip_bad_rows", False))
      if skipped and jax.process_index() == 0:
        print(f"{d.csv}: skipped {skipped} row{'s' if skipped > 1 else ''} that break the rules "
              f"(data.skip_bad_rows); training on {len(data['puzzle'])}", flush=True)
      if not len(data["puzzle"]):
        raise ValueError(f"{d.csv}: no puzzles to train on")
    else:
      # Generation is pure Python, so a large set uses every core; a small one is not worth the workers'
      # start-up. The puzzles do not depend on the number of workers.
      workers = (os.cpu_count() or 1) if d.num_train >= 2000 else 1
      data = sudoku.generate_dataset(d.num_train, d.seed, d.min_clues, d.max_clues,
                                     cache_dir=os.path.expanduser(d.cache_dir) if d.cache_dir else None,
                                     num_workers=workers)
    # Repeating the puzzles that need search shifts the mix towards them. Old configs lack the key.
    return sudoku.oversample_search(data, d.get("search_repeat", 1))

  def make_evaluator(self, c: ml_collections.ConfigDict, metadata: dict) -> evaluation.Evaluator | None:
    return evaluation.make_evaluator(c, self, metadata)

  def describe(self, scores: dict[str, float]) -> str:
    return evaluation.describe(scores)

  # --- Sampling -----------------------------------------------------------------------------------
  def parse_prompt(self, text: str) -> np.ndarray:
    """An 81-digit puzzle whose clues keep the rules and that has a solution (refused in one line otherwise:
    sampling it would only show the model failing)."""
    puzzle = parse_puzzle(text)
    broken = rules.rule_violation(puzzle)
    if broken:
      raise ValueError(f"the puzzle breaks the rules: {broken}")
    if not sudoku.solve(puzzle, max_solutions=1):
      raise ValueError("the puzzle has no solution")
    return puzzle

  def prompts(self, puzzles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([B, prompt_len] tokens, [B, prompt_len] valid) for [B, 81] digit puzzles, exactly as in training."""
    return self.encode(puzzles)

  def first_valid(self, puzzle: np.ndarray, grids: np.ndarray) -> int | None:
    """The first grid that keeps the clues and obeys the rules (no solution needed)."""
    return sudoku.first_valid_index(puzzle, grids)

  def show(self, puzzle: np.ndarray, grid: np.ndarray) -> str:
    clues_kept = bool(np.all((puzzle == 0) | (grid == puzzle)))
    return (display.grid_text(grid) + f"\nvalid solution: {'yes' if sudoku.is_valid_solution(grid) else 'no'}; "
            f"clues kept: {'yes' if clues_kept else 'no'}")

  def frames(self, trajectory_SxC: np.ndarray, steps: int) -> list:
    return display.sudoku_frames(trajectory_SxC, steps, self.cells)


@dataclasses.dataclass(frozen=True)
class DigitsTask(SudokuTask):
  name = "sudoku_digits"
  supports_noise_rank = True  # the round in which a solver deduces each cell (digits.make_train_dataset)

  @classmethod
  def from_metadata(cls, config: ModelConfig, metadata: dict, ckpt_path: str | None = None) -> "DigitsTask":
    if config.canvas_length < sudoku.NUM_CELLS:
      raise ValueError(f"the model's canvas_length {config.canvas_length} cannot hold 81 cells")
    config = config.replace(stop_ids=(sudoku_task.EOS_ID,), pad_id=sudoku_task.PAD_ID,
                            eos_id=sudoku_task.EOS_ID, bos_id=sudoku_task.BOS_ID)
    return cls(int(metadata.get("prompt_len", sudoku_task.PROMPT_CONTENT_LEN)), config)

  @classmethod
  def from_config(cls, c: ml_collections.ConfigDict, config: ModelConfig) -> "DigitsTask":
    if config.vocab_size < sudoku_task.DIGIT_VOCAB_SIZE:
      raise ValueError(f"sudoku_digits needs vocab_size >= {sudoku_task.DIGIT_VOCAB_SIZE}, got {config.vocab_size}")
    return cls.from_metadata(config, {"name": cls.name, "prompt_len": c.data.prompt_len})

  def train_dataset(self, c, batch_size, shard_index, shard_count, noise_rank):
    return sudoku_task.make_train_dataset(
        self.training_puzzles(c), batch_size=batch_size, prompt_len=self.prompt_len,
        canvas_len=self.config.canvas_length, seed=c.seed, augment=c.data.augment, shard_index=shard_index,
        shard_count=shard_count, noise_rank=noise_rank)

  def encode(self, puzzles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    puzzles = check_puzzles(puzzles)
    tokens = sudoku_task.encode_batch(puzzles, np.zeros_like(puzzles), self.prompt_len, sudoku.NUM_CELLS)["prompt"]
    return tokens, tokens != sudoku_task.PAD_ID

  def decode(self, tokens: np.ndarray) -> np.ndarray:
    """[B, T] generated tokens -> [B, 81] int8 predicted digits (0 where the model gave no digit)."""
    return sudoku_task.decode_batch(tokens)

  def cells(self, canvas: np.ndarray) -> np.ndarray:
    """A possibly unfinished canvas as 81 digits, for display (0 where there is no digit yet)."""
    return sudoku_task.decode_batch(np.asarray(canvas)[None])[0]


@dataclasses.dataclass(frozen=True)
class TextTask(SudokuTask):
  tokenizer: Tokenizer | None = None
  tokenizer_path: str = ""
  name = "sudoku_text"

  @property
  def metadata(self) -> dict[str, Any]:
    return {**super().metadata, "tokenizer": self.tokenizer_path}

  @classmethod
  def from_metadata(cls, config: ModelConfig, metadata: dict, ckpt_path: str | None = None) -> "TextTask":
    where = metadata.get("tokenizer") or ckpt_path
    if not where or not os.path.exists(where):
      raise ValueError(f"the sudoku_text checkpoint's tokenizer {where!r} does not exist")
    tokenizer = load_tokenizer(where)
    stops = [tokenizer.eos_id] + ([tokenizer.id_of("<turn|>")] if tokenizer.has_token("<turn|>") else [])
    config = config.replace(stop_ids=tuple(stops), pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id,
                            bos_id=tokenizer.bos_id)
    return cls(int(metadata.get("prompt_len", 256)), config, tokenizer, where)

  @classmethod
  def from_config(cls, c: ml_collections.ConfigDict, config: ModelConfig) -> "TextTask":
    """The official format, tokenised with c.data.tokenizer, else the init_from checkpoint's tokenizer."""
    tokenizer_path = os.path.expanduser(c.data.tokenizer or c.init_from)
    if not tokenizer_path:
      raise ValueError("task.name='sudoku_text' needs data.tokenizer or init_from (a directory with a tokenizer)")
    tok = load_tokenizer(tokenizer_path)
    if tok.vocab_size > config.vocab_size or tok.pad_id != config.pad_id:
      raise ValueError(f"tokenizer {tokenizer_path} (vocab {tok.vocab_size}, pad {tok.pad_id}) does not fit the "
                       f"model (vocab {config.vocab_size}, pad {config.pad_id})")
    return cls.from_metadata(config, {"name": cls.name, "prompt_len": c.data.prompt_len,
                                      "tokenizer": os.path.abspath(tokenizer_path)})

  def train_dataset(self, c, batch_size, shard_index, shard_count, noise_rank):
    if noise_rank:
      raise ValueError(f"{self.name} batches carry no noise order")
    return sudoku_text.make_train_dataset(
        self.tokenizer, self.training_puzzles(c), batch_size=batch_size, prompt_len=self.prompt_len,
        canvas_len=self.config.canvas_length, seed=c.seed, augment=c.data.augment, shard_index=shard_index,
        shard_count=shard_count)

  def encode(self, puzzles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    puzzles = check_puzzles(puzzles)
    batch = sudoku_text.encode_batch(self.tokenizer, puzzles, None, self.prompt_len, self.config.canvas_length)
    return batch["prompt"], batch["prompt_valid"]

  def decode(self, tokens: np.ndarray) -> np.ndarray:
    """[B, T] generated tokens -> [B, 81] int8 predicted digits (0 where the model gave no digit)."""
    return sudoku_text.decode_batch(self.tokenizer, tokens)

  def cells(self, canvas: np.ndarray) -> np.ndarray:
    """A possibly unfinished canvas as 81 digits, for display: the first 81 digit characters of its text."""
    text = self.tokenizer.decode(np.asarray(canvas), skip_special=True)
    digits = re.sub(r"[^0-9]", "", text)[:sudoku.NUM_CELLS].ljust(sudoku.NUM_CELLS, "0")
    return (np.frombuffer(digits.encode("ascii"), np.uint8) - ord("0")).astype(np.int8)


_CLASSES = {cls.name: cls for cls in (DigitsTask, TextTask)}


def task_name(metadata: dict) -> str | None:
  task = metadata.get("task") if isinstance(metadata, dict) else None
  name = task.get("name") if isinstance(task, dict) else None
  return name if name in TASKS else None


def load_task(config: ModelConfig, metadata: dict, ckpt_path: str | None = None) -> SudokuTask:
  """The Sudoku task of a checkpoint; a one-line ValueError for any other checkpoint."""
  name = task_name(metadata)
  if name is None:
    raise ValueError(f"not a Sudoku checkpoint: its metadata names no task in {list(TASKS)}")
  return _CLASSES[name].from_metadata(config, metadata["task"], ckpt_path)
