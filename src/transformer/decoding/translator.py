"""Translator: load a checkpoint (or average several) once, translate lists of sentences.

    translator = Translator.load("runs/x")          # -> runs/x/checkpoints/checkpoint_best.pt
    translator.translate(["A man rides a bike."], beam_size=5)        # -> ["Ein Mann ..."]
    translator.translations(lines, nbest=3)   # -> per line 3 Translations (text, score, ...)
    translator.translations(lines, translator.request(nbest=3, alpha=2.0))   # the same object
    translator.translate(lines, target_lang="fr")     # a multilingual model: into French
    translator = Translator.load("runs/x", device="cpu", quantize="int8")   # int8 linear layers
    translator = Translator.load(["runs/a", "runs/b"], ensemble=True)   # two models together
    translator.translate(lines, constraints=[["Vertrag"], []])     # phrases each must contain

`BaseTranslator` is the interface every engine offers (ours here, CTranslate2's in
`engines.py`), and all that `transformer translate`, the server and the export rely on. Every
call decodes as one `request.DecodingRequest` says, built and checked once (`request`).

A multilingual model (trained into several target languages, `data_config.DataConfig.lang_tags`)
reads the target language's tag (`<2fr>`) in front of every source, as in training: each
call names its language (`target_lang`), `check` refuses a call without one or into a
language the model was not trained for, and `encode_sources`, the one source encoding of
every path (search, sampling, prefixes, alignments, scoring), puts the tag first. The tag is
not a word of the text: alignments count the text's words only.

`quantize="int8"` runs our engine's linear layers in int8 (`int8.quantize_int8`, PyTorch's
dynamic quantization, CPU only): int8 weights and matrix products, outputs close to
float32's but not always equal. The one rule for it: `check_quantize`.
"""

from __future__ import annotations

import functools
import logging
import os
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any, ClassVar, Union

import torch

from .. import hardware
from ..data.batching import sorted_batches
from ..data.store import ParallelCorpus
from ..data.tokenizer import TokenizerPair
from ..errors import CheckpointError, DataError, ExportError
from ..model.ensemble import Ensemble, members
from ..model.int8 import quantize_int8
from ..model.layers import transpose_linear_weights
from ..model.loss import sentence_log_probs
from ..model.transformer import ModelConfig, Transformer
from ..run.checkpoint import (
    average_weights,
    check_ensemble_member,
    check_tokenizers,
    load_checkpoint,
    model_from_checkpoint,
    resolve_checkpoint,
    stored_decoding,
    stored_run_id,
    stored_training_config,
    tokenizers_from_state,
)
from ..run.config import DecodingSettings, TrainConfig
from ..runtime import resolve_device
from .alignment import attention_weights, word_alignment
from .corpus import DEFAULT_MAX_TOKENS, search_corpus
from .request import DecodingRequest, RequestError, check_quantize, check_workers, literal
from .search import Hypothesis, length_penalty, max_output_lengths
from .workers import SearchWorkers

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
    # False: constraints were given, and none of the hypotheses within the length limit
    # contained them all
    constraints_met: bool = True


class BaseTranslator(ABC):
    """What every engine's translator offers: tokenizers, decoding defaults, the source
    encoding (a multilingual model's target-language tag + pieces + EOS, over-long lines
    truncated), `translate`'s batching and return conventions, and what the tools around it
    read (`model_config`, `max_source_tokens`, `languages`, `target_languages`,
    `multilingual`, `vocab_map`). An engine supplies `model_config` and `_search`
    (`Translator`: our PyTorch model; `engines.CTranslate2Translator`: an exported model).

    `decoding` holds the defaults every `translate` call starts from; `training_config` is
    the training configuration the checkpoint recorded (its language pair and data), parsed
    when the engine is loaded, or None.
    """

    engine: ClassVar[str]  # "torch" or "ctranslate2"
    constrained_search: ClassVar[bool] = True  # can `translations` take constraints
    quantize: str | None = None  # "int8": our engine's linear layers in int8 (`Translator`)

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
        """Pieces of a source line the model reads at most: its position limit, minus EOS
        and a multilingual model's target-language tag."""
        tags = self.source_tags(self.target_languages[0]) if self.multilingual else []
        return self.model_config.max_positions - 1 - len(tags)

    @property
    def languages(self) -> dict[str, str | None]:
        """{"src": code, "tgt": code} of the training data; None where not recorded, and
        "tgt" None for a multilingual model (its languages: `target_languages`)."""
        if self.training_config is None:
            return {"src": None, "tgt": None}
        data = self.training_config.data
        return {"src": data.src_lang, "tgt": None if data.lang_tags else
                data.target_languages()[0]}

    @property
    def target_languages(self) -> tuple[str, ...]:
        """The languages the model translates into, sorted: its training data's
        (`DataConfig.target_languages`); without a training config (an imported model),
        `languages["tgt"]` where known, else none."""
        if self.training_config is not None:
            return tuple(self.training_config.data.target_languages())
        tgt = self.languages["tgt"]
        return () if tgt is None else (tgt,)

    @property
    def multilingual(self) -> bool:
        """Whether the model reads a target-language tag in front of every source: it was
        trained into several languages (`DataConfig.lang_tags`)."""
        return self.training_config is not None and self.training_config.data.lang_tags

    @property
    def vocab_map(self) -> dict[str, Any] | None:
        """The vocabulary map the engine decodes over (`ExportInfo.vocab_map`: its file and
        counts), or None: every step scores the whole target vocabulary."""
        return None

    @property
    def num_parameters(self) -> int | None:
        """The model's parameter count, where the engine can tell."""
        return None

    @property
    def num_models(self) -> int:
        """How many models decode together: an ensemble's members, else 1."""
        return 1

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
        """Raise `RequestError` for what this model cannot do: translate into a language it
        was not trained for (or, multilingual, into no language named), align with a layer
        or head it does not have. Engines add what they cannot do (and call this)."""
        self._check_target_lang(request.target_lang)
        if request.alignment is not None:
            c = self.model_config
            layer = request.alignment.layer % c.num_decoder_layers
            pruned = c.pruned_heads.get(f"decoder.blks.{layer}.attention2", [])
            heads = [h for h in range(c.num_heads + len(pruned)) if h not in pruned]
            request.alignment.check(c.num_decoder_layers, heads)

    def _check_target_lang(self, lang: str | None) -> None:
        """`RequestError` naming target_lang unless the model translates into `lang` (None:
        its only target language; a multilingual model has none)."""
        langs = self.target_languages
        listed = ", ".join(langs)
        if lang is None and self.multilingual:
            raise RequestError("target_lang", f"this model translates into {listed}: choose "
                                              f"one with {{target_lang}}")
        if lang is None or lang in langs:
            return
        if not langs:
            raise RequestError("target_lang", f"this model does not record the language it "
                                              f"translates into, so it cannot check "
                                              f"{{target_lang}} {literal(lang)}: leave it out")
        choose = ("choose one of them with {target_lang}" if self.multilingual
                  else f"leave {{target_lang}} out or give {langs[0]}")
        raise RequestError("target_lang", f"this model was not trained to translate into "
                                          f"{literal(lang)} (it translates into {listed}): "
                                          f"{choose}")

    def source_tags(self, target_lang: str | None) -> list[int]:
        """The ids in front of every source translated into `target_lang`: a multilingual
        model's target-language tag (`DataConfig.source_tags`), else none. `RequestError`
        for a language the model does not take (`check`)."""
        if not self.multilingual:
            return []
        self._check_target_lang(target_lang)
        ids = self.tokenizers.src.tags
        pieces = self.training_config.data.source_tags(None, target_lang)
        for piece in pieces:
            if piece not in ids:
                raise CheckpointError(f"the model's source tokenizer has no piece {piece}, "
                                      f"the tag of target language {target_lang}")
        return [ids[piece] for piece in pieces]

    def check_bilingual(self, name: str, action: str, reason: str) -> None:
        """`ExportError` (one line) for a multilingual model, which `action` (e.g.
        "exporting it to CTranslate2") cannot carry: `name` (e.g. its checkpoint) is
        multilingual, the action is not supported, `reason`."""
        if self.multilingual:
            tags = ", ".join(self.training_config.data.source_tags(None, lang)[0]
                             for lang in self.target_languages)
            raise ExportError(f"{name or 'the model'} is a multilingual model (target-language "
                              f"tags {tags}); {action} is not supported: {reason}")

    def check_float(self, name: str, action: str) -> None:
        """`ExportError` (one line) for a translator loaded with its linear layers in int8
        (`quantize`), whose float32 weights `action` (e.g. "exporting it to CTranslate2")
        needs; `name`: the model's checkpoint."""
        if self.quantize is not None:
            raise ExportError(f"{name or 'the model'} was loaded with quantize="
                              f"{self.quantize!r}; {action} needs its float32 weights: load "
                              f"it without quantize")

    def translate(self, lines: Sequence[str], request: DecodingRequest | None = None,
                  **options: Any) -> list[str]:
        """Translate sentences -> the best translation of each line, in input order.
        `request` and `options` are those of `translations`, which also gives n-best lists,
        scores and alignments."""
        return [sentence[0].text for sentence in self.translations(lines, request, **options)]

    def translations(self, lines: Sequence[str], request: DecodingRequest | None = None, *,
                     prefixes: Sequence[str] | None = None,
                     constraints: Sequence[Sequence[str]] | None = None,
                     max_tokens: int = DEFAULT_MAX_TOKENS, line_offset: int = 0,
                     on_progress: Callable[[int], None] | None = None,
                     **options: Any) -> list[list[Translation]]:
        """Translate sentences, in input order -> the `nbest` best `Translation`s per line.

        How to decode: `request`, with `options` (its fields, e.g. `beam_size=4`,
        `target_lang="de"`) replaced; without a request, this translator's defaults (see
        `request`). `prefixes` (one string per line, "" for none): text each translation
        must begin with. `constraints` (one list per line, [] for none): phrases each
        translation must contain (lexically constrained beam search, `constraints`; in
        their order with the request's `ordered_constraints`); a line none of whose
        hypotheses contains them all within its length limit gets its best translation
        without them, counted in a warning. An empty (blank) line gives "" with score 0.0
        without running the model. Lines are batched by length (`max_tokens` source tokens
        per batch, padding included). `line_offset` is added to line numbers in messages;
        `on_progress(n)` is called as sentences are done.
        """
        request = self.request(request, **options)
        sources = self.encode_sources(lines, request.target_lang, line_offset=line_offset)
        targets = None if prefixes is None else self._encode_prefixes(prefixes, len(lines))
        phrases = (None if constraints is None else
                   self.encode_constraints(constraints, sources, request, line_offset))
        hyps = self._search(sources, request, prefixes=targets, constraints=phrases,
                            max_tokens=max_tokens, on_progress=on_progress)
        missed = sum(not sentence[0].constraints_met for sentence in hyps if sentence)
        if missed:
            log.warning("%d of %d lines: no translation within the length limit contains all "
                        "their constraints; each has its best translation without them",
                        missed, len(lines))
        tags = (None if request.alignment is None
                else len(self.source_tags(request.target_lang)))
        return [[self._translation(h, src, tags) for h in sentence]
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

    def encode_constraints(self, constraints: Sequence[Sequence[str]],
                           sources: list[list[int]], request: DecodingRequest,
                           line_offset: int = 0) -> list[list[list[int]]] | None:
        """Target pieces of each line's constraint phrases (None where no line has any),
        checked before anything is translated: one list per source (`encode_sources`' ids),
        each phrase of known pieces, a line's phrases together within its translation's
        length limit (`search.max_output_lengths`), a beam search, an engine that has a
        constrained search (`constrained_search`). `DataError` naming the line (numbered
        from `line_offset` + 1) and phrase, or `RequestError` naming the option."""
        if len(constraints) != len(sources):
            raise DataError(f"{len(constraints)} constraint lines for {len(sources)} lines: "
                            f"give one per line (an empty one for none)")
        if not any(constraints):
            return None
        if not self.constrained_search:
            raise RequestError("constraints", f"the {self.engine} engine has no lexically "
                                              f"constrained search: {{constraints}} need the "
                                              f"torch engine")
        if request.sampling is not None:
            raise RequestError("constraints", "{constraints} need beam search: leave out "
                                              "{sampling_topk}, {sampling_topp} and "
                                              "{temperature}")
        tokenizer = self.tokenizers.tgt
        limits = max_output_lengths(torch.tensor([len(ids) for ids in sources]),
                                    request.max_len_a, request.max_len_b,
                                    self.model_config.max_positions).tolist()
        encoded = []
        for number, (phrases, limit) in enumerate(zip(constraints, limits, strict=True),
                                                  line_offset + 1):
            ids = tokenizer.encode_batch([p if p.strip() else "" for p in phrases])
            for j, (phrase, pieces) in enumerate(zip(phrases, ids, strict=True), 1):
                where = f"constraint {j} of line {number} ({phrase!r})"
                if not pieces:
                    raise DataError(f"{where} is no target piece: give a word or phrase")
                if tokenizer.specials.unk in pieces:
                    raise DataError(f"{where} has characters the target vocabulary lacks "
                                    f"(it would be written as <unk>)")
            total = sum(map(len, ids))
            if sources[number - line_offset - 1] and total > limit:  # a blank line: ""
                raise DataError(f"the constraints of line {number} have {total} target "
                                f"pieces, more than the {limit} its translation may have "
                                f"(max_len_a * source pieces + max_len_b)")
            encoded.append(ids)
        return encoded

    def _translation(self, hyp: Hypothesis, source: list[int],
                     tags: int | None) -> Translation:
        """A hypothesis as text, with its word alignment where asked (`tags`: how many tag
        ids begin the source, None: no alignment). Alignments count the text's words: the
        tags' attention columns are left out, as the EOS's."""
        alignment = None
        if tags is not None:
            alignment = [] if hyp.attention is None else word_alignment(
                hyp.attention[:, tags:],
                [self.tokenizers.src.id_to_piece(i) for i in source[tags:-1]],
                [self.tokenizers.tgt.id_to_piece(i) for i in hyp.tokens])
        return Translation(self._decode(hyp.tokens), hyp.score, hyp.log_prob, alignment,
                           hyp.constraints_met)

    def score(self, sources: Sequence[str], targets: Sequence[str], *,
              alpha: float | None = None, target_lang: str | None = None,
              max_tokens: int = DEFAULT_MAX_TOKENS, line_offset: int = 0) -> list[Hypothesis]:
        """Forced decoding: the model's score of each given translation of each source
        (translated into `target_lang`, checked as a request's). Returns per pair a
        `Hypothesis` of the target's pieces, its log-probability (the sum over its tokens,
        EOS included) and its length-normalised score (as the search ranks: log_prob /
        length_penalty(pieces + 1, alpha)), in input order, batched by length like
        `translate`. A blank source is read as just its tags and EOS."""
        if len(sources) != len(targets):
            raise DataError(f"{len(sources)} sources but {len(targets)} translations to score")
        # None: the defaults; checked as a request's
        request = self.request(alpha=alpha, target_lang=target_lang)
        src = self.encode_sources(sources, request.target_lang, line_offset=line_offset,
                                  blank=True)
        tgt = self.tokenizers.tgt.encode_batch(list(targets))
        for number, ids in enumerate(tgt, line_offset + 1):
            if len(ids) >= self.model_config.max_positions:
                raise DataError(f"translation {number} has {len(ids)} pieces; the model "
                                f"reads at most {self.model_config.max_positions - 1}")
        log_probs = self._score(src, tgt, max_tokens=max_tokens)
        return [Hypothesis(ids, log_prob / length_penalty(len(ids) + 1, request.alpha),
                           log_prob)
                for ids, log_prob in zip(tgt, log_probs, strict=True)]

    @abstractmethod
    def _score(self, sources: list[list[int]], targets: list[list[int]], *,
               max_tokens: int) -> list[float]:
        """Each target's log-probability (EOS included) given its source (ids with EOS)."""

    @abstractmethod
    def _search(self, sources: list[list[int]], request: DecodingRequest, *,
                prefixes: list[list[int]] | None,
                constraints: list[list[list[int]]] | None, max_tokens: int,
                on_progress: Callable[[int], None] | None) -> list[list[Hypothesis]]:
        """The engine's `search_corpus` for a checked request: source ids (with EOS; [] for
        a blank line) -> `nbest` hypotheses per sentence, in input order, each with its
        `attention` (output pieces, source pieces + EOS) when the request aligns. Prefixes
        and constraint phrases: target ids per sentence."""

    def encode_sources(self, lines: Sequence[str], target_lang: str | None = None, *,
                       line_offset: int = 0, blank: bool = False) -> list[list[int]]:
        """The ids the model reads for each line translated into `target_lang`: its tags
        (`source_tags`) + pieces + EOS, as in training. A blank line is [] (it is not
        translated), or with `blank` its tags + EOS. Over-long lines are truncated to the
        model's limit (`max_source_tokens`) with a warning naming the line (numbered from
        `line_offset` + 1). Every path that gives the model sources encodes them here."""
        limit = self.max_source_tokens
        tags, eos = self.source_tags(target_lang), self.tokenizers.src.specials.eos
        pieces = self.tokenizers.src.encode_batch([line if line.strip() else ""
                                                   for line in lines])
        reserved = set(self.tokenizers.src.tags.values())
        if reserved:  # a tag typed in the text is not one: only `target_lang` chooses
            pieces = [[i for i in ids if i not in reserved] for ids in pieces]
        sources = []
        for number, ids in enumerate(pieces, line_offset + 1):
            if len(ids) > limit:
                log.warning("line %d has %d source tokens, more than the model's limit of %d; "
                            "translating its first %d", number, len(ids), limit, limit)
                ids = ids[:limit]
            sources.append(tags + ids + [eos] if ids or blank else [])
        return sources

    def _encode(self, lines: Sequence[str], line_offset: int) -> list[list[int]]:
        """`encode_sources` into the model's only target language (lines numbered from
        `line_offset` + 1)."""
        return self.encode_sources(lines, line_offset=line_offset)

    def _decode(self, ids: list[int]) -> str:
        """Detokenized text on one line (a generated newline byte must not split it)."""
        return self.tokenizers.tgt.decode(ids).replace("\r", " ").replace("\n", " ")


class Translator(BaseTranslator):
    """Our PyTorch engine: a model (or an `ensemble.Ensemble` of several), its tokenizers
    and its decoding defaults, ready to translate raw sentences.

    `decoding` defaults to those stored in the checkpoint by `transformer tune-decoding`
    (alpha and beam size chosen on validation data), else `DecodingSettings()`. `quantize`
    "int8" decodes with a copy of `model` whose linear layers are int8
    (`int8.quantize_int8`; CPU only, `check_quantize`); None keeps it float32.

    `threads`: the CPU threads its searches compute with; None: the process's count when the
    translator is made. Each search pins that count for its duration and restores the
    process's after it, so another engine in the same process (loading a CTranslate2 model
    sets the OpenMP thread count PyTorch shares to 1) does not change ours. Load and use it
    on one thread (`serve.model_thread`): two threads computing at several threads each make
    two pools of OpenMP threads, which on as many cores wake each other slowly.

    `workers`: search processes (`load(..., workers=N)`, `workers.SearchWorkers`), which
    then search every batch; None: this process does. `close` ends them.
    """

    engine: ClassVar[str] = "torch"
    workers: SearchWorkers | None = None
    run_id: str | None = None  # the training run of its checkpoint(s) (`load`), kept by the
    # checkpoints written from it (`transformer tune-decoding`, `prune-heads`)

    def __init__(self, model: Transformer | Ensemble, tokenizers: TokenizerPair,
                 device: str | torch.device = "cpu", *,
                 decoding: DecodingSettings = DecodingSettings(),
                 training_config: TrainConfig | None = None,
                 quantize: str | None = None, threads: int | None = None):
        super().__init__(tokenizers, decoding=decoding,
                         training_config=training_config)
        self.threads = threads or torch.get_num_threads()
        self.device = resolve_device(device)
        check_quantize(quantize, self.device)
        self.quantize = quantize
        self._num_parameters = model.num_parameters()  # int8 layers hold no parameters
        model = model.to(self.device).eval()
        self.model = model if quantize is None else quantize_int8(model)

    @property
    def model_config(self) -> ModelConfig:
        """The model's own config (it changes when heads are pruned); an ensemble's: its
        first member's, within the positions every member has."""
        return self.model.config

    @property
    def aligner(self) -> Transformer:
        """The model whose attention aligns and is shown: the model, or an ensemble's first
        member."""
        return members(self.model)[0]

    @property
    def num_parameters(self) -> int:
        """The float32 model's parameter count (also where its layers run in int8)."""
        return self._num_parameters

    @property
    def num_models(self) -> int:
        return len(members(self.model))

    @classmethod
    def load(cls, checkpoint: PathLike | Sequence[PathLike],
             device: str | torch.device = "auto", *,
             quantize: str | None = None, threads: int | None = None,
             ensemble: bool = False, workers: int = 0) -> Translator:
        """Load a checkpoint file or run directory; several are averaged: checkpoints of one
        training run (same model config, tokenizers and run id; others are refused,
        `checkpoint.average_weights`), with the first one's settings. With `ensemble`,
        several are decoded together instead (`ensemble.Ensemble`: any models sharing the
        tokenizers, e.g. trained with different seeds), with the first one's settings.
        `quantize="int8"`: the loaded (averaged) model's linear layers in int8, on the CPU
        (an ensemble's: every member's); `threads`: its CPU threads (see `Translator`).
        The loaded model decodes: its parameters are frozen (no gradients), which lets
        oneDNN keep the output projection's weight packed (`layers.linear`).
        `workers` > 0 (CPU only): that many search processes, each loading the checkpoints
        on one thread (a script that starts them runs under `if __name__ == "__main__":`).
        Raises CheckpointError or ConfigError with a one-line message."""
        resolved = resolve_device(device)  # the options checked before reading the checkpoint
        check_quantize(quantize, resolved)
        check_workers(workers, resolved)
        paths = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
        files = [resolve_checkpoint(p) for p in paths]
        if ensemble:
            translator = cls._load_ensemble(files, device, quantize=quantize, threads=threads)
        else:
            state = load_checkpoint(files[0]) if len(files) == 1 else average_weights(files)
            name = files[0] if len(files) == 1 else f"the average of {len(files)} checkpoints"
            tokenizers = tokenizers_from_state(state, name)
            model = model_from_checkpoint(state, name)
            check_tokenizers(model.config, tokenizers, name)
            translator = cls(model, tokenizers, device, decoding=stored_decoding(state, name),
                             training_config=stored_training_config(state, name),
                             quantize=quantize, threads=threads)
            translator.run_id = stored_run_id(state)
        translator.model.requires_grad_(False)  # its own model, for decoding only
        transpose_linear_weights(translator.model)  # (int8 layers: no Linears)
        if workers:
            translator.workers = SearchWorkers(functools.partial(
                cls.load, files, "cpu", quantize=quantize, threads=1, ensemble=ensemble),
                workers)
        return translator

    def close(self) -> None:
        """End the search processes (`workers`), if any: this process searches from now."""
        if self.workers is not None:
            self.workers.close()
            self.workers = None

    @classmethod
    def _load_ensemble(cls, files: list[os.PathLike], device: str | torch.device, *,
                       quantize: str | None, threads: int | None) -> Translator:
        """An ensemble of the checkpoints `files` (at least two, each tokenized as the first:
        `checkpoint.check_ensemble_member`), with the first one's tokenizers, decoding
        defaults and training config."""
        if len(files) < 2:
            raise CheckpointError(f"an ensemble needs at least two checkpoints, got "
                                  f"{len(files)}: {files[0]}")
        first = load_checkpoint(files[0])
        models = []
        for path in files:
            state = first if path is files[0] else load_checkpoint(path)
            check_ensemble_member(first, files[0], state, path)
            models.append(model_from_checkpoint(state, path))
        tokenizers = tokenizers_from_state(first, files[0])
        for model, path in zip(models, files, strict=True):
            check_tokenizers(model.config, tokenizers, path)
        return cls(Ensemble(models), tokenizers, device,
                   decoding=stored_decoding(first, files[0]),
                   training_config=stored_training_config(first, files[0]),
                   quantize=quantize, threads=threads)

    def _score(self, sources: list[list[int]], targets: list[list[int]], *,
               max_tokens: int) -> list[float]:
        model = self.model
        pairs = ParallelCorpus.from_ids([ids[:-1] for ids in sources], targets,
                                        self.tokenizers.tgt.specials,
                                        max(model.config.src_vocab_size,
                                            model.config.tgt_vocab_size))
        sizes = [max(len(s), len(t) + 1) for s, t in zip(sources, targets, strict=True)]
        log_probs = [0.0] * len(sources)
        with hardware.threads_set_to(self.threads):
            for batch in sorted_batches(range(len(sizes)), sizes, max_tokens):
                scores = sentence_log_probs(model, pairs.collate(batch).to(self.device))
                for i, value in zip(batch, scores.tolist(), strict=True):
                    log_probs[i] = value
        return log_probs

    def _search(self, sources: list[list[int]], request: DecodingRequest, *,
                prefixes: list[list[int]] | None,
                constraints: list[list[list[int]]] | None, max_tokens: int,
                on_progress: Callable[[int], None] | None) -> list[list[Hypothesis]]:
        with hardware.threads_set_to(self.threads):
            hyps = search_corpus(self.model, sources, request, prefixes=prefixes,
                                 constraints=constraints, max_tokens=max_tokens,
                                 on_progress=on_progress, workers=self.workers)
            if request.alignment is None:
                return hyps
            found = [(i, j) for i, sentence in enumerate(hyps) for j in range(len(sentence))
                     if sources[i]]
            weights = attention_weights(self.aligner, [sources[i] for i, _ in found],
                                        [hyps[i][j].tokens for i, j in found],
                                        request.alignment, max_tokens)
        for (i, j), attention in zip(found, weights, strict=True):
            hyps[i][j] = replace(hyps[i][j], attention=attention)
        return hyps
