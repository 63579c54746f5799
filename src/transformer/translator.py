"""Translator: load a checkpoint (or average several) once, translate lists of sentences.

    translator = Translator.load("runs/x")          # -> runs/x/checkpoints/checkpoint_best.pt
    translator.translate(["A man rides a bike."], beam_size=5)        # -> ["Ein Mann ..."]
    translator.translate(lines, nbest=3)            # -> [[(text, score), ...x3], ...]

`BaseTranslator` is the interface every engine offers (ours here, CTranslate2's in
`engines.py`), and all that `transformer translate`, the server and the export rely on. Also
the pieces `transformer translate` is made of: chunked translation of a stream in input
order, n-best formatting and sacrebleu scoring.
"""

from __future__ import annotations

import itertools
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, TextIO, Union

import torch

from .alignment import AlignmentOptions, attention_weights, format_alignment, word_alignment
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
from .errors import DataError
from .loss import sentence_log_probs
from .model import ModelConfig, Transformer
from .search import DEFAULT_MAX_TOKENS, Hypothesis, Sampling, length_penalty, search_corpus
from .store import ParallelCorpus
from .tokenizer import TokenizerPair

__all__ = ["Translation", "BaseTranslator", "Translator", "translate_lines", "score_lines",
           "format_nbest", "format_output", "bleu_report", "paper_protocol"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
Scored = list[tuple[str, float]]  # an n-best list: (translation, score), best first


@dataclass(frozen=True)
class Translation:
    """One translation of a line, as `BaseTranslator.translations` returns it."""

    text: str
    score: float  # log_prob / length_penalty(pieces + 1, alpha): how the search ranks
    log_prob: float  # the model's log-probability of the output, EOS included
    alignment: list[tuple[int, int]] | None = None  # (source word, output word), if asked


def _device(device: str | torch.device) -> torch.device:
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(device)


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

    def settings(self, **overrides: int | float | None) -> DecodingSettings:
        """`self.decoding` with the given fields replaced; None keeps the default."""
        return replace(self.decoding, **{k: v for k, v in overrides.items() if v is not None})

    def translate(self, lines: Sequence[str], *, return_scores: bool = False, nbest: int = 1,
                  **options: Any) -> list[str] | list[Scored]:
        """Translate sentences, in input order: one string per line, or, with `nbest > 1`
        or `return_scores`, one n-best list of (translation, score) per line (score: the
        length-normalised log-prob of `search.beam_search`). `options` are those of
        `translations`."""
        results = self.translations(lines, nbest=nbest, **options)
        if nbest == 1 and not return_scores:
            return [sentence[0].text for sentence in results]
        return [[(t.text, t.score) for t in sentence] for sentence in results]

    def translations(self, lines: Sequence[str], *, beam_size: int | None = None,
                     nbest: int = 1, alpha: float | None = None,
                     max_len_a: float | None = None, max_len_b: int | None = None,
                     sampling: Sampling | None = None, prefixes: Sequence[str] | None = None,
                     alignment: AlignmentOptions | None = None,
                     max_tokens: int = DEFAULT_MAX_TOKENS, line_offset: int = 0,
                     on_progress: Callable[[int], None] | None = None,
                     use_cache: bool = True) -> list[list[Translation]]:
        """Translate sentences, in input order -> the `nbest` best `Translation`s per line.

        Decoding options left at None take `self.decoding`'s values. `sampling` draws one
        translation per line instead of searching (beam size and n-best do not apply).
        `prefixes` (one string per line, "" for none): text each translation must begin
        with. `alignment`: also align each translation's words to the source's. An empty
        (blank) line gives "" with score 0.0 without running the model. Lines are batched
        by length (`max_tokens` source tokens per batch, padding included). `line_offset`
        is added to line numbers in messages; `on_progress(n)` is called as sentences are
        done. `use_cache=False` re-runs the decoder over the whole prefix at each step (our
        PyTorch engine only; slow; for tests and benchmarks).
        """
        settings = self.settings(beam_size=beam_size, alpha=alpha, max_len_a=max_len_a,
                                 max_len_b=max_len_b)
        if sampling is not None and nbest != 1:
            raise ValueError(f"sampling draws one translation per line, not nbest={nbest}")
        if sampling is None and not 1 <= nbest <= settings.beam_size:
            raise ValueError(f"need 1 <= nbest <= beam_size, got nbest={nbest}, "
                             f"beam_size={settings.beam_size}")
        sources = self._encode(lines, line_offset)
        targets = None if prefixes is None else self._encode_prefixes(prefixes, len(lines))
        hyps = self._search(sources, settings, nbest=nbest, sampling=sampling,
                            prefixes=targets, alignment=alignment, max_tokens=max_tokens,
                            use_cache=use_cache, on_progress=on_progress)
        return [[self._translation(h, src, alignment is not None) for h in sentence]
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
        alpha = self.settings(alpha=alpha).alpha
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
    def _search(self, sources: list[list[int]], settings: DecodingSettings, *, nbest: int,
                sampling: Sampling | None, prefixes: list[list[int]] | None,
                alignment: AlignmentOptions | None, max_tokens: int, use_cache: bool,
                on_progress: Callable[[int], None] | None) -> list[list[Hypothesis]]:
        """The engine's `search_corpus`: source ids (with EOS; [] for a blank line) ->
        `nbest` hypotheses per sentence, in input order, each with its `attention` (output
        pieces, source pieces + EOS) when `alignment` is given."""

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
        self.device = _device(device)
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

    def _search(self, sources: list[list[int]], settings: DecodingSettings, *, nbest: int,
                sampling: Sampling | None, prefixes: list[list[int]] | None,
                alignment: AlignmentOptions | None, max_tokens: int, use_cache: bool,
                on_progress: Callable[[int], None] | None) -> list[list[Hypothesis]]:
        hyps = search_corpus(self.model, sources, settings=settings, nbest=nbest,
                             sampling=sampling, prefixes=prefixes, max_tokens=max_tokens,
                             use_cache=use_cache, on_progress=on_progress)
        if alignment is None:
            return hyps
        found = [(i, j) for i, sentence in enumerate(hyps) for j in range(len(sentence))
                 if sources[i]]
        weights = attention_weights(self.model, [sources[i] for i, _ in found],
                                    [hyps[i][j].tokens for i, j in found], alignment,
                                    max_tokens)
        for (i, j), attention in zip(found, weights, strict=True):
            hyps[i][j] = replace(hyps[i][j], attention=attention)
        return hyps


# ---- streams, as `transformer translate` uses them ---------------------------------------------

def format_nbest(line_number: int, translations: Sequence[Translation]) -> list[str]:
    """n-best output lines: LINE_NUMBER <tab> SCORE <tab> TRANSLATION [<tab> ALIGNMENT],
    best first."""
    return [f"{line_number}\t{t.score:.4f}\t{format_output(t)}" for t in translations]


def format_output(translation: Translation) -> str:
    """The translation, and after a tab its alignment ("0-0 1-2") where there is one."""
    if translation.alignment is None:
        return translation.text
    return f"{translation.text}\t{format_alignment(translation.alignment)}"


def translate_lines(translator: BaseTranslator, lines: Iterable[str], out: TextIO, *,
                    chunk_lines: int = 10_000, nbest: int = 1,
                    prefixes: Sequence[str] | None = None, keep: bool = False,
                    flush: bool = False, on_progress: Callable[[int], None] | None = None,
                    **options: Any) -> list[str]:
    """Translate `lines` chunk by chunk (memory stays bounded), writing each chunk's
    translations to `out` in input order before reading the next chunk: one line per input
    line (`format_output`), or `nbest` lines in `format_nbest`'s format. `prefixes`: one
    per input line. Returns the best translations when `keep` (for scoring), else [].
    `options` go to `BaseTranslator.translations`."""
    kept: list[str] = []
    it = iter(lines)
    start = 0
    while chunk := list(itertools.islice(it, chunk_lines)):
        chunk_prefixes = None if prefixes is None else prefixes[start:start + len(chunk)]
        if chunk_prefixes is not None and len(chunk_prefixes) < len(chunk):
            raise DataError(f"the prefixes end at line {len(prefixes)}, but the input goes on")
        results = translator.translations(chunk, nbest=nbest, prefixes=chunk_prefixes,
                                          line_offset=start, on_progress=on_progress,
                                          **options)
        for number, hyps in enumerate(results, start + 1):
            rows = format_nbest(number, hyps) if nbest > 1 else [format_output(hyps[0])]
            out.write("".join(row + "\n" for row in rows))
        if flush:
            out.flush()
        if keep:
            kept.extend(hyps[0].text for hyps in results)
        start += len(chunk)
    if prefixes is not None and start != len(prefixes):
        raise DataError(f"{len(prefixes)} prefixes for {start} input lines")
    return kept


def score_lines(translator: BaseTranslator, sources: Sequence[str], targets: Sequence[str],
                out: TextIO, *, chunk_lines: int = 10_000,
                on_progress: Callable[[int], None] | None = None, **options: Any) -> None:
    """Forced decoding of each (source, translation) pair, chunk by chunk: one line per
    pair, LOG_PROB <tab> SCORE (`BaseTranslator.score`; SCORE is length-normalised as the
    search ranks). `options` go to `BaseTranslator.score`."""
    for start in range(0, len(sources), chunk_lines):
        end = start + chunk_lines
        for hyp in translator.score(sources[start:end], targets[start:end], line_offset=start,
                                    **options):
            out.write(f"{hyp.log_prob:.6f}\t{hyp.score:.6f}\n")
        if on_progress is not None:
            on_progress(len(sources[start:end]))


def bleu_report(hypotheses: Sequence[str], references: Sequence[str], *,
                tokenize: str = "13a", chrf: bool = True) -> list[str]:
    """sacrebleu's corpus BLEU (and chrF), formatted as its command line prints them
    (`sacrebleu REF -i HYP -m bleu chrf --format text [--tokenize none]`)."""
    from sacrebleu.metrics import BLEU, CHRF

    if len(hypotheses) != len(references):
        raise DataError(f"the reference has {len(references)} lines but the input has "
                        f"{len(hypotheses)}")
    report = []
    bleu = BLEU(tokenize=tokenize, force=tokenize == "none")  # tokenized on purpose: no warning
    for metric in (bleu, CHRF()) if chrf else (bleu,):
        score = metric.corpus_score(list(hypotheses), [list(references)])
        report.append(score.format(width=1, signature=str(metric.get_signature())))
    align = max(line.index("=") for line in report)  # the CLI aligns the "=" signs
    return [line.rjust(len(line) + align - line.index("=")) for line in report]


def paper_protocol(lines: Iterable[str], lang: str) -> list[str]:
    """Lowercase, normalize punctuation and Moses-tokenize `lines` as the Multi30k dataset's
    own pipeline does (`lowercase.perl | normalize-punctuation.perl -l LANG |
    tokenizer.perl -l LANG`, here through sacremoses). Published Multi30k results (e.g. Wu et
    al. 2021) score such hypotheses against the dataset's `tok/*.lc.norm.tok.LANG` references
    with `sacrebleu --tokenize none`; our standard remains cased detokenized sacreBLEU."""
    try:
        from sacremoses import MosesPunctNormalizer, MosesTokenizer
    except ImportError:
        raise DataError("the paper protocol needs sacremoses: pip install sacremoses "
                        "(or the package's [paper] extra)") from None
    normalizer, tokenizer = MosesPunctNormalizer(lang=lang), MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True, escape=True)
            for line in lines]
