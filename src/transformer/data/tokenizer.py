"""SentencePiece tokenization, and the ids with a role (`SpecialIds`).

The model is trained on raw (untokenized, cased) sentences and decodes back to raw text, so
translations can be scored with sacrebleu directly. A tokenizer the package trains uses
SentencePiece's own ids, with 0-3 reserved: pad 0, unk 1, `<s>` 2 (the decoder's first
input), `</s>` 3. An imported one (a Marian/OPUS-MT model, `hf.py`) maps SentencePiece's
pieces through the model's id table instead (its `vocab.json`), with the special ids that
table gives them (OPUS-MT: `</s>` 0, `<unk>` 1, `<pad>` last, and `<pad>` also starts the
decoder). Everything downstream takes the ids from the tokenizer or the model config, never
from the constants below.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import re
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Union

import sentencepiece as spm

from ..errors import DataError
from ..files import atomic_write

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2  # "<s>"
EOS_ID = 3  # "</s>"


@dataclass(frozen=True)
class SpecialIds:
    """The ids with a role. `start` is the decoder's first input (`<s>` in the package's
    own vocabularies, `<pad>` in Marian's); the search never generates `pad` or `start`."""

    pad: int = PAD_ID
    unk: int = UNK_ID
    start: int = BOS_ID
    eos: int = EOS_ID

    @property
    def all(self) -> tuple[int, ...]:
        """The four ids (fewer when roles share one)."""
        return tuple(sorted({self.pad, self.unk, self.start, self.eos}))

    @property
    def never_generated(self) -> tuple[int, ...]:
        """Ids whose logits the search masks."""
        return tuple(sorted({self.pad, self.start}))

    @property
    def not_text(self) -> frozenset[int]:
        """Ids that decoding drops wherever they appear."""
        return frozenset((self.pad, self.start, self.eos))


TAG = re.compile(r"<[^\s<>]+>")  # a tag's form: one reserved piece, e.g. <bt>, <2de>

SPM_MODEL_TYPES = ("unigram", "bpe")  # the SentencePiece algorithms `Tokenizer.train` offers

# SentencePiece's unigram trainer sums floats across threads, so its result depends on the
# thread count. A fixed count (not the machine's core count) keeps training deterministic.
TRAIN_THREADS = 4

PathLike = Union[str, "os.PathLike[str]"]


def _encode_threads() -> int:
    """Threads for batched encoding (the result does not depend on this)."""
    return max(1, min(os.cpu_count() or 1, 16))


def _processor(data: bytes) -> spm.SentencePieceProcessor:
    """SentencePiece's processor of a serialized model proto; DataError when the bytes are
    not one (SentencePiece's own error holds several lines of C++ context)."""
    try:
        return spm.SentencePieceProcessor(model_proto=data)
    except RuntimeError as e:
        reason = str(e).strip().splitlines()[0] if str(e).strip() else repr(e)
        raise DataError(f"unreadable SentencePiece model proto ({reason})") from None


class Tokenizer:
    """A SentencePiece model, with the package's special ids (pad 0, unk 1, bos 2, eos 3),
    or with an id table (`pieces`, id -> piece) and the `specials` that table gives."""

    def __init__(self, processor: spm.SentencePieceProcessor,
                 pieces: Sequence[str] | None = None,
                 specials: SpecialIds | None = None) -> None:
        self._sp = processor
        if pieces is not None:
            self._init_table(list(pieces), specials)
            return
        self._pieces: list[str] | None = None
        self.specials = SpecialIds()
        expected = {"pad": PAD_ID, "unk": UNK_ID, "bos": BOS_ID, "eos": EOS_ID}
        actual = {
            "pad": processor.pad_id(),
            "unk": processor.unk_id(),
            "bos": processor.bos_id(),
            "eos": processor.eos_id(),
        }
        if actual != expected:
            raise DataError(
                f"SentencePiece model has special ids {actual}, expected {expected} "
                "(train it with Tokenizer.train)"
            )

    def _init_table(self, pieces: list[str], specials: SpecialIds | None) -> None:
        """Ids from the table; a piece missing from it is `<unk>` (as MarianTokenizer)."""
        if specials is None:
            raise ValueError("a tokenizer with an id table needs its special ids")
        for role, i in asdict(specials).items():
            if not 0 <= i < len(pieces):
                raise ValueError(f"special id {role}={i} is outside the id table "
                                 f"({len(pieces)} pieces)")
        self._pieces, self.specials = pieces, specials
        self._ids = {piece: i for i, piece in enumerate(pieces)}
        if len(self._ids) != len(pieces):
            raise ValueError("the id table holds a piece twice")

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
        tags: Sequence[str] = (),
    ) -> Tokenizer:
        """Train on an iterable of sentences; save to `model_path` (atomically) if given.

        Deterministic: the same sentences and arguments give the same model bytes.
        `byte_fallback` encodes characters unseen in training as UTF-8 bytes instead of
        `<unk>`, so any input decodes back to itself. `normalization="nmt_nfkc"` applies
        NFKC and collapses whitespace (decoded text is the normalized input). `tags` (e.g.
        `<bt>`, `<2de>`) become reserved pieces: each always one id, never split, and
        dropped when decoding.
        """
        if model_type not in SPM_MODEL_TYPES:
            raise ValueError(f"model_type must be one of {SPM_MODEL_TYPES}, got {model_type!r}")
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
            **({"user_defined_symbols": list(tags)} if tags else {}),
        )
        tokenizer = cls.from_bytes(buffer.getvalue())
        if model_path is not None:
            tokenizer.save(model_path)
        return tokenizer

    @classmethod
    def load(cls, path: PathLike, id_table: dict[str, Any] | None = None) -> Tokenizer:
        """Load a `.model` file, with the id table `id_table()` gave if it had one."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"SentencePiece model not found: {path}")
        try:
            if id_table is None:
                return cls.from_bytes(path.read_bytes())
            return cls.from_state({"spm": path.read_bytes(), **id_table})
        except (ValueError, TypeError) as e:  # DataError, or an id table of the wrong shape
            raise DataError(f"{path}: not a usable SentencePiece model: {e}") from None

    @classmethod
    def from_bytes(cls, data: bytes) -> Tokenizer:
        """Load from a serialized model proto (as stored in checkpoints); DataError when the
        bytes are not one."""
        return cls(_processor(data))

    def to_bytes(self) -> bytes:
        """The serialized SentencePiece model proto (without an id table)."""
        return self._sp.serialized_model_proto()

    def to_state(self) -> bytes | dict[str, Any]:
        """Plain values for a checkpoint: the proto's bytes, or with an id table
        {"spm": bytes, "pieces": [...], "specials": {...}}. `from_state` restores it."""
        table = self.id_table()
        return self.to_bytes() if table is None else {"spm": self.to_bytes(), **table}

    @classmethod
    def from_state(cls, state: bytes | dict[str, Any]) -> Tokenizer:
        """The tokenizer of `to_state()`."""
        if isinstance(state, bytes):
            return cls.from_bytes(state)
        if not isinstance(state, dict) or not {"spm", "pieces", "specials"} <= state.keys():
            raise ValueError("expected SentencePiece bytes or {spm, pieces, specials}")
        return cls(_processor(state["spm"]), state["pieces"], SpecialIds(**state["specials"]))

    def id_table(self) -> dict[str, Any] | None:
        """{"pieces": [...], "specials": {...}} when ids come from an id table (an imported
        model), as JSON-ready values; None when they are SentencePiece's own."""
        if self._pieces is None:
            return None
        return {"pieces": list(self._pieces), "specials": asdict(self.specials)}

    def vocabulary(self) -> list[str]:
        """Every piece, in id order (the vocabulary of an export)."""
        return [self.id_to_piece(i) for i in range(self.vocab_size)]

    def save(self, path: PathLike) -> None:
        """Write the model file atomically (a crash never leaves a truncated `.model`)."""
        with atomic_write(path) as f:
            f.write(self.to_bytes())

    # ---- properties ---------------------------------------------------------------------

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size() if self._pieces is None else len(self._pieces)

    @functools.cached_property
    def fingerprint(self) -> str:
        """SHA-256 of the model bytes and any id table (keys encoded-corpus caches)."""
        digest = hashlib.sha256(self.to_bytes())
        if self._pieces is not None:
            digest.update(json.dumps([self._pieces, asdict(self.specials)]).encode())
        return digest.hexdigest()

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Tokenizer) and self.fingerprint == other.fingerprint

    def __hash__(self) -> int:
        return hash(self.fingerprint)

    def __repr__(self) -> str:
        return f"Tokenizer(vocab_size={self.vocab_size})"

    # ---- encoding / decoding ------------------------------------------------------------

    def encode(self, text: str) -> list[int]:
        """Token ids of one sentence, without BOS/EOS."""
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of many sentences (multithreaded), without BOS/EOS."""
        if self._pieces is None:
            return self._sp.encode(list(texts), out_type=int, num_threads=_encode_threads())
        split = [self._split_language_code(text) for text in texts]
        pieces = self._sp.encode([rest for _, rest in split], out_type=str,
                                 num_threads=_encode_threads())
        unk, ids = self.specials.unk, self._ids
        return [[ids.get(p, unk) for p in code + sentence]
                for (code, _), sentence in zip(split, pieces, strict=True)]

    @staticmethod
    def _split_language_code(text: str) -> tuple[list[str], str]:
        """(['>>deu<<'], rest) when `text` starts with a target-language token (Marian's
        multilingual models read one), else ([], text): one token, the table's or `<unk>`,
        exactly as MarianTokenizer reads it."""
        end = text.find("<<") if text.startswith(">>") else -1
        return ([text[:end + 2]], text[end + 2:]) if end != -1 else ([], text)

    @functools.cached_property
    def tags(self) -> dict[str, int]:
        """The reserved tag pieces (`train(tags=...)`) -> their ids."""
        if self._pieces is not None:
            return {}
        sp = self._sp  # reserved pieces: a tag's form, score 0, neither byte nor control
        return {sp.id_to_piece(i): i for i in range(sp.get_piece_size())
                if TAG.fullmatch(sp.id_to_piece(i)) and sp.GetScore(i) == 0
                and not (sp.IsByte(i) or sp.IsControl(i) or sp.IsUnknown(i))}

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`; pad, the decoder's start, eos and tags are skipped wherever they
        appear (a tag never reaches a translation)."""
        skipped = self.specials.not_text | frozenset(self.tags.values())
        kept = [i for i in map(int, ids) if i not in skipped]
        if self._pieces is None:
            return self._sp.decode(kept)
        return self._sp.decode_pieces([self._pieces[i] for i in kept])

    def id_to_piece(self, i: int) -> str:
        """The piece string of one id (e.g. '▁Ein'), for labelling plots."""
        return self._sp.id_to_piece(int(i)) if self._pieces is None else self._pieces[int(i)]

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
