"""SentencePiece tokenization with special ids fixed for the whole package.

The model is trained on raw (untokenized, cased) sentences and decodes back to raw text, so
translations can be scored with sacrebleu directly. Ids 0-3 are reserved and shared with the
model: padding is 0 everywhere.
"""

from __future__ import annotations

import hashlib
import io
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import sentencepiece as spm

from .files import atomic_write

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2  # "<s>"
EOS_ID = 3  # "</s>"
SPECIAL_IDS = (PAD_ID, UNK_ID, BOS_ID, EOS_ID)

MODEL_TYPES = ("unigram", "bpe")

# SentencePiece's unigram trainer sums floats across threads, so its result depends on the
# thread count. A fixed count (not the machine's core count) keeps training deterministic.
TRAIN_THREADS = 4

PathLike = Union[str, "os.PathLike[str]"]


def _encode_threads() -> int:
    """Threads for batched encoding (the result does not depend on this)."""
    return max(1, min(os.cpu_count() or 1, 16))


class Tokenizer:
    """A SentencePiece model with the package's special ids (pad 0, unk 1, bos 2, eos 3)."""

    def __init__(self, processor: spm.SentencePieceProcessor) -> None:
        self._sp = processor
        expected = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
        actual = {
            "pad": processor.pad_id(),
            "unk": processor.unk_id(),
            "bos": processor.bos_id(),
            "eos": processor.eos_id(),
        }
        if actual != expected:
            raise ValueError(
                f"SentencePiece model has special ids {actual}, expected {expected} "
                "(train it with Tokenizer.train)"
            )

    # ---- construction -------------------------------------------------------------------

    @classmethod
    def train(
        cls,
        texts: Iterable[str],
        model_path: PathLike | None = None,
        *,
        vocab_size: int = 8000,
        model_type: str = "unigram",
        character_coverage: float = 1.0,
        byte_fallback: bool = True,
        normalization: str = "nmt_nfkc",
        num_threads: int = TRAIN_THREADS,
    ) -> Tokenizer:
        """Train on an iterable of sentences; save to `model_path` (atomically) if given.

        Deterministic: the same sentences and arguments give the same model bytes.
        `byte_fallback` encodes characters unseen in training as UTF-8 bytes instead of
        `<unk>`, so any input decodes back to itself. `normalization="nmt_nfkc"` applies
        NFKC and collapses whitespace (decoded text is the normalized input).
        """
        if model_type not in MODEL_TYPES:
            raise ValueError(f"model_type must be one of {MODEL_TYPES}, got {model_type!r}")
        buffer = io.BytesIO()
        spm.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=buffer,
            vocab_size=vocab_size,
            model_type=model_type,
            character_coverage=character_coverage,
            byte_fallback=byte_fallback,
            normalization_rule_name=normalization,
            pad_id=PAD_ID,
            unk_id=UNK_ID,
            bos_id=BOS_ID,
            eos_id=EOS_ID,
            pad_piece="<pad>",
            unk_piece="<unk>",
            bos_piece="<s>",
            eos_piece="</s>",
            num_threads=num_threads,
            minloglevel=2,  # errors only; training logs are long
        )
        tokenizer = cls.from_bytes(buffer.getvalue())
        if model_path is not None:
            tokenizer.save(model_path)
        return tokenizer

    @classmethod
    def load(cls, path: PathLike) -> Tokenizer:
        """Load a `.model` file."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model not found: {path}")
        return cls.from_bytes(path.read_bytes())

    @classmethod
    def from_bytes(cls, data: bytes) -> Tokenizer:
        """Load from a serialized model proto (as stored in checkpoints)."""
        return cls(spm.SentencePieceProcessor(model_proto=data))

    def to_bytes(self) -> bytes:
        """The serialized model proto; `Tokenizer.from_bytes` restores it."""
        return self._sp.serialized_model_proto()

    def save(self, path: PathLike) -> None:
        """Write the model file atomically (a crash never leaves a truncated `.model`)."""
        with atomic_write(path) as f:
            f.write(self.to_bytes())

    # ---- properties ---------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def fingerprint(self) -> str:
        """SHA-256 of the model bytes (used to key encoded-corpus caches)."""
        return hashlib.sha256(self.to_bytes()).hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.to_bytes() == other.to_bytes()

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"

    # ---- encoding / decoding ------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of one sentence, without BOS/EOS."""
        return self._sp.encode(text, out_type=int)

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of many sentences (multithreaded), without BOS/EOS."""
        return self._sp.encode(list(texts), out_type=int, num_threads=_encode_threads())

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; pad, bos and eos are skipped wherever they appear."""
        kept = [i for i in map(int, ids) if i not in (PAD_ID, BOS_ID, EOS_ID)]
        return self._sp.decode(kept)

    def id_to_piece(self, i: int) -> str:
        """The piece string of one id (e.g. '▁Ein'), for labelling plots."""
        return self._sp.id_to_piece(int(i))

    def pieces(self, text: str) -> list[str]:
        """The piece strings of a sentence, for labelling plots."""
        return self._sp.encode(text, out_type=str)


@dataclass(frozen=True)
class TokenizerPair:
    """Source and target tokenizers; the same object when the vocabulary is joint."""

    src: Tokenizer
    tgt: Tokenizer

    @property
    def shared(self) -> bool:
        """True for a joint vocabulary (one model for both sides)."""
        return self.src is self.tgt or self.src == self.tgt
