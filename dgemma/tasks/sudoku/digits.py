"""Sudoku as a block-diffusion task with a compact digit vocabulary.

Vocabulary (``DIGIT_VOCAB_SIZE = 13``), meant for small models trained from
scratch::

    PAD = 0, EOS = 1, BOS = 2, digit d in 0..9 -> 3 + d  (blank '0' is id 3)

Each example uses a single canvas:

* ``prompt``      int32 [prompt_len]: BOS, the 81 puzzle digits, then PAD.
* ``canvas``      int32 [canvas_len]: the 81 solution digits, then EOS fill.
* ``canvas_mask`` bool  [canvas_len]: all True -- as in the official recipe the
  EOS fill is part of the target the model learns to denoise.

The training pipeline is built on grain's dataset API so that its iterator can
be checkpointed and resumed exactly, including the random symmetry
augmentation (keyed by seed, epoch and record index rather than by a stateful
generator).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import grain
import numpy as np

from dgemma.tasks.sudoku import puzzles as sudoku

__all__ = [
    "PAD_ID",
    "EOS_ID",
    "BOS_ID",
    "DIGIT_OFFSET",
    "DIGIT_VOCAB_SIZE",
    "PROMPT_CONTENT_LEN",
    "digit_to_id",
    "id_to_digit",
    "encode_example",
    "encode_batch",
    "decode_canvas",
    "decode_batch",
    "score",
    "make_train_dataset",
    "CELL_POSITION_ROWS",
    "cell_position_features",
]

PAD_ID = 0
EOS_ID = 1
BOS_ID = 2
DIGIT_OFFSET = 3  # digit d (0 = blank) has token id DIGIT_OFFSET + d
DIGIT_VOCAB_SIZE = 13
PROMPT_CONTENT_LEN = 1 + sudoku.NUM_CELLS  # BOS + 81 puzzle cells


# Cell positions (the model's position-feature table; ModelConfig.num_position_features = 4): every position's
# embedding is the sum of four rows of a learned table: segment (BOS / prompt / canvas) + row + column + box of its
# cell. A clue and the canvas cell it fixes share three rows, and so do cells under one constraint, which attention
# then finds at once.
_SEGMENT_BOS, _SEGMENT_PROMPT, _SEGMENT_CANVAS, _NO_CELL = 0, 1, 2, 30
_ROW, _COL, _BOX = 3, 12, 21
CELL_POSITION_ROWS = 31


def cell_position_features(prompt_len: int = PROMPT_CONTENT_LEN, canvas_len: int = sudoku.NUM_CELLS
                           ) -> tuple[tuple[int, int, int, int], ...]:
    """(segment, row, column, box) table rows for positions 0..prompt_len+canvas_len-1 of one example."""
    def cell(segment: int, i: int) -> tuple[int, int, int, int]:
        if i >= sudoku.NUM_CELLS:  # prompt padding / canvas EOS fill
            return (segment, _NO_CELL, _NO_CELL, _NO_CELL)
        r, c = divmod(i, 9)
        return (segment, _ROW + r, _COL + c, _BOX + 3 * (r // 3) + c // 3)

    bos = (_SEGMENT_BOS, _NO_CELL, _NO_CELL, _NO_CELL)
    return ((bos,) + tuple(cell(_SEGMENT_PROMPT, i) for i in range(prompt_len - 1))
            + tuple(cell(_SEGMENT_CANVAS, i) for i in range(canvas_len)))


def digit_to_id(digits: Any) -> Any:
    """Maps digits 0..9 (an int or an array) to token ids 3..12."""
    return digits + DIGIT_OFFSET


def id_to_digit(ids: Any) -> Any:
    """Maps token ids 3..12 back to digits 0..9 (no range check; see decode_batch)."""
    return ids - DIGIT_OFFSET


# --- Encoding ----------------------------------------------------------------


def encode_batch(
    puzzles: np.ndarray, solutions: np.ndarray, prompt_len: int, canvas_len: int
) -> dict[str, np.ndarray]:
    """Encodes [B, 81] puzzles/solutions into prompt/canvas/canvas_mask arrays."""
    if prompt_len < PROMPT_CONTENT_LEN:
        raise ValueError(
            f"prompt_len must be >= {PROMPT_CONTENT_LEN} (BOS + 81 cells), got {prompt_len}"
        )
    if canvas_len < sudoku.NUM_CELLS:
        raise ValueError(f"canvas_len must be >= 81, got {canvas_len}")
    puzzles = np.asarray(puzzles)
    solutions = np.asarray(solutions)
    bsz = puzzles.shape[0]
    if puzzles.shape != (bsz, 81) or solutions.shape != (bsz, 81):
        raise ValueError(
            f"expected puzzles and solutions of shape [B, 81], got {puzzles.shape} and "
            f"{solutions.shape}"
        )
    prompt = np.full((bsz, prompt_len), PAD_ID, np.int32)
    prompt[:, 0] = BOS_ID
    prompt[:, 1:PROMPT_CONTENT_LEN] = digit_to_id(puzzles.astype(np.int32))
    canvas = np.full((bsz, canvas_len), EOS_ID, np.int32)
    canvas[:, : sudoku.NUM_CELLS] = digit_to_id(solutions.astype(np.int32))
    return {
        "prompt": prompt,
        "canvas": canvas,
        "canvas_mask": np.ones((bsz, canvas_len), bool),
    }


def encode_example(
    puzzle: np.ndarray, solution: np.ndarray, prompt_len: int, canvas_len: int
) -> dict[str, np.ndarray]:
    """Encodes one [81] puzzle/solution pair (see the module docstring for the layout)."""
    puzzles, solutions = np.asarray(puzzle)[None], np.asarray(solution)[None]
    batch = encode_batch(puzzles, solutions, prompt_len, canvas_len)
    return {k: v[0] for k, v in batch.items()}


# --- Decoding and scoring ----------------------------------------------------


def decode_batch(tokens: np.ndarray) -> np.ndarray:
    """Decodes [B, >=81] canvas tokens into [B, 81] int8 digits.

    Only the first 81 tokens are read. Any token that is not a digit id
    (PAD, EOS, BOS, a mask id, anything out of range) decodes to 0, the blank,
    so it can never match a solution digit.
    """
    tokens = np.asarray(tokens)
    if tokens.ndim != 2 or tokens.shape[1] < sudoku.NUM_CELLS:
        raise ValueError(f"expected canvas tokens of shape [B, >=81], got {tokens.shape}")
    cells = tokens[:, : sudoku.NUM_CELLS].astype(np.int64)
    digits = cells - DIGIT_OFFSET
    return np.where((digits >= 0) & (digits <= 9), digits, 0).astype(np.int8)


def decode_canvas(tokens: np.ndarray) -> str:
    """Decodes one canvas (>= 81 tokens) into an 81-char digit string; non-digit tokens -> '0'."""
    return sudoku.to_string(decode_batch(np.asarray(tokens)[None])[0])


def score(puzzles: np.ndarray, solutions: np.ndarray, predictions: np.ndarray) -> dict[str, float]:
    """Scores [B, 81] digit predictions (e.g. from :func:`decode_batch`).

    * ``accuracy``: fraction of puzzles whose 81 predicted digits all match.
    * ``cell_accuracy``: correct blank cells / blank cells, pooled over the
      batch. Unlike the official metric (correct cells / 81) this ignores the
      given clues, which would inflate it; 1.0 if there are no blanks.
    * ``clue_preservation``: preserved clues / given clues, pooled over the
      batch (1.0 if there are no clues).
    * ``exact_clue_preservation``: fraction of puzzles keeping every clue.
    """
    puzzles = np.asarray(puzzles)
    solutions = np.asarray(solutions)
    predictions = np.asarray(predictions)
    bsz = puzzles.shape[0]
    for name, arr in (("puzzles", puzzles), ("solutions", solutions), ("predictions", predictions)):
        if arr.shape != (bsz, sudoku.NUM_CELLS):
            raise ValueError(f"expected {name} of shape [{bsz}, 81], got {arr.shape}")
    if bsz == 0:
        raise ValueError("score() needs at least one example")
    correct = predictions == solutions
    given = puzzles != 0
    blanks = ~given
    num_blanks = int(blanks.sum())
    num_given = int(given.sum())
    clue_kept = (predictions == puzzles) | blanks
    return {
        "accuracy": float(correct.all(axis=1).mean()),
        "cell_accuracy": float((correct & blanks).sum() / num_blanks) if num_blanks else 1.0,
        "clue_preservation": (
            float((clue_kept & given).sum() / num_given) if num_given else 1.0
        ),
        "exact_clue_preservation": float(clue_kept.all(axis=1).mean()),
    }


# --- Training pipeline -------------------------------------------------------

_MASK64 = np.uint64(0xFFFFFFFFFFFFFFFF)


def _splitmix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64 finalizer on uint64 arrays: a cheap, well-mixed integer hash."""
    with np.errstate(over="ignore"):
        z = x + np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return (z ^ (z >> np.uint64(31))) & _MASK64


def _keyed_uniforms(seed: int, epoch: np.ndarray, record: np.ndarray, num: int) -> np.ndarray:
    """[B, num] uniforms in [0, 1) that depend only on (seed, epoch[b], record[b]).

    A counter-based generator: unlike one stateful rng per batch, an example's
    augmentation does not depend on batch composition or iteration history,
    so resuming from a checkpoint reproduces it exactly.
    """
    h = _splitmix64(np.full(epoch.shape, seed, dtype=np.uint64))
    h = _splitmix64(h ^ epoch.astype(np.uint64))
    h = _splitmix64(h ^ record.astype(np.uint64))
    counters = np.arange(num, dtype=np.uint64) * np.uint64(0xD1B54A32D192ED03)
    bits = _splitmix64(h[:, None] ^ counters[None, :])
    return (bits >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))


class _TagEpoch:
    """(position in the repeated stream, record index) -> [record, epoch]."""

    def __init__(self, shard_len: int):
        self._shard_len = shard_len

    def __call__(self, position: int, record: int) -> np.ndarray:
        return np.array([record, position // self._shard_len], dtype=np.int64)


class _EncodeBatch:
    """Gathers, augments and encodes a [B, 2] batch of (record, epoch) pairs."""

    def __init__(
        self,
        data: dict[str, np.ndarray],
        prompt_len: int,
        canvas_len: int,
        augment_seed: int | None,
    ):
        self._data = data
        self._prompt_len = prompt_len
        self._canvas_len = canvas_len
        self._augment_seed = augment_seed

    def __call__(self, tags: np.ndarray) -> dict[str, np.ndarray]:
        records, epochs = tags[:, 0], tags[:, 1]
        puzzles = self._data["puzzle"][records]
        solutions = self._data["solution"][records]
        rounds = self._data["rounds"][records] if "rounds" in self._data else None
        if self._augment_seed is not None:
            u = _keyed_uniforms(self._augment_seed, epochs, records, sudoku.NUM_AUGMENT_UNIFORMS)
            puzzles, solutions = sudoku.augment_batch_from_uniforms(puzzles, solutions, u)
            if rounds is not None:
                rounds = sudoku.permute_cells_from_uniforms(rounds, u)
        batch = encode_batch(puzzles, solutions, self._prompt_len, self._canvas_len)
        if rounds is not None:  # canvas positions past the 81 cells (EOS fill) are "known" from the start
            batch["noise_rank"] = np.zeros(batch["canvas"].shape, np.float32)
            batch["noise_rank"][:, : sudoku.NUM_CELLS] = rounds
        # Symmetries preserve the clue count and whether singles suffice.
        batch["num_clues"] = self._data["num_clues"][records]
        batch["needs_search"] = self._data["needs_search"][records]
        return batch


def make_train_dataset(
    data: dict[str, np.ndarray],
    batch_size: int,
    prompt_len: int,
    canvas_len: int,
    seed: int,
    augment: bool = True,
    shard_index: int = 0,
    shard_count: int = 1,
    read_options: grain.ReadOptions | None = None,
    noise_rank: bool = False,
) -> grain.IterDataset:
    """An infinite, checkpointable stream of encoded training batches.

    Each batch is ``{"prompt": [B, prompt_len] int32, "canvas": [B, canvas_len]
    int32, "canvas_mask": [B, canvas_len] bool, "num_clues": [B] int16,
    "needs_search": [B] bool}``. Records ``shard_index::shard_count`` belong to
    this process (shards are disjoint); they are reshuffled every epoch from
    ``seed``. With ``noise_rank``, batches also carry ``"noise_rank": [B,
    canvas_len] float32``, each cell's :func:`sudoku.deduction_rounds` round
    (the order for ``diffusion.ordered_noise_prob``). With ``augment``, each
    example gets a random symmetry determined by (seed, epoch, record
    index). Resume with ``it.get_state()`` / ``it.set_state(state)`` on the
    iterator.
    """
    for key in ("puzzle", "solution"):
        if key not in data:
            raise ValueError(f"data is missing the {key!r} array")
    if "needs_search" not in data:
        raise ValueError(
            "data is missing 'needs_search'; read CSVs with label_difficulty=True"
        )
    if not 0 <= shard_index < shard_count:
        raise ValueError(f"need 0 <= shard_index < shard_count, got {shard_index}, {shard_count}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    # Fail fast on bad lengths rather than inside a grain worker thread.
    encode_batch(np.zeros((0, 81), np.int8), np.zeros((0, 81), np.int8), prompt_len, canvas_len)

    arrays = {
        "puzzle": np.asarray(data["puzzle"], np.int8),
        "solution": np.asarray(data["solution"], np.int8),
        "num_clues": np.asarray(
            data["num_clues"] if "num_clues" in data else (np.asarray(data["puzzle"]) != 0).sum(1),
            np.int16,
        ),
        "needs_search": np.asarray(data["needs_search"], bool),
    }
    if noise_rank:
        start = time.perf_counter()
        arrays["rounds"] = sudoku.deduction_rounds(arrays["puzzle"], arrays["solution"])
        print(f"sudoku: deduction order of {len(arrays['rounds'])} puzzles "
              f"({time.perf_counter() - start:.0f} s)", file=sys.stderr)
    num_records = arrays["puzzle"].shape[0]
    # Independent 32-bit seeds for shuffling and augmentation (grain's shuffle needs < 2**32).
    shuffle_seed, augment_seed = (
        int(s) for s in np.random.SeedSequence(seed).generate_state(2, dtype=np.uint32)
    )

    ds = grain.MapDataset.range(num_records).slice(slice(shard_index, None, shard_count))
    shard_len = len(ds)
    if shard_len == 0:
        raise ValueError(
            f"shard {shard_index}/{shard_count} of {num_records} records is empty"
        )
    ds = ds.shuffle(seed=shuffle_seed).repeat()  # shuffle is reseeded per epoch
    ds = ds.map_with_index(_TagEpoch(shard_len))
    ds = ds.batch(batch_size, drop_remainder=True)
    ds = ds.map(_EncodeBatch(arrays, prompt_len, canvas_len, augment_seed if augment else None))
    # Data is in memory and encoding is vectorized numpy: one thread suffices.
    return ds.to_iter_dataset(
        read_options or grain.ReadOptions(num_threads=1, prefetch_buffer_size=4)
    )
