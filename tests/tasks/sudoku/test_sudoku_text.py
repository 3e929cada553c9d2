"""Tests for the checkpoint tokenizer wrapper and the official Sudoku text format."""

from __future__ import annotations

import importlib.util
import os
import re

import numpy as np
import pytest
import tokenizers
from tokenizers import decoders, models

from dgemma.tasks.sudoku import puzzles as sudoku, digits as sudoku_task, text as sudoku_text
from dgemma.data.tokenizer import Tokenizer, load_tokenizer

# Spec §6, written out by hand: spaces after "system" and "user", real newlines.
SPEC_PROMPT = (
    "<|turn>system Solve the following Sudoku puzzle. Empty cells are represented by 0. "
    "Output ONLY the solved puzzle immediately as a 9x9 grid of numbers separated by "
    "spaces. Do not include ####, explanations, or any other text.<turn|>\n"
    "<|turn>user {text}<turn|>\n<|turn>model\n"
)
EASY = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
EASY_SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"

SPECIALS = ["<pad>", "<eos>", "<bos>", "<unk>", "<|turn>", "<turn|>"]
PAD, EOS, BOS, TURN_END = 0, 1, 2, 5
# Every character the prompt and target can contain.
CHARS = sorted(set(SPEC_PROMPT.replace("{text}", "")) | set("0123456789 "))


def _save_tokenizer(path: str, specials: list[str] = SPECIALS) -> None:
    """A tiny real HF tokenizer: one token per character, special tokens as added tokens.

    The merge "1" + " " -> "1 " makes token counts depend on the digits, as they
    may with a real tokenizer, so rows of a batch have different lengths.
    """
    vocab = {tok: i for i, tok in enumerate(specials)}
    for token in [*CHARS, "1 "]:
        vocab[token] = len(vocab)
    unk = "<unk>" if "<unk>" in specials else None
    tok = tokenizers.Tokenizer(models.BPE(vocab=vocab, merges=[("1", " ")], unk_token=unk))
    tok.add_special_tokens(specials)
    tok.decoder = decoders.Fuse()  # concatenate tokens, so decode(encode(x)) == x
    tok.save(path)


@pytest.fixture(scope="module")
def tok_dir(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("ckpt"))
    _save_tokenizer(os.path.join(directory, "tokenizer.json"))
    return directory


@pytest.fixture(scope="module")
def tok(tok_dir) -> Tokenizer:
    return load_tokenizer(tok_dir)


@pytest.fixture(scope="module")
def dataset() -> dict[str, np.ndarray]:
    return sudoku.generate_dataset(12, seed=0)


# --- Tokenizer -------------------------------------------------------------------


def test_load_tokenizer_from_directory_and_file(tok_dir, tok):
    from_file = load_tokenizer(os.path.join(tok_dir, "tokenizer.json"))
    for t in (tok, from_file):
        assert (t.pad_id, t.eos_id, t.bos_id) == (PAD, EOS, BOS)
        assert t.vocab_size == len(SPECIALS) + len(CHARS) + 1  # + the merged "1 "
        assert t.id_of("<turn|>") == TURN_END and t.has_token("<|turn>")
    text = "<|turn>user 1 2<turn|>\n"
    ids = tok.encode(text, add_bos=False)
    assert ids[0] == tok.id_of("<|turn>")  # added tokens match as one token
    assert BOS not in ids and EOS not in ids  # no special ids added on its own
    assert tok.encode(text, add_bos=True) == [BOS, *ids]
    assert tok.decode(ids) == text
    assert tok.decode(np.array([BOS, *ids, EOS, PAD])) == "<bos>" + text + "<eos><pad>"
    assert tok.decode([BOS, *ids, EOS, PAD], skip_special=True) == text
    assert tok.encode_batch([text, "3"], add_bos=True) == [[BOS, *ids], [BOS, tok.id_of("3")]]


def test_special_ids_fall_back_to_gemma_ids(tmp_path):
    path = str(tmp_path / "tokenizer.json")
    _save_tokenizer(path, specials=["<unk>", "<s>", "</s>"])
    t = load_tokenizer(path)
    assert (t.pad_id, t.eos_id, t.bos_id) == (0, 1, 2)


def test_tokenizer_errors(tmp_path, tok):
    empty = tmp_path / "empty"
    empty.mkdir()
    looked_for = r"no tokenizer file found \(looked for tokenizer.json, tokenizer.model"
    with pytest.raises(FileNotFoundError, match=looked_for):
        load_tokenizer(empty)
    with pytest.raises(FileNotFoundError, match="no such tokenizer file"):
        load_tokenizer(tmp_path / "missing")
    (tmp_path / "vocab.txt").write_text("a\n")
    with pytest.raises(ValueError, match="unknown tokenizer format"):
        load_tokenizer(tmp_path / "vocab.txt")
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(ValueError, match="not a valid HF tokenizer.json"):
        load_tokenizer(tmp_path / "bad.json")
    two = tmp_path / "two"
    two.mkdir()
    (two / "tokenizer_a.model").write_bytes(b"")
    (two / "tokenizer_b.model").write_bytes(b"")
    with pytest.raises(ValueError, match="several tokenizer files"):
        load_tokenizer(two)
    with pytest.raises(ValueError, match="'<nope>' is not in the vocabulary"):
        tok.id_of("<nope>")


def test_sentencepiece_missing_is_a_clear_error(tmp_path):
    if importlib.util.find_spec("sentencepiece") is not None:
        pytest.skip("sentencepiece is installed")
    (tmp_path / "tokenizer_gemma4.model").write_bytes(b"")
    with pytest.raises(ImportError, match="pip install sentencepiece"):
        load_tokenizer(tmp_path)


# --- Text format ---------------------------------------------------------------


def test_prompt_and_target_strings():
    assert sudoku_text.SUDOKU_PROMPT == SPEC_PROMPT
    spaced = " ".join(EASY)
    prompt = sudoku_text.format_prompt(sudoku.from_string(EASY))
    assert prompt == SPEC_PROMPT.replace("{text}", spaced)
    assert prompt.startswith("<|turn>system Solve") and prompt.endswith("<turn|>\n<|turn>model\n")
    assert "<|turn>user 5 3 0 0 7 0 0 0 0 6 0 0" in prompt
    assert sudoku_text.format_target([int(c) for c in EASY_SOLUTION]) == " ".join(EASY_SOLUTION)
    with pytest.raises(ValueError, match="shape"):
        sudoku_text.format_prompt(np.zeros(80, np.int8))
    with pytest.raises(ValueError, match="digits 0..9"):
        sudoku_text.format_target(np.full(81, 10))


def test_encode_batch_layout_and_round_trip(tok, dataset):
    puzzles, solutions = dataset["puzzle"][:4], dataset["solution"][:4]
    batch = sudoku_text.encode_batch(tok, puzzles, solutions, prompt_len=400, canvas_len=170)
    assert batch["prompt"].shape == (4, 400) and batch["prompt"].dtype == np.int32
    assert batch["canvas"].shape == (4, 170) and batch["canvas"].dtype == np.int32
    assert batch["canvas_mask"].dtype == bool and batch["canvas_mask"].all()
    assert (batch["prompt"][:, 0] == BOS).all()
    prompt_lens, target_lens = set(), set()
    for b in range(4):
        prompt_ids = tok.encode(sudoku_text.format_prompt(puzzles[b]), add_bos=True)
        n = len(prompt_ids)
        prompt_lens.add(n)
        assert batch["prompt"][b, :n].tolist() == prompt_ids
        assert (batch["prompt"][b, n:] == PAD).all()
        assert batch["prompt_valid"][b].tolist() == [True] * n + [False] * (400 - n)
        target_ids = tok.encode(sudoku_text.format_target(solutions[b]), add_bos=False)
        m = len(target_ids)
        target_lens.add(m)
        assert batch["canvas"][b, :m].tolist() == target_ids and BOS not in target_ids
        assert (batch["canvas"][b, m:] == EOS).all()
        text = tok.decode(batch["canvas"][b], skip_special=True)
        assert text == " ".join(sudoku.to_string(solutions[b]))
        assert (sudoku_text.extract_solution(text) == solutions[b]).all()
    assert len(prompt_lens) > 1  # rows are padded individually
    # The merge "1 " makes a solution 152 or 153 tokens, depending on its last digit.
    assert target_lens <= {152, 153}
    assert (sudoku_text.decode_batch(tok, batch["canvas"]) == solutions).all()

    prompt_only = sudoku_text.encode_batch(tok, puzzles, None, prompt_len=400, canvas_len=170)
    assert set(prompt_only) == {"prompt", "prompt_valid"}
    assert (prompt_only["prompt"] == batch["prompt"]).all()


def test_encode_batch_length_errors(tok, dataset):
    puzzles, solutions = dataset["puzzle"][:2], dataset["solution"][:2]
    longest = max(len(tok.encode(sudoku_text.format_prompt(p), add_bos=True)) for p in puzzles)
    with pytest.raises(ValueError, match=f"prompt of {longest} tokens .* prompt_len={longest - 1}"):
        sudoku_text.encode_batch(tok, puzzles, solutions, prompt_len=longest - 1, canvas_len=170)
    sudoku_text.encode_batch(tok, puzzles, solutions, prompt_len=longest, canvas_len=153)
    with pytest.raises(ValueError, match=r"target of 15\d tokens does not fit canvas_len=151"):
        sudoku_text.encode_batch(tok, puzzles, solutions, prompt_len=400, canvas_len=151)
    with pytest.raises(ValueError, match=re.escape("got 2 puzzles but 1 solutions")):
        sudoku_text.encode_batch(tok, puzzles, solutions[:1], prompt_len=400, canvas_len=170)


def test_extract_solution():
    spaced = " ".join(EASY_SOLUTION)
    assert (sudoku_text.extract_solution(spaced) == sudoku.from_string(EASY_SOLUTION)).all()
    # The last 81 digits win; prose, markers and non-ASCII digits are ignored.
    noisy = f"Thinking: 1 2 3 ٣. The grid is<turn|>\n{spaced.replace(' 9', chr(10) + '9')}<turn|>"
    got = sudoku_text.extract_solution(noisy)
    assert got.dtype == np.int8 and got.shape == (81,)
    assert sudoku.to_string(got) == EASY_SOLUTION
    assert sudoku_text.extract_solution(spaced[2:]) is None  # 80 digits


def test_decode_batch_cuts_at_stop_tokens(tok):
    solution_ids = tok.encode(" ".join(EASY_SOLUTION), add_bos=False)
    junk = tok.encode(" 9 9 9", add_bos=False)
    rows = [
        solution_ids + [EOS] + junk,  # digits after EOS are not part of the answer
        solution_ids + [TURN_END] + junk,
        solution_ids[:-4] + [EOS] * 4 + junk,  # 79 digits before the stop
        junk + solution_ids + [PAD] * 4,
    ]
    width = max(len(r) for r in rows)
    tokens = np.array([r + [PAD] * (width - len(r)) for r in rows])
    got = sudoku_text.decode_batch(tok, tokens)
    expected = sudoku.from_string(EASY_SOLUTION)
    assert (got[0] == expected).all() and (got[1] == expected).all()
    assert (got[2] == 0).all()
    assert (got[3] == expected).all()


# --- Training pipeline -----------------------------------------------------------


def _take(it, n: int) -> list[dict[str, np.ndarray]]:
    return [next(it) for _ in range(n)]


def test_train_dataset_matches_digit_pipeline_and_resumes(tok, dataset):
    kwargs = dict(batch_size=5, seed=11, augment=True)
    ds = sudoku_text.make_train_dataset(tok, dataset, prompt_len=400, canvas_len=160, **kwargs)
    it = iter(ds)
    first = _take(it, 2)
    batch = first[0]
    assert set(batch) == {"prompt", "canvas", "canvas_mask", "num_clues", "needs_search"}
    assert batch["prompt"].shape == (5, 400) and batch["canvas"].shape == (5, 160)
    assert batch["canvas_mask"].all() and (batch["prompt"][:, 0] == BOS).all()

    # Same records, order and symmetries as the digit-vocabulary pipeline.
    digit_it = iter(
        sudoku_task.make_train_dataset(dataset, prompt_len=82, canvas_len=81, **kwargs)
    )
    for text_batch, digit_batch in zip(first, _take(digit_it, 2)):
        digits = sudoku_task.decode_batch(digit_batch["canvas"])
        assert (sudoku_text.decode_batch(tok, text_batch["canvas"]) == digits).all()
        assert all(sudoku.is_valid_solution(s) for s in digits)
        puzzles = sudoku_task.id_to_digit(digit_batch["prompt"][:, 1:82])
        again = sudoku_text.encode_batch(tok, puzzles, digits, prompt_len=400, canvas_len=160)
        assert (again["prompt"] == text_batch["prompt"]).all()
        assert (text_batch["num_clues"] == digit_batch["num_clues"]).all()

    state = it.get_state()
    expected = _take(it, 4)  # crosses an epoch boundary (12 records)
    resumed = iter(ds)
    resumed.set_state(state)
    for a, b in zip(expected, _take(resumed, 4)):
        assert a.keys() == b.keys()
        for key in a:
            np.testing.assert_array_equal(a[key], b[key])


def test_train_dataset_fails_fast_on_short_lengths(tok, dataset):
    with pytest.raises(ValueError, match="does not fit prompt_len=100"):
        sudoku_text.make_train_dataset(tok, dataset, 4, prompt_len=100, canvas_len=160, seed=0)
    with pytest.raises(ValueError, match="does not fit canvas_len=81"):
        sudoku_text.make_train_dataset(tok, dataset, 4, prompt_len=400, canvas_len=81, seed=0)
