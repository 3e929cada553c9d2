"""A small tokenizer wrapper for checkpoints with a real text vocabulary.

:func:`load_tokenizer` reads the tokenizer shipped with a checkpoint, either
an HF ``tokenizer.json`` (through the ``tokenizers`` package), a
SentencePiece ``.model`` file (through ``sentencepiece``, imported only when
such a file is loaded), or the vocabulary inside a Gemma ``.gguf`` file
(:func:`gguf_tokenizer` rebuilds it as a ``tokenizers`` BPE, the way
transformers does). All are wrapped in :class:`Tokenizer`, which exposes
just what the data pipeline needs, with the same semantics for all formats:

* ``encode`` never adds special tokens on its own; BOS is prepended only when
  asked, because the recipe decides where BOS goes (spec §4.2, §8). Special
  tokens written in the text (``<|turn>``, ``<turn|>``) are matched as single
  tokens when the tokenizer defines them as added/user-defined tokens, as
  Gemma's tokenizers do.
* ``decode`` keeps every id by default; ``skip_special=True`` drops exactly
  the PAD, EOS and BOS ids (turn markers stay, they are part of the text).
  SentencePiece itself renders its control pieces (PAD, EOS, BOS) as empty
  text, so for a ``.model`` file the two agree; an HF tokenizer writes them.
* Special ids come from the tokenizer's ``<pad>``, ``<eos>`` and ``<bos>``
  tokens, falling back to Gemma's fixed ids PAD 0, EOS 1, BOS 2.
"""

from __future__ import annotations

import glob
import os
from collections.abc import Callable, Iterable, Sequence

import numpy as np

__all__ = ["Tokenizer", "load_tokenizer", "gguf_tokenizer", "TOKENIZER_FILE_NAMES"]

# Files looked for in a checkpoint directory, in order of preference. The
# glob catches the official SentencePiece name, tokenizer_gemma4.model.
TOKENIZER_FILE_NAMES: tuple[str, ...] = ("tokenizer.json", "tokenizer.model", "tokenizer*.model")

# Gemma's fixed special ids (spec §8), used when the vocabulary lacks the token.
_DEFAULT_PAD_ID = 0
_DEFAULT_EOS_ID = 1
_DEFAULT_BOS_ID = 2


class Tokenizer:
    """Encodes text to ids and back; build it with :func:`load_tokenizer`.

    Attributes:
      path: the file the tokenizer was read from.
      vocab_size: number of ids, added/special tokens included.
      pad_id, eos_id, bos_id: special ids (see the module docstring).
    """

    def __init__(
        self,
        path: str,
        vocab_size: int,
        encode_many: Callable[[list[str]], list[list[int]]],
        decode_ids: Callable[[list[int]], str],
        lookup: Callable[[str], int | None],
    ):
        """Wraps backend callables; use :func:`load_tokenizer` instead of calling this."""
        self.path = path
        self.vocab_size = vocab_size
        self._encode_many = encode_many
        self._decode_ids = decode_ids
        self._lookup = lookup
        self.pad_id = self._special_id("<pad>", _DEFAULT_PAD_ID)
        self.eos_id = self._special_id("<eos>", _DEFAULT_EOS_ID)
        self.bos_id = self._special_id("<bos>", _DEFAULT_BOS_ID)

    def _special_id(self, token: str, default: int) -> int:
        found = self._lookup(token)
        return default if found is None else found

    def __repr__(self) -> str:
        return (
            f"Tokenizer({self.path!r}, vocab_size={self.vocab_size}, pad_id={self.pad_id}, "
            f"eos_id={self.eos_id}, bos_id={self.bos_id})"
        )

    def encode(self, text: str, add_bos: bool) -> list[int]:
        """Token ids of ``text``, with BOS first iff ``add_bos``; no other special ids added."""
        return self.encode_batch([text], add_bos)[0]

    def encode_batch(self, texts: Sequence[str], add_bos: bool) -> list[list[int]]:
        """:meth:`encode` over many texts at once (the backends batch this natively)."""
        encoded = self._encode_many(list(texts))
        if add_bos:
            return [[self.bos_id, *ids] for ids in encoded]
        return encoded

    def decode(self, ids: Iterable[int] | np.ndarray, skip_special: bool = False) -> str:
        """Text of ``ids``; with ``skip_special`` the PAD, EOS and BOS ids are dropped first."""
        # Backends want Python ints, not numpy scalars.
        ids = [int(i) for i in np.asarray(ids).reshape(-1)]
        if skip_special:
            special = {self.pad_id, self.eos_id, self.bos_id}
            ids = [i for i in ids if i not in special]
        return self._decode_ids(ids)

    def id_of(self, token: str) -> int:
        """The id of the vocabulary entry ``token`` (e.g. ``"<|turn>"``); ValueError if absent."""
        found = self._lookup(token)
        if found is None:
            raise ValueError(f"token {token!r} is not in the vocabulary of {self.path}")
        return found

    def has_token(self, token: str) -> bool:
        """Whether ``token`` is a vocabulary entry."""
        return self._lookup(token) is not None


def _from_tokenizer_json(path: str) -> Tokenizer:
    import tokenizers  # a hard dependency, imported lazily to keep module import cheap

    try:
        tok = tokenizers.Tokenizer.from_file(path)
    except Exception as e:  # the Rust side raises a bare Exception on malformed files
        raise ValueError(f"{path}: not a valid HF tokenizer.json ({e})") from None
    return _from_tokenizers(tok, path)


def _from_tokenizers(tok, path: str) -> Tokenizer:
    """Wraps a ``tokenizers.Tokenizer``."""

    def encode_many(texts: list[str]) -> list[list[int]]:
        # add_special_tokens=False disables the post-processor (which would add
        # BOS/EOS by its own rules); added tokens in the text are still matched.
        return [e.ids for e in tok.encode_batch(texts, add_special_tokens=False)]

    return Tokenizer(
        path=path,
        vocab_size=tok.get_vocab_size(with_added_tokens=True),
        encode_many=encode_many,
        decode_ids=lambda ids: tok.decode(ids, skip_special_tokens=False),
        lookup=tok.token_to_id,
    )


def _from_sentencepiece(path: str) -> Tokenizer:
    try:
        import sentencepiece
    except ImportError:
        raise ImportError(
            f"{path} is a SentencePiece model, which needs the sentencepiece package: "
            "pip install sentencepiece"
        ) from None
    sp = sentencepiece.SentencePieceProcessor()
    try:
        sp.Load(path)
    except (OSError, RuntimeError) as e:
        raise ValueError(f"{path}: not a valid SentencePiece model ({e})") from None

    def lookup(piece: str) -> int | None:
        # piece_to_id maps unknown pieces to the UNK id, so check the round trip.
        i = sp.piece_to_id(piece)
        return i if sp.id_to_piece(i) == piece else None

    return Tokenizer(
        path=path,
        vocab_size=sp.get_piece_size(),
        encode_many=lambda texts: sp.encode(texts, out_type=int),
        decode_ids=sp.decode,
        lookup=lookup,
    )


# llama.cpp token types (gguf.TokenType): NORMAL 1, UNKNOWN 2, CONTROL 3, USER_DEFINED 4, UNUSED 5, BYTE 6.
_GGUF_CONTROL = 3
_GGUF_USER_DEFINED = 4


def _bpe_merges(pieces: list[str], vocab: dict[str, int]) -> list[tuple[str, str]]:
    """Merges implied by a SentencePiece-BPE vocabulary: every split of a piece into two pieces.

    Ranked by the piece's position in the vocabulary (Gemma's scores do not follow its merge order, the
    order of the pieces does), then by longer left part first. This is transformers' ``generate_merges``
    as its GGUF Gemma tokenizer calls it, so both build the same tokenizer.
    """
    merges = []
    for piece in pieces:
        for k in range(len(piece) - 1, 0, -1):
            left, right = piece[:k], piece[k:]
            if left in vocab and right in vocab:
                merges.append((left, right))
    return merges


def gguf_tokenizer(path: str | os.PathLike[str]) -> "tokenizers.Tokenizer":
    """The ``tokenizers.Tokenizer`` of a Gemma GGUF file (its SentencePiece-BPE vocabulary, rebuilt).

    As transformers' ``GemmaTokenizer`` from a GGUF: BPE with byte fallback over the file's pieces
    (all-space pieces respelled with "▁", as the normalizer writes spaces), merges from
    :func:`_bpe_merges`, control tokens as special tokens and user-defined ones (newline runs, ...) as
    added tokens, both matched whole in the text. ``.save(dir + "/tokenizer.json")`` writes it for checkpoints.
    """
    import tokenizers
    from tokenizers import AddedToken, decoders, normalizers, pre_tokenizers, processors

    from dgemma.checkpoints.gguf import read_gguf  # the header parser needs no gguf package

    file = read_gguf(path)
    md = file.metadata
    kind = md.get("tokenizer.ggml.model")
    if kind != "llama" or not file.architecture.startswith("gemma"):
        raise ValueError(
            f"{file.path}: unsupported GGUF tokenizer {kind!r} for architecture {file.architecture!r}; "
            "only Gemma's SentencePiece vocabulary ('llama') is supported"
        )
    tokens = list(md["tokenizer.ggml.tokens"])
    types = md.get("tokenizer.ggml.token_type")
    types = np.full(len(tokens), 1) if types is None else np.asarray(types)
    pieces = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
    vocab = {piece: i for i, piece in enumerate(pieces)}
    unk = tokens[int(md.get("tokenizer.ggml.unknown_token_id", 3))]
    tok = tokenizers.Tokenizer(
        tokenizers.models.BPE(
            vocab=vocab, merges=_bpe_merges(pieces, vocab), unk_token=unk, fuse_unk=True,
            byte_fallback=True,
        )
    )
    tok.normalizer = normalizers.Replace(" ", "▁")
    tok.pre_tokenizer = pre_tokenizers.Split(" ", behavior="merged_with_previous")
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    )
    bos_id = int(md.get("tokenizer.ggml.bos_token_id", _DEFAULT_BOS_ID))
    if md.get("tokenizer.ggml.add_bos_token", True):  # only for users of tokenizer.json: we add BOS ourselves
        bos = tokens[bos_id]
        tok.post_processor = processors.TemplateProcessing(
            single=f"{bos}:0 $A:0", pair=f"{bos}:0 $A:0 {bos}:1 $B:1", special_tokens=[(bos, bos_id)]
        )
    tok.add_special_tokens(
        [AddedToken(t, normalized=False, special=True)
         for t, token_type in zip(tokens, types) if token_type == _GGUF_CONTROL]
    )
    tok.add_tokens(
        [AddedToken(t, normalized=False, special=False)
         for t, token_type in zip(tokens, types) if token_type == _GGUF_USER_DEFINED and t in vocab]
    )
    return tok


def _from_gguf(path: str) -> Tokenizer:
    return _from_tokenizers(gguf_tokenizer(path), path)


def _find_in_directory(directory: str) -> str:
    for pattern in TOKENIZER_FILE_NAMES:
        matches = sorted(glob.glob(os.path.join(glob.escape(directory), pattern)))
        if len(matches) > 1:
            names = ", ".join(os.path.basename(m) for m in matches)
            raise ValueError(f"{directory}: several tokenizer files ({names}); pass one of them")
        if matches:
            return matches[0]
    raise FileNotFoundError(
        f"{directory}: no tokenizer file found (looked for {', '.join(TOKENIZER_FILE_NAMES)})"
    )


def load_tokenizer(path: str | os.PathLike[str]) -> Tokenizer:
    """Loads a tokenizer from a checkpoint directory or a tokenizer file.

    A directory is searched for the names in :data:`TOKENIZER_FILE_NAMES`, in
    that order. A file is read by its extension: ``.json`` as an HF
    ``tokenizer.json``, ``.model`` as SentencePiece, ``.gguf`` as the
    vocabulary of a Gemma GGUF checkpoint (:func:`gguf_tokenizer`).
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        path = _find_in_directory(path)
    elif not os.path.exists(path):
        raise FileNotFoundError(f"{path}: no such tokenizer file or checkpoint directory")
    if path.endswith(".json"):
        return _from_tokenizer_json(path)
    if path.endswith(".model"):
        return _from_sentencepiece(path)
    if path.endswith(".gguf"):
        return _from_gguf(path)
    raise ValueError(
        f"{path}: unknown tokenizer format; expected an HF tokenizer.json, a SentencePiece .model "
        "or a .gguf checkpoint"
    )
