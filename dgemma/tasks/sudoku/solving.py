"""Solving a batch of Sudoku puzzles with a trained model: block diffusion (one canvas) or the autoregressive
baseline with the same backbone. `task` is a Sudoku task of `dgemma.tasks.sudoku.task` (digits or text)."""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from dgemma.sampling.autoregressive import ARConfig, generate_autoregressive
from dgemma.sampling.generate import SamplerConfig, generate
from dgemma.tasks.sudoku import puzzles as sudoku


def parse_puzzle(text: str) -> np.ndarray:
  """An 81-digit puzzle string ('0' or '.' for blanks; spaces, newlines, '|' and ',' ignored) -> [81] int8."""
  for position, ch in enumerate(text, 1):
    if not (ch.isspace() or ch in "|,." or ("0" <= ch <= "9")):
      raise ValueError(f"a Sudoku puzzle must be 81 digits (0 or . for blanks): character {ch!r} at position "
                       f"{position} is not one")
  cleaned = "".join(ch for ch in text if not ch.isspace() and ch not in "|,").replace(".", "0")
  if len(cleaned) != sudoku.NUM_CELLS:
    shown = cleaned if len(cleaned) <= 24 else cleaned[:24] + "..."
    raise ValueError(f"a Sudoku puzzle must be 81 digits (0 or . for blanks), got {len(cleaned)} characters "
                     f"{shown!r}")
  return (np.frombuffer(cleaned.encode("ascii"), np.uint8) - ord("0")).astype(np.int8)


def check_puzzles(puzzles: np.ndarray) -> np.ndarray:
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


def solve(params: dict, task, puzzles: np.ndarray, rng: jax.Array,
          sampler_config: SamplerConfig = SamplerConfig(), position_features=None) -> SudokuResult:
  """Solves [B, 81] puzzles by block diffusion (one canvas). `position_features`: the model's feature table, when
  it has one (its checkpoint's metadata["position_features"])."""
  tokens, valid = task.encode(puzzles)
  out = generate(params, task.config, tokens, valid, rng, task.sampler(sampler_config),
                 position_features=position_features)
  generated = np.asarray(out.tokens)
  trajectory = None if out.trajectory is None else np.asarray(out.trajectory)[:, 0]
  return SudokuResult(predictions=task.decode(generated), steps=np.asarray(out.steps_per_canvas)[:, 0],
                      tokens_per_forward=np.asarray(out.tokens_per_forward), tokens=generated,
                      trajectory=trajectory)


def ar_config(task, temperature: float = 0.0) -> ARConfig:
  """The AR baseline decodes as many tokens as the diffusion canvas holds, with the same stop ids."""
  return ARConfig(max_new_tokens=task.config.canvas_length, temperature=temperature,
                  stop_ids=task.config.stop_ids)


def solve_autoregressive(params: dict, task, puzzles: np.ndarray, rng: jax.Array,
                         temperature: float = 0.0, position_features=None) -> SudokuResult:
  """The AR baseline: the causal encoder decodes the answer one token at a time (greedy by default)."""
  tokens, valid = task.encode(puzzles)
  out = generate_autoregressive(params, task.config, tokens, valid, rng, ar_config(task, temperature),
                                position_features=position_features)
  generated = np.asarray(out.tokens)
  return SudokuResult(predictions=task.decode(generated), steps=np.asarray(out.forward_passes),
                      tokens_per_forward=np.asarray(out.tokens_per_forward), tokens=generated)
