"""Translation engines: CTranslate2 running an exported model, and `load_translator`, which
loads either engine (ours, `translator.Translator`, or CTranslate2's) by name.

    translator = load_translator("runs/x", "torch")                 # a checkpoint or run dir
    translator = load_translator("runs/x/ct2-int8", "ctranslate2")  # transformer export's output
    translator = load_translator("runs/x", "torch", device="cpu", quantize="int8")  # ours, int8
    translator.translate(lines, beam_size=5)     # the same API and return values either way

Both are `translator.BaseTranslator`s: the same source encoding, batching
(`corpus.decode_batches`), n-best lists, blank-line handling, scores and the same
`request.DecodingRequest`, so `transformer translate`'s output and BLEU reports work with
either.

How the CTranslate2 engine matches `search.beam_search`:
- Greedy (beam 1) is the same argmax search; tokens agree except where float rounding
  flips a near tie (CTranslate2 fuses and reorders the matrix products).
- Both beam searches keep the beam full: the best 2 x beam candidates per step, EOS ones
  among the best `beam` finish, the others go on.
- Length normalisation: CTranslate2 normalises by `length ** length_penalty`, ours by GNMT's
  `((5 + length) / 6) ** alpha`. So CTranslate2 searches with `length_penalty=0` (both
  engines rank the candidates inside the beam by cumulative log-prob) and returns all
  `beam_size` finished hypotheses with their log-probs (EOS included, as ours); they are
  then ranked by our GNMT score (`search.length_penalty`, the length counting EOS), which is
  also the score returned. What still differs is when a sentence stops: CTranslate2 once its
  best candidate has ended and `beam_size` hypotheses have finished (it keeps the best
  `beam_size` by log-prob), ours at `beam_size` finished hypotheses, or earlier when no live
  one can beat the n-best (all of them ranked by GNMT score).
- Length limit: CTranslate2 takes one `max_decoding_length` per batch, so it gets the
  batch's largest `a * source_len + b`; each output is cut to its own sentence's limit and
  then scored with the EOS our search forces there (CTranslate2's `score_batch`). Greedy
  search and sampling give exactly our output so. In beam search the hypotheses that ran
  past their limit came from a beam ours never has (one parent's continuations become one
  output when cut): such a sentence is searched again with its own limit, where
  CTranslate2's last beam is the one ours ends with EOS (a weak model's runaway outputs on
  long inputs; rare otherwise).
- PAD and the start token (BOS; an imported Marian model's PAD) are never generated
  (suppressed), UNK may be, as ours.
- Modes: sampling through `sampling_topk`/`sampling_topp`/`sampling_temperature` (seeded by
  `ctranslate2.set_random_seed`, which CTranslate2 applies to a thread's generator at its
  first draw: a freshly loaded engine on one thread, as `transformer translate --engine
  ctranslate2 --threads 1` runs, repeats its draws for a seed; later calls continue the
  stream, and with several threads the draws depend on which thread takes which sub-batch.
  The draws differ from ours), prefixes
  through `target_prefix`, alignments through `return_attention` (the attention of the layer
  and heads the export chose: the last layer, averaged over all its heads), scores through
  `score_batch`.
- An export with a vocabulary map (`vocab_map.py`, `transformer export --vocab-map`) decodes
  over the candidates of the batch's source pieces only (CTranslate2's `use_vmap`): faster,
  but no longer our search over the whole vocabulary, and a sentence's output may depend on
  the sentences batched with it.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Union

import torch

from .. import hardware
from ..decoding.corpus import decode_batches
from ..decoding.request import DecodingRequest, RequestError
from ..decoding.search import Hypothesis, length_penalty, max_output_lengths
from ..decoding.translator import BaseTranslator, Translator
from ..errors import ConfigError, ExportError
from ..model.transformer import ModelConfig
from ..runtime import device_index, resolve_device
from .export import is_export, read_export, require_ctranslate2

__all__ = ["ENGINES", "CTranslate2Translator", "engine_for", "load_translator"]

PathLike = Union[str, "os.PathLike[str]"]
ENGINES = ("torch", "ctranslate2")


class CTranslate2Translator(BaseTranslator):
    """An exported model (`transformer export`) run by CTranslate2, with the tokenizers and
    decoding defaults stored beside it. Exports are bilingual (`export.check_exportable`):
    a request's `target_lang` is the export's target language or None, as
    `BaseTranslator.check` checks for every engine."""

    engine: ClassVar[str] = "ctranslate2"
    constrained_search: ClassVar[bool] = False  # CTranslate2 has none

    def __init__(self, directory: PathLike, *, device: str = "cpu",
                 threads: int | None = None):
        """`device`: "cpu", "cuda" or "auto"; `threads`: CPU threads, each decoding its own
        sub-batches of every batch (CTranslate2's `inter_threads`; None: one thread).
        Splitting each operation over threads instead (`intra_threads`) made a small model
        2.8x slower at 2 threads on our CPU, while parallel sub-batches made it 1.9x faster
        (docs/benchmarks.md, "Two threads, and batches in full rounds of them")."""
        ctranslate2 = require_ctranslate2()
        info, tokenizers = read_export(directory)
        super().__init__(tokenizers, decoding=info.decoding_settings(),
                         training_config=info.stored_training_config())
        self.directory = Path(directory)
        self.info = info
        self._model_config = info.model()
        self.device, index = _ct2_device(device)
        try:
            self.model = ctranslate2.Translator(str(directory), device=self.device,
                                                device_index=index, inter_threads=threads or 1,
                                                intra_threads=1 if threads else 0)
            self.parallel = threads or 1
        except (RuntimeError, ValueError) as e:
            raise ExportError(f"CTranslate2 cannot load {directory}: "
                              f"{str(e).splitlines()[0] if str(e) else e!r}") from e
        self._src_pieces = tokenizers.src.vocabulary()
        self._tgt_pieces = tokenizers.tgt.vocabulary()
        self._tgt_ids = {piece: i for i, piece in enumerate(self._tgt_pieces)}
        # as search._logits masks PAD and the start token
        self._never = [[tokenizers.tgt.id_to_piece(i)]
                       for i in tokenizers.tgt.specials.never_generated]

    @property
    def model_config(self) -> ModelConfig:
        return self._model_config

    @property
    def vocab_map(self) -> dict[str, Any] | None:
        """vmap.txt's counts (`ExportInfo.vocab_map`), or None: the whole vocabulary."""
        return self.info.vocab_map

    def check(self, request: DecodingRequest) -> None:
        """What CTranslate2 cannot do: decode without its cache, or align with another
        attention than the one chosen at export (the last decoder layer, averaged over its
        heads); and what no engine can (`BaseTranslator.check`: the target language too)."""
        super().check(request)
        if not request.use_cache:
            raise RequestError("use_cache", "{use_cache}=False exists only for the torch engine")
        alignment = request.alignment
        if alignment is not None and (alignment.head is not None or alignment.layer not in (
                -1, self.model_config.num_decoder_layers - 1)):
            raise RequestError("alignment_head" if alignment.head is not None
                               else "alignment_layer",
                               "the ctranslate2 engine aligns with the attention of the last "
                               "decoder layer, averaged over its heads (chosen at export); "
                               "{alignment_layer} and {alignment_head} need the torch engine")

    def _search(self, sources: list[list[int]], request: DecodingRequest, *,
                prefixes: list[list[int]] | None,
                constraints: list[list[list[int]]] | None, max_tokens: int,
                on_progress: Callable[[int], None] | None) -> list[list[Hypothesis]]:
        if request.sampling is not None:
            require_ctranslate2().set_random_seed(request.sampling.seed)
        return decode_batches(sources, lambda batch: self._search_batch(
                                  [sources[i] for i in batch], request,
                                  None if prefixes is None else [prefixes[i] for i in batch]),
                              nbest=request.nbest, max_tokens=max_tokens,
                              on_progress=on_progress)

    def _score(self, sources: list[list[int]], targets: list[list[int]], *,
               max_tokens: int) -> list[float]:
        """CTranslate2's `score_batch` (log-probs per token, EOS included), summed."""
        results = self.model.score_batch(
            [[self._src_pieces[i] for i in ids] for ids in sources],
            [[self._tgt_pieces[i] for i in ids] for ids in targets],
            max_batch_size=max_tokens, batch_type="tokens", max_input_length=0)
        return [float(sum(result.log_probs)) for result in results]

    def _search_batch(self, batch: Sequence[Sequence[int]], request: DecodingRequest,
                      prefixes: list[list[int]] | None = None) -> list[list[Hypothesis]]:
        """One `translate_batch` call; see the module docstring for how it matches ours."""
        sampling, attention = request.sampling, request.alignment is not None
        limits = max_output_lengths(torch.tensor([len(ids) for ids in batch]),
                                    request.max_len_a, request.max_len_b,
                                    self.model_config.max_positions).tolist()
        if prefixes is not None:  # as search._limits: room for the prefix at least
            limits = [max(limit, len(ids)) for limit, ids in zip(limits, prefixes, strict=True)]
        sources = [[self._src_pieces[i] for i in ids] for ids in batch]
        if sampling is None:
            search = dict(beam_size=request.beam_size, num_hypotheses=request.beam_size,
                          length_penalty=0.0)
        else:
            search = dict(beam_size=1, sampling_topk=sampling.topk,
                          sampling_topp=sampling.topp,
                          sampling_temperature=sampling.temperature)
        target_prefix = None if prefixes is None else [
            [self._tgt_pieces[i] for i in ids] or None for ids in prefixes]

        def translate(rows: list[int], max_length: int) -> list[Any]:
            """Start searching `rows` of the batch -> one future per row (`.result()`)."""
            return self.model.translate_batch(
                [sources[i] for i in rows], **search, return_scores=True,
                target_prefix=None if target_prefix is None else [target_prefix[i]
                                                                  for i in rows],
                return_attention=attention, max_input_length=0,
                max_batch_size=self._sub_batch_tokens([batch[i] for i in rows]),
                batch_type="tokens", max_decoding_length=max_length,
                suppress_sequences=self._never, use_vmap=self.vocab_map is not None,
                asynchronous=True)

        results = [future.result() for future in translate(list(range(len(batch))),
                                                           max(limits) + 1)]
        if sampling is None and request.beam_size > 1:
            self._search_again_at_own_limit(results, limits, translate)
        candidates = [[Hypothesis([self._tgt_ids[p] for p in pieces[:limit]], log_prob,
                                  log_prob, _attention(result, j) if attention else None)
                       for j, (pieces, log_prob) in enumerate(zip(result.hypotheses,
                                                                  result.scores, strict=True))]
                      for result, limit in zip(results, limits, strict=True)]
        self._rescore_cut(sources, candidates, limits)
        return [self._ranked(hyps, request.alpha, request.nbest) for hyps in candidates]

    @staticmethod
    def _search_again_at_own_limit(results: list[Any], limits: list[int],
                                   translate: Callable[[list[int], int], list[Any]]) -> None:
        """Search again, with its own length limit, each sentence of which a hypothesis ran
        past that limit (it had the batch's longest): cut to the limit, several such
        hypotheses would be one, and the beam would be the wrong one. At its own limit
        CTranslate2 ends with the beam ours forces EOS onto (`_rescore_cut` adds the EOS).
        Sentences of one limit share a call, the calls run at once (one per thread); long
        limits are rarely reached."""
        past: dict[int, list[int]] = {}
        for i, (result, limit) in enumerate(zip(results, limits, strict=True)):
            if any(len(pieces) > limit for pieces in result.hypotheses):
                past.setdefault(limit, []).append(i)
        started = [(rows, translate(rows, limit)) for limit, rows in past.items()]
        for rows, futures in started:
            for i, future in zip(rows, futures, strict=True):
                results[i] = future.result()

    def _sub_batch_tokens(self, batch: Sequence[Sequence[int]]) -> int:
        """CTranslate2 splits each batch into sub-batches of at most this many (padded)
        source tokens, which its threads take in turn: several per batch, so that the
        threads share the work evenly, and at least one per thread."""
        padded = len(batch) * max(len(ids) for ids in batch)
        tuning = hardware.TUNING  # source tokens per sub-batch
        limit = (tuning.ct2_mapped_sub_batch_tokens if self.vocab_map
                 else tuning.ct2_sub_batch_tokens)
        return max(1, min(limit, math.ceil(padded / self.parallel)))

    def _rescore_cut(self, sources: list[list[str]], candidates: list[list[Hypothesis]],
                     limits: list[int]) -> None:
        """Hypotheses cut to their sentence's length limit get the log-prob of the cut
        output plus EOS, as our search scores the EOS it forces at the limit (rare: the
        model has to run on past the limit)."""
        cut = [(i, j) for i, hyps in enumerate(candidates) for j, hyp in enumerate(hyps)
               if len(hyp.tokens) == limits[i]]
        if not cut:
            return
        scored = self.model.score_batch(
            [sources[i] for i, _ in cut],
            [[self._tgt_pieces[t] for t in candidates[i][j].tokens] for i, j in cut],
            max_input_length=0)
        # log_probs: one per token, EOS included
        for (i, j), result in zip(cut, scored, strict=True):
            candidates[i][j] = replace(candidates[i][j], log_prob=float(sum(result.log_probs)))

    @staticmethod
    def _ranked(candidates: list[Hypothesis], alpha: float, nbest: int) -> list[Hypothesis]:
        """Finished hypotheses with their GNMT scores, best first."""
        hyps = [replace(h, score=h.log_prob / length_penalty(len(h.tokens) + 1, alpha))
                for h in candidates]
        hyps.sort(key=lambda h: -h.score)
        return hyps[:nbest]


def _attention(result: Any, j: int) -> torch.Tensor:
    """Hypothesis j's attention (output tokens, source tokens) from a TranslationResult."""
    return torch.tensor(result.attention[j], dtype=torch.float32)


def _ct2_device(device: str | torch.device) -> tuple[str, int]:
    """"auto", "cpu", "cuda", "cuda:1" (`runtime.resolve_device`) -> CTranslate2's (device,
    device_index)."""
    resolved = resolve_device(device)
    if resolved.type not in ("cpu", "cuda"):
        raise ConfigError(f"--device {device}: the ctranslate2 engine runs on cpu or cuda[:N]")
    return resolved.type, device_index(resolved)


def engine_for(checkpoint: PathLike | Sequence[PathLike]) -> str:
    """The engine "auto" picks: "ctranslate2" for one export directory (`transformer
    export`'s: the faster engine on a CPU), "torch" for checkpoints and run directories."""
    paths = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
    return "ctranslate2" if len(paths) == 1 and is_export(paths[0]) else "torch"


def load_translator(checkpoint: PathLike | Sequence[PathLike], engine: str = "auto", *,
                    device: str | torch.device = "auto", threads: int | None = None,
                    quantize: str | None = None, ensemble: bool = False,
                    workers: int = 0) -> BaseTranslator:
    """A translator for `engine`: "torch" loads a checkpoint file or run directory (several
    are averaged, or with `ensemble` decoded together) into `Translator` (with `quantize`,
    its linear layers in int8: `Translator.load`); "ctranslate2" loads an export directory,
    whose type its export chose (`quantize` and `ensemble` refused); "auto" (the default)
    takes the one that reads `checkpoint` (`engine_for`). `threads` sets the engine's CPU
    threads, its own (None: for torch, the process's count now; for CTranslate2, one);
    `workers`, torch's search processes (`Translator.load`; CTranslate2's threads search
    sub-batches side by side already).
    Raises CheckpointError / ExportError / ConfigError with one-line messages."""
    if engine == "auto":
        engine = engine_for(checkpoint)
    if engine == "torch":
        return Translator.load(checkpoint, device=device, quantize=quantize, threads=threads,
                               ensemble=ensemble, workers=workers)
    if engine != "ctranslate2":
        raise ConfigError(f"engine must be auto, {', '.join(ENGINES)}, got {engine!r}")
    if quantize is not None:
        raise RequestError("quantize", "{quantize} is our engine's (torch): CTranslate2 "
                                       "chooses its type at export (transformer export "
                                       "--quantization int8); leave {quantize} out for an "
                                       "export directory or {engine} ctranslate2")
    if workers:
        raise RequestError("workers", "{workers} starts our engine's (torch) search processes: "
                                      "CTranslate2's {threads} search its sub-batches side "
                                      "by side already; leave {workers} out")
    if ensemble:
        raise ExportError("the ctranslate2 engine does not decode ensembles (CTranslate2 has "
                          "no ensemble decoding): use the torch engine's --ensemble with the "
                          "members' checkpoints")
    paths = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
    if len(paths) != 1:
        raise ExportError("the ctranslate2 engine reads one export directory; average "
                          "checkpoints before exporting (transformer export takes several)")
    return CTranslate2Translator(paths[0], device=str(device), threads=threads)

