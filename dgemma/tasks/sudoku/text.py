"""Sudoku in the official text format, tokenised with a checkpoint's tokenizer.

This is the format of the released Sudoku recipe (spec §6), for fine-tuning a
pretrained checkpoint; :mod:`dgemma.tasks.sudoku.digits` is the compact
digit-vocabulary format for small models trained from scratch.

* Prompt: :data:`SUDOKU_PROMPT` with ``{text}`` = the puzzle as 81 digits
  separated by single spaces (``"5 3 0 0 7 ..."``, 0 = blank), tokenised with
  BOS first and right-padded with PAD (spec §4.2).
* Target: the spaced solution alone -- no ``<turn|>``, no explicit EOS. The
  canvas holds its tokens (no BOS) and the rest of the canvas is EOS fill,
  which is part of the training target (``canvas_mask`` all True).
* Evaluation: the generated text's solution is the last 81 digit characters
  (the official THINKING extraction, :func:`extract_solution`).

Every formatted string is tokenised as a whole rather than assembled from
per-digit token ids: digits and spaces usually tokenise independently of their
neighbours, but nothing guarantees it for an arbitrary tokenizer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import grain
import numpy as np

from dgemma.tasks.sudoku import digits as sudoku_task, puzzles as sudoku
from dgemma.data.tokenizer import Tokenizer

__all__ = [
    "SUDOKU_PROMPT",
    "format_prompt",
    "format_target",
    "encode_batch",
    "extract_solution",
    "decode_batch",
    "make_train_dataset",
]

# Spec §6, exact: a space (not a newline) follows "system" and "user", and the
# prompt ends with a newline after "model".
SUDOKU_PROMPT = (
    "<|turn>system Solve the following Sudoku puzzle. Empty cells are represented by 0. "
    "Output ONLY the solved puzzle immediately as a 9x9 grid of numbers separated by spaces. "
    "Do not include ####, explanations, or any other text.<turn|>\n"
    "<|turn>user {text}<turn|>\n"
    "<|turn>model\n"
)

_SPACED_LEN = 2 * sudoku.NUM_CELLS - 1  # 81 digits and 80 single spaces
_NON_DIGITS = re.compile(r"[^0-9]")


# --- Formatting ----------------------------------------------------------------


def _as_grids(grids: Any, name: str) -> np.ndarray:
    """Checks a [B, 81] array of digits 0..9 and returns it as uint8."""
    grids = np.asarray(grids)
    if grids.ndim != 2 or grids.shape[1] != sudoku.NUM_CELLS:
        raise ValueError(f"expected {name} of shape [B, 81], got {grids.shape}")
    if grids.size and (grids.min() < 0 or grids.max() > 9):
        raise ValueError(
            f"{name} must hold digits 0..9, got values in [{grids.min()}, {grids.max()}]"
        )
    return grids.astype(np.uint8)


def _spaced_rows(grids: np.ndarray) -> list[str]:
    """[B, 81] digits -> B strings "d d d ... d" (vectorised: no per-cell str())."""
    chars = np.full((grids.shape[0], _SPACED_LEN), ord(" "), np.uint8)
    chars[:, ::2] = grids + ord("0")
    return [row.decode("ascii") for row in chars.view(f"S{_SPACED_LEN}").ravel()]


def _prompts(puzzles: np.ndarray) -> list[str]:
    return [SUDOKU_PROMPT.format(text=text) for text in _spaced_rows(puzzles)]


def format_prompt(puzzle: np.ndarray | Sequence[int]) -> str:
    """The full prompt text for one puzzle of 81 digits (0 = blank), without BOS."""
    return _prompts(_as_grids(np.asarray(puzzle)[None], "puzzle"))[0]


def format_target(solution: np.ndarray | Sequence[int]) -> str:
    """The target text for one solution: its 81 digits separated by single spaces."""
    return _spaced_rows(_as_grids(np.asarray(solution)[None], "solution"))[0]


# --- Encoding ------------------------------------------------------------------


def _pack(rows: list[list[int]], length: int, fill: int) -> tuple[np.ndarray, np.ndarray]:
    """Left-aligns token rows in a [B, length] int32 array filled with ``fill``.

    Returns the array and its [B, length] mask of real (non-fill) positions.
    """
    lengths = np.array([len(r) for r in rows], np.int64)
    valid = np.arange(length)[None, :] < lengths[:, None]
    out = np.full((len(rows), length), fill, np.int32)
    if rows:
        # Row-major order of `valid` matches the concatenation order of the rows.
        out[valid] = np.fromiter((t for r in rows for t in r), np.int32, int(lengths.sum()))
    return out, valid


def encode_batch(
    tokenizer: Tokenizer,
    puzzles: np.ndarray,
    solutions: np.ndarray | None,
    prompt_len: int,
    canvas_len: int,
) -> dict[str, np.ndarray]:
    """Tokenises [B, 81] puzzles (and solutions) into the model's input layout.

    Returns ``prompt`` [B, prompt_len] int32 (BOS + prompt tokens, right-padded
    with ``tokenizer.pad_id``) and ``prompt_valid`` [B, prompt_len] bool (the
    non-padding positions). With ``solutions`` it also returns ``canvas``
    [B, canvas_len] int32 (the target tokens, no BOS, then ``eos_id`` fill) and
    ``canvas_mask`` [B, canvas_len] bool, all True since the EOS fill is part of
    the target; without them (generation) there is no canvas.

    Raises ValueError if a prompt is longer than ``prompt_len`` or a target
    longer than ``canvas_len``: truncating a prompt loses the puzzle and
    truncating a target makes a wrong label, so neither is done silently.
    """
    puzzles = _as_grids(puzzles, "puzzles")
    prompt_ids = tokenizer.encode_batch(_prompts(puzzles), add_bos=True)
    longest = max((len(ids) for ids in prompt_ids), default=0)
    if longest > prompt_len:
        raise ValueError(
            f"Sudoku prompt of {longest} tokens (BOS included) does not fit prompt_len={prompt_len}"
        )
    prompt, prompt_valid = _pack(prompt_ids, prompt_len, tokenizer.pad_id)
    batch = {"prompt": prompt, "prompt_valid": prompt_valid}
    if solutions is None:
        return batch

    solutions = _as_grids(solutions, "solutions")
    if solutions.shape != puzzles.shape:
        raise ValueError(f"got {puzzles.shape[0]} puzzles but {solutions.shape[0]} solutions")
    target_ids = tokenizer.encode_batch(_spaced_rows(solutions), add_bos=False)
    longest = max((len(ids) for ids in target_ids), default=0)
    if longest > canvas_len:
        raise ValueError(
            f"Sudoku target of {longest} tokens does not fit canvas_len={canvas_len} "
            "(a truncated solution would be a wrong label)"
        )
    batch["canvas"], _ = _pack(target_ids, canvas_len, tokenizer.eos_id)
    batch["canvas_mask"] = np.ones((puzzles.shape[0], canvas_len), bool)
    return batch


# --- Decoding ------------------------------------------------------------------


def extract_solution(text: str) -> np.ndarray | None:
    """The last 81 ASCII digits of ``text`` as int8 [81], or None if it has fewer.

    This is the official THINKING-mode extraction: everything that is not a
    digit (spaces, newlines, turn markers, prose) is ignored.
    """
    digits = _NON_DIGITS.sub("", text)
    if len(digits) < sudoku.NUM_CELLS:
        return None
    tail = digits[-sudoku.NUM_CELLS :].encode("ascii")
    return (np.frombuffer(tail, np.uint8) - ord("0")).astype(np.int8)


def decode_batch(tokenizer: Tokenizer, tokens: np.ndarray) -> np.ndarray:
    """Decodes [B, L] generated canvas tokens into [B, 81] int8 digit predictions.

    As the official evaluation sampler does, each row is cut before its first
    stop token (EOS, and ``<turn|>`` when the vocabulary has it); the rest is
    decoded and :func:`extract_solution` applied. A row with fewer than 81
    digits decodes to all zeros (blanks), which never match a solution, so the
    result can go straight to :func:`dgemma.tasks.sudoku.digits.score`.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2:
        raise ValueError(f"expected canvas tokens of shape [B, L], got {tokens.shape}")
    stop_ids = [tokenizer.eos_id]
    if tokenizer.has_token("<turn|>"):
        stop_ids.append(tokenizer.id_of("<turn|>"))
    predictions = np.zeros((tokens.shape[0], sudoku.NUM_CELLS), np.int8)
    for b, row in enumerate(tokens):
        stops = np.flatnonzero(np.isin(row, stop_ids))
        kept = row[: stops[0]] if stops.size else row
        solution = extract_solution(tokenizer.decode(kept, skip_special=True))
        if solution is not None:
            predictions[b] = solution
    return predictions


# --- Training pipeline -----------------------------------------------------------


class _EncodeTextBatch:
    """Re-encodes a digit-vocabulary batch of :mod:`sudoku_task` in the text format."""

    def __init__(self, tokenizer: Tokenizer, prompt_len: int, canvas_len: int):
        self._tokenizer = tokenizer
        self._prompt_len = prompt_len
        self._canvas_len = canvas_len

    def __call__(self, batch: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        # The digit batch is laid out as BOS + 81 puzzle ids / 81 solution ids.
        puzzles = sudoku_task.id_to_digit(batch["prompt"][:, 1 : sudoku_task.PROMPT_CONTENT_LEN])
        solutions = sudoku_task.id_to_digit(batch["canvas"][:, : sudoku.NUM_CELLS])
        encoded = encode_batch(
            self._tokenizer, puzzles, solutions, self._prompt_len, self._canvas_len
        )
        return {
            "prompt": encoded["prompt"],
            "canvas": encoded["canvas"],
            "canvas_mask": encoded["canvas_mask"],
            "num_clues": batch["num_clues"],
            "needs_search": batch["needs_search"],
        }


def make_train_dataset(
    tokenizer: Tokenizer,
    data: dict[str, np.ndarray],
    batch_size: int,
    prompt_len: int,
    canvas_len: int,
    seed: int,
    augment: bool = True,
    shard_index: int = 0,
    shard_count: int = 1,
    read_options: grain.ReadOptions | None = None,
) -> grain.IterDataset:
    """An infinite, checkpointable stream of text-format training batches.

    Each batch is ``{"prompt": [B, prompt_len] int32, "canvas": [B, canvas_len]
    int32, "canvas_mask": [B, canvas_len] bool, "num_clues": [B] int16,
    "needs_search": [B] bool}``. This is the pipeline of
    :func:`dgemma.tasks.sudoku.digits.make_train_dataset` (``read_options`` go to
    it) with each batch re-encoded as text, so sharding, per-epoch shuffling
    and the deterministic symmetry augmentation are exactly the same: same
    records, same order, same symmetries for the same seed. Resume with
    ``it.get_state()`` / ``it.set_state(state)``.

    Gathering and augmentation run in grain's prefetch thread; tokenisation
    runs when ``next()`` is called. Under JAX's asynchronous dispatch that
    overlaps the device's previous step, and it costs milliseconds per batch.
    (grain 0.2.18's thread-prefetch wrapper for an IterDataset, which would
    move it off the main thread, can abort the interpreter at exit.)

    The lengths are checked up front on the first records; since token counts
    may depend on the digits, a later (augmented) batch that does not fit still
    raises the ValueError of :func:`encode_batch`.
    """
    digit_ds = sudoku_task.make_train_dataset(
        data,
        batch_size=batch_size,
        prompt_len=sudoku_task.PROMPT_CONTENT_LEN,
        canvas_len=sudoku.NUM_CELLS,
        seed=seed,
        augment=augment,
        shard_index=shard_index,
        shard_count=shard_count,
        read_options=read_options,
    )
    # Fail fast on lengths that are too short, rather than at some later step.
    probe = slice(0, min(64, len(data["puzzle"])))
    encode_batch(
        tokenizer, data["puzzle"][probe], data["solution"][probe], prompt_len, canvas_len
    )
    return digit_ds.map(_EncodeTextBatch(tokenizer, prompt_len, canvas_len))
