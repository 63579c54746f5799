"""Translator: load a checkpoint (or average several) once, translate lists of sentences.

    translator = Translator.load("runs/x")          # -> runs/x/checkpoints/checkpoint_best.pt
    translator.translate(["A man rides a bike."], beam_size=5)        # -> ["Ein Mann ..."]
    translator.translations(lines, nbest=3)   # -> per line 3 Translations (text, score, ...)
    translator.translations(lines, translator.request(nbest=3, alpha=2.0))   # the same object

`BaseTranslator` is the interface every engine offers (ours here, CTranslate2's in
`engines.py`), and all that `transformer translate`, the server and the export rely on. Every
call decodes as one `decoding.DecodingRequest` says, built and checked once (`request`).
"""

from __future__ import annotations

import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Union

import torch

from .alignment import attention_weights, word_alignment
from .batching import sorted_batches
from .checkpoint import (
    average_weights,
    check_tokenizers,
    load_checkpoint,
    model_from_checkpoint,
    resolve_checkpoint,
    stored_decoding,
    stored_training_config,
    tokenizers_from_state,
)
from .config import DecodingSettings, TrainConfig
from .decoding import DecodingRequest
from .errors import DataError
from .loss import sentence_log_probs
from .model import ModelConfig, Transformer
from .runtime import resolve_device
from .search import DEFAULT_MAX_TOKENS, Hypothesis, length_penalty, search_corpus
from .store import ParallelCorpus
from .tokenizer import TokenizerPair

__all__ = ["Translation", "BaseTranslator", "Translator"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]


@dataclass(frozen=True)
class Translation:
    """One translation of a line, as `BaseTranslator.translations` returns it."""

    text: str
    score: float  # log_prob / length_penalty(pieces + 1, alpha): how the search ranks
    log_prob: float  # the model's log-probability of the output, EOS included
    alignment: list[tuple[int, int]] | None = None  # (source word, output word), if asked


class BaseTranslator(ABC):
    """What every engine's translator offers: tokenizers, decoding defaults, the source
    encoding (pieces + EOS, over-long lines truncated), `translate`'s batching and return
    conventions, and what the tools around it read (`model_config`, `max_source_tokens`,
    `languages`, `vocab_map`). An engine supplies `model_config` and `_search`
    (`Translator`: our PyTorch model; `engines.CTranslate2Translator`: an exported model).

    `decoding` holds the defaults every `translate` call starts from; `training_config` is
    the training configuration the checkpoint recorded (its language pair and data), parsed
    when the engine is loaded, or None.
    """

    engine: ClassVar[str]  # "torch" or "ctranslate2"

    def __init__(self, tokenizers: TokenizerPair, *,
                 decoding: DecodingSettings = DecodingSettings(),
                 training_config: TrainConfig | None = None):
        self.tokenizers = tokenizers
        self.decoding = decoding
        self.training_config = training_config

    @property
    @abstractmethod
    def model_config(self) -> ModelConfig:
        """The config of the model this engine runs (pruned heads included)."""

    @property
    def max_source_tokens(self) -> int:
        """Source pieces the model reads at most (its position limit, minus EOS)."""
        return self.model_config.max_positions - 1

    @property
    def languages(self) -> dict[str, str | None]:
        """{"src": code, "tgt": code} of the training data; None where not recorded."""
        data = None if self.training_config is None else self.training_config.data
        return {"src": data and data.src_lang, "tgt": data and data.tgt_lang}

    @property
    def vocab_map(self) -> dict[str, Any] | None:
        """The vocabulary map the engine decodes over (`ExportInfo.vocab_map`: its file and
        counts), or None: every step scores the whole target vocabulary."""
        return None

    @property
    def num_parameters(self) -> int | None:
        """The model's parameter count, where the engine can tell."""
        return None

    def request(self, request: DecodingRequest | None = None,
                **options: Any) -> DecodingRequest:
        """The request of one call, checked against this engine and model (`check`):
        `request` with `options` (its fields) replaced, or without one, a request over this
        translator's defaults (`DecodingRequest.over`: beam, alpha and length limits left
        out or None keep `self.decoding`'s)."""
        if request is None:
            request = DecodingRequest.over(self.decoding, **options)
        elif options:
            request = replace(request, **options)
        self.check(request)
        return request

    def check(self, request: DecodingRequest) -> None:
        """Raise `RequestError` for what this model cannot do: an alignment layer or head it
        does not have. Engines add what they cannot do (and call this)."""
        if request.alignment is not None:
            c = self.model_config
            layer = request.alignment.layer % c.num_decoder_layers
            pruned = c.pruned_heads.get(f"decoder.blks.{layer}.attention2", [])
            heads = [h for h in range(c.num_heads + len(pruned)) if h not in pruned]
            request.alignment.check(c.num_decoder_layers, heads)

    def translate(self, lines: Sequence[str], request: DecodingRequest | None = None,
                  **options: Any) -> list[str]:
        """Translate sentences -> the best translation of each line, in input order.
        `request` and `options` are those of `translations`, which also gives n-best lists,
        scores and alignments."""
        return [sentence[0].text for sentence in self.translations(lines, request, **options)]

    def translations(self, lines: Sequence[str], request: DecodingRequest | None = None, *,
                     prefixes: Sequence[str] | None = None,
                     max_tokens: int = DEFAULT_MAX_TOKENS, line_offset: int = 0,
                     on_progress: Callable[[int], None] | None = None,
                     **options: Any) -> list[list[Translation]]:
        """Translate sentences, in input order -> the `nbest` best `Translation`s per line.

        How to decode: `request`, with `options` (its fields, e.g. `beam_size=4`) replaced;
        without a request, this translator's defaults (see `request`). `prefixes` (one
        string per line, "" for none): text each translation must begin with. An empty
        (blank) line gives "" with score 0.0 without running the model. Lines are batched
        by length (`max_tokens` source tokens per batch, padding included). `line_offset`
        is added to line numbers in messages; `on_progress(n)` is called as sentences are
        done.
        """
        request = self.request(request, **options)
        sources = self._encode(lines, line_offset)
        targets = None if prefixes is None else self._encode_prefixes(prefixes, len(lines))
        hyps = self._search(sources, request, prefixes=targets, max_tokens=max_tokens,
                            on_progress=on_progress)
        return [[self._translation(h, src, request.alignment is not None) for h in sentence]
                for sentence, src in zip(hyps, sources, strict=True)]

    def _encode_prefixes(self, prefixes: Sequence[str], num_lines: int) -> list[list[int]]:
        """Target pieces of each line's prefix ([] for none), checked against the lines."""
        if len(prefixes) != num_lines:
            raise DataError(f"{len(prefixes)} prefixes for {num_lines} lines: give one per "
                            f"line (an empty one for none)")
        ids = self.tokenizers.tgt.encode_batch([p if p.strip() else "" for p in prefixes])
        limit = self.model_config.max_positions - 1
        for number, pieces in enumerate(ids, 1):
            if len(pieces) >= limit:
                raise DataError(f"prefix {number} has {len(pieces)} pieces; the model writes "
                                f"at most {limit - 1} before EOS")
        return ids

    def _translation(self, hyp: Hypothesis, source: list[int], aligned: bool) -> Translation:
        """A hypothesis as text, with its word alignment where asked (and a source)."""
        alignment = None
        if aligned:
            alignment = [] if hyp.attention is None else word_alignment(
                hyp.attention, [self.tokenizers.src.id_to_piece(i) for i in source[:-1]],
                [self.tokenizers.tgt.id_to_piece(i) for i in hyp.tokens])
        return Translation(self._decode(hyp.tokens), hyp.score, hyp.log_prob, alignment)

    def score(self, sources: Sequence[str], targets: Sequence[str], *,
              alpha: float | None = None, max_tokens: int = DEFAULT_MAX_TOKENS,
              line_offset: int = 0) -> list[Hypothesis]:
        """Forced decoding: the model's score of each given translation of each source.
        Returns per pair a `Hypothesis` of the target's pieces, its log-probability (the
        sum over its tokens, EOS included) and its length-normalised score (as the search
        ranks: log_prob / length_penalty(pieces + 1, alpha)), in input order, batched by
        length like `translate`. A blank source is read as just EOS."""
        if len(sources) != len(targets):
            raise DataError(f"{len(sources)} sources but {len(targets)} translations to score")
        alpha = self.request(alpha=alpha).alpha  # None: the default; checked as a request's
        eos = self.tokenizers.src.specials.eos
        src = [ids or [eos] for ids in self._encode(sources, line_offset)]
        tgt = self.tokenizers.tgt.encode_batch(list(targets))
        for number, ids in enumerate(tgt, line_offset + 1):
            if len(ids) >= self.model_config.max_positions:
                raise DataError(f"translation {number} has {len(ids)} pieces; the model "
                                f"reads at most {self.model_config.max_positions - 1}")
        log_probs = self._score(src, tgt, max_tokens=max_tokens)
        return [Hypothesis(ids, log_prob / length_penalty(len(ids) + 1, alpha), log_prob)
                for ids, log_prob in zip(tgt, log_probs, strict=True)]

    @abstractmethod
    def _score(self, sources: list[list[int]], targets: list[list[int]], *,
               max_tokens: int) -> list[float]:
        """Each target's log-probability (EOS included) given its source (ids with EOS)."""

    @abstractmethod
    def _search(self, sources: list[list[int]], request: DecodingRequest, *,
                prefixes: list[list[int]] | None, max_tokens: int,
                on_progress: Callable[[int], None] | None) -> list[list[Hypothesis]]:
        """The engine's `search_corpus` for a checked request: source ids (with EOS; [] for
        a blank line) -> `nbest` hypotheses per sentence, in input order, each with its
        `attention` (output pieces, source pieces + EOS) when the request aligns."""

    def _encode(self, lines: Sequence[str], line_offset: int) -> list[list[int]]:
        """Source ids (pieces + EOS) per line, [] for a blank line; over-long lines are
        truncated to the model's limit with a warning naming the line."""
        limit = self.max_source_tokens
        pieces = self.tokenizers.src.encode_batch([line if line.strip() else ""
                                                   for line in lines])
        sources = []
        for number, ids in enumerate(pieces, line_offset + 1):
            if len(ids) > limit:
                log.warning("line %d has %d source tokens, more than the model's limit of %d; "
                            "translating its first %d", number, len(ids), limit, limit)
                ids = ids[:limit]
            sources.append(ids + [self.tokenizers.src.specials.eos] if ids else [])
        return sources

    def _decode(self, ids: list[int]) -> str:
        """Detokenized text on one line (a generated newline byte must not split it)."""
        return self.tokenizers.tgt.decode(ids).replace("\r", " ").replace("\n", " ")


class Translator(BaseTranslator):
    """Our PyTorch engine: a model, its tokenizers and its decoding defaults, ready to
    translate raw sentences.

    `decoding` defaults to those stored in the checkpoint by `transformer tune-decoding`
    (alpha and beam size chosen on validation data), else `DecodingSettings()`.
    """

    engine: ClassVar[str] = "torch"

    def __init__(self, model: Transformer, tokenizers: TokenizerPair,
                 device: str | torch.device = "cpu", *,
                 decoding: DecodingSettings = DecodingSettings(),
                 training_config: TrainConfig | None = None):
        super().__init__(tokenizers, decoding=decoding,
                         training_config=training_config)
        self.device = resolve_device(device)
        self.model = model.to(self.device).eval()

    @property
    def model_config(self) -> ModelConfig:
        """The model's own config (it changes when heads are pruned)."""
        return self.model.config

    @property
    def num_parameters(self) -> int:
        return self.model.num_parameters()

    @classmethod
    def load(cls, checkpoint: PathLike | Sequence[PathLike],
             device: str | torch.device = "auto") -> Translator:
        """Load a checkpoint file or run directory; several are averaged (same model config,
        the first one's tokenizer and settings). Raises CheckpointError with a one-line
        message."""
        paths = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
        files = [resolve_checkpoint(p) for p in paths]
        state = load_checkpoint(files[0]) if len(files) == 1 else average_weights(files)
        name = files[0] if len(files) == 1 else f"the average of {len(files)} checkpoints"
        tokenizers = tokenizers_from_state(state, name)
        model = model_from_checkpoint(state, name)
        check_tokenizers(model.config, tokenizers, name)
        return cls(model, tokenizers, device, decoding=stored_decoding(state, name),
                   training_config=stored_training_config(state, name))

    def _score(self, sources: list[list[int]], targets: list[list[int]], *,
               max_tokens: int) -> list[float]:
        model = self.model
        pairs = ParallelCorpus.from_ids([ids[:-1] for ids in sources], targets,
                                        self.tokenizers.tgt.specials,
                                        max(model.config.src_vocab_size,
                                            model.config.tgt_vocab_size))
        sizes = [max(len(s), len(t) + 1) for s, t in zip(sources, targets, strict=True)]
        log_probs = [0.0] * len(sources)
        for batch in sorted_batches(range(len(sizes)), sizes, max_tokens):
            scores = sentence_log_probs(model, pairs.collate(batch).to(self.device))
            for i, value in zip(batch, scores.tolist(), strict=True):
                log_probs[i] = value
        return log_probs

    def _search(self, sources: list[list[int]], request: DecodingRequest, *,
                prefixes: list[list[int]] | None, max_tokens: int,
                on_progress: Callable[[int], None] | None) -> list[list[Hypothesis]]:
        hyps = search_corpus(self.model, sources, request, prefixes=prefixes,
                             max_tokens=max_tokens, on_progress=on_progress)
        if request.alignment is None:
            return hyps
        found = [(i, j) for i, sentence in enumerate(hyps) for j in range(len(sentence))
                 if sources[i]]
        weights = attention_weights(self.model, [sources[i] for i, _ in found],
                                    [hyps[i][j].tokens for i, j in found],
                                    request.alignment, max_tokens)
        for (i, j), attention in zip(found, weights, strict=True):
            hyps[i][j] = replace(hyps[i][j], attention=attention)
        return hyps
