"""A decoding request: every option of one translation call, in one typed object, checked once.

    request = DecodingRequest(beam_size=5, nbest=3)
    request = translator.request(nbest=3)             # over the checkpoint's chosen defaults
    translator.translations(lines, request)
    search_corpus(model, sources, replace(request, beam_size=1))   # training validation

As fairseq's `GenerationConfig` and JoeyNMT's `TestConfig`, one frozen object carries the
search (beam, n-best, length penalty, length limits), sampling, alignments, the target
language and the cache switch from the command line or the server down to the search;
nothing below re-checks it. Its checks raise `RequestError`, a `ConfigError` that names the
field as the server's JSON does ("nbest") and renders other names on demand (`transformer
translate` says "--nbest"). What depends on the model (an alignment layer or head that
exists, a target language it was trained for) is checked by `BaseTranslator.check`, and
what an engine cannot do, by that engine's `check`.

`target_lang` names the language to translate into: a multilingual model's choice (its
sources then carry that language's tag), a bilingual model's own language or None.

The defaults a checkpoint stores (`config.DecodingSettings`: beam, alpha, length limits,
chosen by `transformer tune-decoding`) are where a translator's requests start
(`DecodingRequest.over`).

Our engine's load options are checked here too, as `RequestError`s the commands render as
`--quantize` and `--workers`: `check_quantize`, `check_workers`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any

from ..errors import ConfigError
from ..run.config import DecodingSettings
from ..run.data_config import NAME

if TYPE_CHECKING:
    import torch

__all__ = ["MAX_BEAM_SIZE", "OPTIONS", "RequestError", "Sampling", "AlignmentOptions",
           "DecodingRequest", "option_name", "literal", "QUANTIZE", "check_quantize",
           "MAX_WORKERS", "check_workers"]

MAX_BEAM_SIZE = 1024  # hypotheses per sentence: far beyond use, within what memory holds
# The flat options of `DecodingRequest.from_options`: `transformer translate`'s decoding
# options (`--max-len-a`) and the server's JSON fields under these names.
OPTIONS = ("beam_size", "nbest", "alpha", "max_len_a", "max_len_b", "sampling_topk",
           "sampling_topp", "temperature", "seed", "alignment", "alignment_layer",
           "alignment_head", "target_lang", "ordered_constraints")


class RequestError(ConfigError):
    """A decoding option out of range, or options that do not go together (also our
    engine's `quantize` and `workers`, which the commands share as `--quantize` and
    `--workers`). `field` is the
    option's name as the server's JSON spells it; the message names options as
    "{field}" placeholders, rendered by `message(name)`: `str(error)` uses the field names,
    the command line its options (`option_name`)."""

    def __init__(self, field: str, template: str):
        self.field, self.template = field, template
        super().__init__(self.message(str))

    def message(self, name: Callable[[str], str]) -> str:
        """The message with every option named by `name(field)`."""
        return self.template.format_map(_Names(name))


class _Names(dict):
    def __init__(self, name: Callable[[str], str]):
        super().__init__()
        self.name = name

    def __missing__(self, key: str) -> str:
        return self.name(key)


def option_name(field: str) -> str:
    """The command-line option of a request field: "sampling_topk" -> "--sampling-topk"."""
    return "--" + field.replace("_", "-")


def _need(condition: bool, field: str, template: str) -> None:
    if not condition:
        raise RequestError(field, template)


def literal(value: Any) -> str:
    """`value` as a `RequestError` template shows it: its repr, cut to 40 characters, braces
    doubled (a template names options in braces)."""
    text = repr(value)
    text = text if len(text) <= 40 else text[:37] + "..."
    return text.replace("{", "{{").replace("}", "}}")


def _check_types(obj: Any, names: dict[str, str]) -> None:
    """Each dataclass field of `obj` has its declared type (an int for a float is fine; a
    bool is not a number); `names` maps attributes to the fields errors name."""
    kinds = {"int": (int,), "float": (int, float), "bool": (bool,)}
    for f in fields(obj):
        value = getattr(obj, f.name)
        base = str(f.type).split(" | ")[0]
        if base not in kinds or (value is None and "None" in str(f.type)):
            continue
        ok = isinstance(value, kinds[base]) and (base == "bool" or not isinstance(value, bool))
        _need(ok and (base == "bool" or math.isfinite(value)), names.get(f.name, f.name),
              f"{{{names.get(f.name, f.name)}}} must be a finite {base}, got {value!r}")


@dataclass(frozen=True)
class Sampling:
    """Random sampling instead of beam search (back-translation): each step draws the next
    token from the model's distribution at `temperature`, among the `topk` most likely
    tokens (0: no limit) and within the smallest set of most likely tokens whose probability
    reaches `topp` (1.0: no limit). `topk=1` is greedy search. `seed` fixes the draws (for
    the same sentences, batched the same way)."""

    topk: int = 0
    topp: float = 1.0
    temperature: float = 1.0
    seed: int = 0

    FIELDS = {"topk": "sampling_topk", "topp": "sampling_topp"}  # the request's names

    def __post_init__(self) -> None:
        _check_types(self, self.FIELDS)
        _need(self.topk >= 0, "sampling_topk",
              f"{{sampling_topk}} must be >= 0 (0: no limit), got {self.topk}")
        _need(0 < self.topp <= 1, "sampling_topp",
              f"{{sampling_topp}} must be in (0, 1], got {self.topp}")
        _need(self.temperature > 0, "temperature",
              f"{{temperature}} must be > 0 (greedy search: {{beam_size}} 1), "
              f"got {self.temperature}")
        _need(0 <= self.seed < 2 ** 32, "seed", f"{{seed}} must be in [0, 2**32), got {self.seed}")


@dataclass(frozen=True)
class AlignmentOptions:
    """Which encoder-decoder attention aligns: a decoder layer (from 0; negative counts
    from the last) and one head (its original index) or None, the average over heads."""

    layer: int = -1
    head: int | None = None

    FIELDS = {"layer": "alignment_layer", "head": "alignment_head"}

    def __post_init__(self) -> None:
        _check_types(self, self.FIELDS)

    def check(self, num_layers: int, head_ids: list[int]) -> None:
        """RequestError naming the option when the model has no such layer, or no such head
        in that layer (`head_ids`: its heads' original indices, pruned ones left out)."""
        _need(-num_layers <= self.layer < num_layers, "alignment_layer",
              f"{{alignment_layer}} must be in [{-num_layers}, {num_layers}) for this model's "
              f"{num_layers} decoder layers, got {self.layer}")
        _need(self.head is None or self.head in head_ids, "alignment_head",
              f"{{alignment_head}} {self.head} is not a head of decoder layer "
              f"{self.layer % num_layers} (heads {list(head_ids)})")


@dataclass(frozen=True)
class DecodingRequest:
    """How to decode one call's sentences.

    Beam search keeps `beam_size` hypotheses and returns the `nbest` best (GNMT length
    penalty `alpha`); outputs have at most `max_len_a` * source length + `max_len_b`
    tokens. `sampling` draws one translation per line instead (then `beam_size` and `nbest`
    are 1). `alignment` also aligns each translation's words to the source's.
    `use_cache=False` re-runs the decoder over the whole prefix at each step (our PyTorch
    engine only; slow; the reference for tests and benchmarks). `target_lang`: the language
    to translate into (None: the model's only one); which ones a model takes is checked by
    `BaseTranslator.check`. `ordered_constraints`: a line's constraints (the phrases its
    translation must contain, `constraints.ConstraintState`) must appear in their given
    order; False: in any order."""

    beam_size: int = DecodingSettings.beam_size
    nbest: int = 1
    alpha: float = DecodingSettings.alpha
    max_len_a: float = DecodingSettings.max_len_a
    max_len_b: int = DecodingSettings.max_len_b
    sampling: Sampling | None = None
    alignment: AlignmentOptions | None = None
    use_cache: bool = True
    target_lang: str | None = None
    ordered_constraints: bool = False

    def __post_init__(self) -> None:
        _check_types(self, {})
        _need(1 <= self.beam_size <= MAX_BEAM_SIZE, "beam_size",
              f"{{beam_size}} must be in [1, {MAX_BEAM_SIZE}], got {self.beam_size}")
        _need(self.nbest >= 1, "nbest", f"{{nbest}} must be >= 1, got {self.nbest}")
        _need(self.alpha >= 0, "alpha", f"{{alpha}} must be >= 0, got {self.alpha}")
        _need(self.max_len_a >= 0, "max_len_a", f"{{max_len_a}} must be >= 0, got {self.max_len_a}")
        _need(self.max_len_b >= 1, "max_len_b", f"{{max_len_b}} must be >= 1, got {self.max_len_b}")
        _need(self.sampling is None or isinstance(self.sampling, Sampling), "sampling",
              f"sampling must be a Sampling or None, got {self.sampling!r}")
        _need(self.alignment is None or isinstance(self.alignment, AlignmentOptions),
              "alignment", f"alignment must be AlignmentOptions or None, got {self.alignment!r}")
        _need(self.target_lang is None or (isinstance(self.target_lang, str)
                                           and NAME.fullmatch(self.target_lang) is not None),
              "target_lang", f"{{target_lang}} must be a language such as de (letters, digits, "
                             f"'_', '-', '.'), got {literal(self.target_lang)}")
        if self.sampling is not None:
            _need(self.beam_size == 1, "beam_size",
                  f"sampling draws one translation per line: it excludes {{beam_size}} "
                  f"{self.beam_size}")
            _need(self.nbest == 1, "nbest",
                  f"sampling draws one translation per line: it excludes {{nbest}} {self.nbest}")
        _need(self.nbest <= self.beam_size, "nbest",
              f"{{nbest}} {self.nbest} must be at most the beam size {self.beam_size}")

    @classmethod
    def over(cls, defaults: DecodingSettings, *, beam_size: int | None = None,
             alpha: float | None = None, max_len_a: float | None = None,
             max_len_b: int | None = None, **options: Any) -> DecodingRequest:
        """A request starting from stored `defaults`: the search options left at None keep
        the default (sampling's beam is 1 unless given); `options` are the other fields
        (None: their default)."""
        options = {name: value for name, value in options.items() if value is not None}
        if beam_size is None:
            beam_size = 1 if options.get("sampling") is not None else defaults.beam_size
        return cls(beam_size=beam_size,
                   alpha=defaults.alpha if alpha is None else alpha,
                   max_len_a=defaults.max_len_a if max_len_a is None else max_len_a,
                   max_len_b=defaults.max_len_b if max_len_b is None else max_len_b, **options)

    @classmethod
    def from_options(cls, defaults: DecodingSettings, *, beam_size: int | None = None,
                     nbest: int = 1, alpha: float | None = None,
                     max_len_a: float | None = None, max_len_b: int | None = None,
                     sampling_topk: int | None = None, sampling_topp: float | None = None,
                     temperature: float | None = None, seed: int | None = None,
                     alignment: bool = False, alignment_layer: int | None = None,
                     alignment_head: int | None = None,
                     target_lang: str | None = None,
                     ordered_constraints: bool = False) -> DecodingRequest:
        """A request from the flat options of `transformer translate` and the server's JSON
        (None: not given): any sampling option asks for sampling (the others at their
        defaults), `alignment` for alignments (of `alignment_layer`, `alignment_head`),
        `target_lang` the language to translate into, `ordered_constraints` constraints
        in their order."""
        given = [name for name, value in (("sampling_topk", sampling_topk),
                                          ("sampling_topp", sampling_topp),
                                          ("temperature", temperature)) if value is not None]
        _need(seed is None or bool(given), "seed",
              "{seed} seeds sampling: give {sampling_topk}, {sampling_topp} or {temperature} "
              "too")
        _need(alignment or (alignment_layer is None and alignment_head is None),
              "alignment_layer" if alignment_layer is not None else "alignment_head",
              "{alignment_layer} and {alignment_head} need {alignment}")
        sampling = None if not given else Sampling(
            topk=0 if sampling_topk is None else sampling_topk,
            topp=1.0 if sampling_topp is None else sampling_topp,
            temperature=1.0 if temperature is None else temperature,
            seed=0 if seed is None else seed)
        aligned = None if not alignment else AlignmentOptions(
            -1 if alignment_layer is None else alignment_layer, alignment_head)
        return cls.over(defaults, beam_size=beam_size, nbest=nbest, alpha=alpha,
                        max_len_a=max_len_a, max_len_b=max_len_b, sampling=sampling,
                        alignment=aligned, target_lang=target_lang,
                        ordered_constraints=ordered_constraints)


QUANTIZE = ("int8",)  # what `Translator`'s `quantize` may be, besides None (float32)


def check_quantize(quantize: str | None, device: torch.device) -> None:
    """`RequestError` naming quantize (`--quantize` on the command line) unless `quantize`
    is None, or one of QUANTIZE on the CPU: PyTorch's dynamically quantized layers
    (`int8.quantize_int8`) have CPU kernels only."""
    if quantize is None:
        return
    if quantize not in QUANTIZE:
        choices = ", ".join(repr(choice) for choice in QUANTIZE)
        raise RequestError("quantize", f"{{quantize}} must be None (float32) or {choices}, "
                                       f"got {literal(quantize)}")
    if device.type != "cpu":
        raise RequestError("quantize", f"{{quantize}} {quantize} is a CPU path (PyTorch's "
                                       f"dynamically quantized layers run on the CPU only), "
                                       f"not for {device}: choose {{device}} cpu")


MAX_WORKERS = 256  # search processes: beyond any machine's cores


def check_workers(workers: int, device: torch.device) -> None:
    """`RequestError` naming workers (`--workers` on the command line) unless `workers` is
    0 (searches in this process), or 1 to MAX_WORKERS search processes on the CPU (each
    searches on one CPU thread; a GPU searches a batch with all its cores already)."""
    if isinstance(workers, bool) or not isinstance(workers, int) or not (
            0 <= workers <= MAX_WORKERS):
        raise RequestError("workers", f"{{workers}} must be an integer in [0, {MAX_WORKERS}] "
                                      f"(0: searches in this process), got {literal(workers)}")
    if workers and device.type != "cpu":
        raise RequestError("workers", f"{{workers}} starts search processes of one CPU thread "
                                      f"each, not for {device}: choose {{device}} cpu, or "
                                      f"leave {{workers}} out")
