"""A byte-level tokenizer for small text models trained from scratch: any UTF-8 text, a 272-id vocabulary.

Ids: PAD 0, EOS 1, BOS 2, `<start_of_turn>` 3, `<end_of_turn>` 4 (Gemma 3's turn markers, so the Gemma 3 chat
template works unchanged), 5..15 unused, byte b -> 16 + b. 272 = 16 * 17 keeps the vocabulary a multiple of 16
(the CPU token-statistics kernel wants one). The vocabulary is fixed, not derived from the data, so a config
knows the model's vocab_size before any data is read and a checkpoint needs no tokenizer file: its metadata
says "bytes".
"""

from __future__ import annotations

from dgemma.data.tokenizer import Tokenizer

NAME = "bytes"  # how configs and checkpoint metadata name it
BYTE_OFFSET = 16
VOCAB_SIZE = BYTE_OFFSET + 256
SPECIAL = {"<pad>": 0, "<eos>": 1, "<bos>": 2, "<start_of_turn>": 3, "<end_of_turn>": 4}
_NAMES = {i: name for name, i in SPECIAL.items()}


def _encode_many(texts: list[str]) -> list[list[int]]:
  # Marker strings in the text stay bytes: only chat templates insert marker ids (dgemma/tasks/text/chat.py).
  return [[BYTE_OFFSET + b for b in text.encode("utf-8")] for text in texts]


def _decode(ids: list[int]) -> str:
  """Bytes decoded as UTF-8 (an invalid sequence, e.g. a cut character, becomes U+FFFD); special ids by name."""
  out, run = [], bytearray()
  for i in ids:
    if BYTE_OFFSET <= i < VOCAB_SIZE:
      run.append(i - BYTE_OFFSET)
      continue
    out.append(run.decode("utf-8", errors="replace"))
    run = bytearray()
    out.append(_NAMES.get(i, f"<unused{i}>"))
  out.append(run.decode("utf-8", errors="replace"))
  return "".join(out)


def byte_tokenizer() -> Tokenizer:
  return Tokenizer(path=NAME, vocab_size=VOCAB_SIZE, encode_many=_encode_many, decode_ids=_decode,
                   lookup=SPECIAL.get)
