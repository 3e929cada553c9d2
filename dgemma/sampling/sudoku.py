"""Solving Sudoku with a trained checkpoint: prompts, generation with either decoder, decoding.

A Sudoku checkpoint names its task in its metadata (written by train.py):

- `{"name": "sudoku_digits", "prompt_len": 82}`: the compact digit vocabulary of `dgemma.data.sudoku_task`
  (prompt BOS + 81 cells, one 81-token canvas whose tokens are the cells; stops at EOS).
- `{"name": "sudoku_text", "prompt_len": 256, "tokenizer": PATH}`: the official text format of
  `dgemma.data.sudoku_text`, through the checkpoint's tokenizer (the solution is the last 81 digits of the
  canvas text; stops at EOS and `<turn|>`).

`load_task` turns (config, metadata, checkpoint path) into a `SudokuTask`; `solve` and
`solve_autoregressive` run a batch of puzzles through it.
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax
import numpy as np

from dgemma.config import ModelConfig
from dgemma.data import sudoku, sudoku_task, sudoku_text
from dgemma.data.tokenizer import Tokenizer, load_tokenizer
from dgemma.sampling.autoregressive import ARConfig, generate_autoregressive
from dgemma.sampling.generate import SamplerConfig, generate

TASKS = ("sudoku_digits", "sudoku_text")


@dataclasses.dataclass
class SudokuTask:
  name: str
  prompt_len: int
  config: ModelConfig  # the model config with the task's special ids
  tokenizer: Tokenizer | None  # sudoku_text only

  def prompts(self, puzzles: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """([B, prompt_len] tokens, [B, prompt_len] valid) for [B, 81] digit puzzles, exactly as in training."""
    puzzles = _check_puzzles(puzzles)
    if self.name == "sudoku_digits":
      tokens = sudoku_task.encode_batch(puzzles, np.zeros_like(puzzles), self.prompt_len,
                                        sudoku.NUM_CELLS)["prompt"]
      return tokens, tokens != sudoku_task.PAD_ID
    batch = sudoku_text.encode_batch(self.tokenizer, puzzles, None, self.prompt_len, self.config.canvas_length)
    return batch["prompt"], batch["prompt_valid"]

  def decode(self, tokens: np.ndarray) -> np.ndarray:
    """[B, T] generated tokens -> [B, 81] int8 predicted digits (0 where the model gave no digit)."""
    if self.name == "sudoku_digits":
      return sudoku_task.decode_batch(tokens)
    return sudoku_text.decode_batch(self.tokenizer, tokens)

  def cells(self, canvas: np.ndarray) -> np.ndarray:
    """A possibly unfinished canvas as 81 digits, for display: the digit tokens in order (text: the first 81
    digit characters of its text), blanks (0) where there are none yet."""
    canvas = np.asarray(canvas)
    if self.name == "sudoku_digits":
      return sudoku_task.decode_batch(canvas[None])[0]
    text = self.tokenizer.decode(canvas, skip_special=True)
    digits = re.sub(r"[^0-9]", "", text)[:sudoku.NUM_CELLS].ljust(sudoku.NUM_CELLS, "0")
    return (np.frombuffer(digits.encode("ascii"), np.uint8) - ord("0")).astype(np.int8)

  def sampler(self, sampler_config: SamplerConfig) -> SamplerConfig:
    """One canvas of the model's canvas length, the task's stop ids; the other knobs as given."""
    return dataclasses.replace(sampler_config, canvas_length=self.config.canvas_length,
                               max_new_tokens=self.config.canvas_length, stop_ids=self.config.stop_ids)


def task_name(metadata: dict) -> str | None:
  task = metadata.get("task") if isinstance(metadata, dict) else None
  name = task.get("name") if isinstance(task, dict) else None
  return name if name in TASKS else None


def load_task(config: ModelConfig, metadata: dict, ckpt_path: str | None = None) -> SudokuTask:
  """The Sudoku task of a checkpoint; a one-line ValueError for any other checkpoint."""
  name = task_name(metadata)
  if name is None:
    raise ValueError(f"not a Sudoku checkpoint: its metadata names no task in {list(TASKS)}")
  task = metadata["task"]
  if name == "sudoku_digits":
    if config.canvas_length < sudoku.NUM_CELLS:
      raise ValueError(f"the model's canvas_length {config.canvas_length} cannot hold 81 cells")
    config = config.replace(stop_ids=(sudoku_task.EOS_ID,), pad_id=sudoku_task.PAD_ID,
                            eos_id=sudoku_task.EOS_ID, bos_id=sudoku_task.BOS_ID)
    return SudokuTask(name, int(task.get("prompt_len", sudoku_task.PROMPT_CONTENT_LEN)), config, None)
  where = task.get("tokenizer") or ckpt_path
  if not where or not os.path.exists(where):
    raise ValueError(f"the sudoku_text checkpoint's tokenizer {where!r} does not exist")
  tokenizer = load_tokenizer(where)
  stops = [tokenizer.eos_id] + ([tokenizer.id_of("<turn|>")] if tokenizer.has_token("<turn|>") else [])
  config = config.replace(stop_ids=tuple(stops), pad_id=tokenizer.pad_id, eos_id=tokenizer.eos_id,
                          bos_id=tokenizer.bos_id)
  return SudokuTask(name, int(task.get("prompt_len", 256)), config, tokenizer)


def parse_puzzle(text: str) -> np.ndarray:
  """An 81-digit puzzle string ('0' or '.' for blanks; spaces, newlines, '|' and ',' ignored) -> [81] int8."""
  cleaned = "".join(ch for ch in text if not ch.isspace() and ch not in "|,").replace(".", "0")
  if len(cleaned) != sudoku.NUM_CELLS or not cleaned.isdigit() or not cleaned.isascii():
    shown = cleaned if len(cleaned) <= 24 else cleaned[:24] + "..."
    raise ValueError(f"a Sudoku puzzle must be 81 digits (0 or . for blanks), got {len(cleaned)} characters "
                     f"{shown!r}")
  return (np.frombuffer(cleaned.encode("ascii"), np.uint8) - ord("0")).astype(np.int8)


def _check_puzzles(puzzles: np.ndarray) -> np.ndarray:
  puzzles = np.asarray(puzzles)
  if puzzles.ndim != 2 or puzzles.shape[1] != sudoku.NUM_CELLS:
    raise ValueError(f"expected puzzles of shape [B, 81], got {puzzles.shape}")
  if puzzles.size and (puzzles.min() < 0 or puzzles.max() > 9):
    raise ValueError("puzzle cells must be digits 0..9")
  return puzzles


@dataclasses.dataclass
class SudokuResult:
  predictions: np.ndarray  # [B, 81] int8 digits; 0 where the model gave no digit
  steps: np.ndarray  # [B] denoiser passes (diffusion) or tokens decoded (autoregressive)
  tokens_per_forward: np.ndarray  # [B]
  tokens: np.ndarray  # [B, T] generated tokens
  trajectory: np.ndarray | None = None  # [B, S, C] argmax canvas after each step (diffusion, when requested)


def solve(params: dict, task: SudokuTask, puzzles: np.ndarray, rng: jax.Array,
          sampler_config: SamplerConfig = SamplerConfig()) -> SudokuResult:
  """Solves [B, 81] puzzles by block diffusion (one canvas)."""
  tokens, valid = task.prompts(puzzles)
  out = generate(params, task.config, tokens, valid, rng, task.sampler(sampler_config))
  generated = np.asarray(out.tokens)
  trajectory = None if out.trajectory is None else np.asarray(out.trajectory)[:, 0]
  return SudokuResult(predictions=task.decode(generated), steps=np.asarray(out.steps_per_canvas)[:, 0],
                      tokens_per_forward=np.asarray(out.tokens_per_forward), tokens=generated,
                      trajectory=trajectory)


def ar_config(task: SudokuTask, temperature: float = 0.0) -> ARConfig:
  """The AR baseline decodes as many tokens as the diffusion canvas holds, with the same stop ids."""
  return ARConfig(max_new_tokens=task.config.canvas_length, temperature=temperature,
                  stop_ids=task.config.stop_ids)


def solve_autoregressive(params: dict, task: SudokuTask, puzzles: np.ndarray, rng: jax.Array,
                         temperature: float = 0.0) -> SudokuResult:
  """The AR baseline: the causal encoder decodes the answer one token at a time (greedy by default)."""
  tokens, valid = task.prompts(puzzles)
  out = generate_autoregressive(params, task.config, tokens, valid, rng, ar_config(task, temperature))
  generated = np.asarray(out.tokens)
  return SudokuResult(predictions=task.decode(generated), steps=np.asarray(out.forward_passes),
                      tokens_per_forward=np.asarray(out.tokens_per_forward), tokens=generated)
