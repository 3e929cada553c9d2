"""A byte-level BPE tokenizer learned from the training data (scripts/make_tokenizer.py): fewer tokens per text
than the byte vocabulary, so a canvas holds more text, at a vocabulary still small enough for a model trained
from scratch on a CPU.

Byte-level: every UTF-8 byte is in the base alphabet, so any text encodes (no unknown token) and decoding gives
the text back exactly. Ids 0..4 are the byte vocabulary's specials (PAD, EOS, BOS and Gemma 3's turn markers,
matched whole in the text), so the Gemma 3 chat template and the stop ids are those of `byte_tokenizer`.
Merges are learned by `tokenizers`' BPE trainer; the result is an ordinary tokenizer.json that `load_tokenizer`
reads and that an exported model carries.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterable, Sequence

from dgemma.tasks.text import byte_tokenizer

SPECIAL_TOKENS = tuple(sorted(byte_tokenizer.SPECIAL, key=byte_tokenizer.SPECIAL.get))  # ids 0..4
BASE_SIZE = len(SPECIAL_TOKENS) + 256  # specials and the byte alphabet: the smallest vocabulary


def train(texts: Iterable[str], vocab_size: int) -> "tokenizers.Tokenizer":
  """A byte-level BPE of at most `vocab_size` ids learned from `texts` (fewer if the texts run out of pairs to
  merge). The trainer is deterministic: the same texts give the same file."""
  import tokenizers
  from tokenizers import decoders, models, pre_tokenizers, trainers

  if vocab_size <= BASE_SIZE:
    raise ValueError(f"vocab_size {vocab_size} leaves no room for merges: the specials and the 256 bytes take "
                     f"{BASE_SIZE}")
  tokenizer = tokenizers.Tokenizer(models.BPE())
  # GPT-2's pre-split (words, numbers, punctuation, whitespace runs) keeps merges inside such pieces; the
  # indentation of code is a whitespace run, so it becomes few tokens.
  tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
  tokenizer.decoder = decoders.ByteLevel()
  trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=list(SPECIAL_TOKENS),
                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
  tokenizer.train_from_iterator(texts, trainer)
  return tokenizer


@dataclasses.dataclass(frozen=True)
class Learned:
  """What `learn` wrote: its ids, bytes per token on the texts it learned from, and the file's sha256."""
  vocab_size: int
  num_texts: int
  bytes_per_token: float
  sha256: str


def learn(texts: Sequence[str], vocab_size: int, path: str) -> Learned:
  """`train` on texts, saved as the tokenizer.json `path` (scripts/make_tokenizer.py, make_text_data.py)."""
  if not any(texts):
    raise ValueError("no text to learn a tokenizer from")
  tokenizer = train(texts, vocab_size)
  tokenizer.save(path)
  num_bytes = sum(len(t.encode("utf-8")) for t in texts)
  num_tokens = sum(len(e.ids) for e in tokenizer.encode_batch(list(texts), add_special_tokens=False))
  with open(path, "rb") as f:
    digest = hashlib.sha256(f.read()).hexdigest()
  return Learned(tokenizer.get_vocab_size(with_added_tokens=True), len(texts), num_bytes / num_tokens, digest)
