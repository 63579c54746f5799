"""Decoding many sentences: `search_corpus`, the one path that translates a corpus
(training validation, the Translator, evaluation), and `decode_batches`, its batching and
threads, which the CTranslate2 engine shares.

Sentences are sorted longest first, packed into batches of at most `max_tokens` source tokens
and the tuning table's `decode_max_rows` rows (`batching.pack`: sentences x beam), searched
(`search.beam_search`, or `search.sample_search` for a request that samples) and returned in
input order, as one `request.DecodingRequest` asks. With `parallel` CPU threads,
`decode_batches` searches that many batches at once, one thread each, as CTranslate2's
`inter_threads` does (beam search's batches packed in full rounds of the threads:
`batching.even_rounds`): decoding runs many small operators, which gain little from being
split over threads (docs/benchmarks.md, "Two threads, and batches in full rounds of them").
With search processes (`workers.SearchWorkers`), each batch is searched in one of them, and
fewer batches than processes are cut into a piece for each (`batching.dealt`): Python's
threads share one interpreter lock, processes do not.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

import torch

from .. import hardware
from ..data.batching import dealt, even_rounds, sorted_batches
from ..model.ensemble import Ensemble
from ..model.transformer import Transformer
from .request import DecodingRequest
from .search import BatchJob, Hypothesis, search_batch
from .workers import SearchWorkers

__all__ = ["DEFAULT_MAX_TOKENS", "search_corpus", "decode_batches", "parallel_searches"]

DEFAULT_MAX_TOKENS = 8192  # source tokens per decoding batch, padding included, before the beam


def search_corpus(model: Transformer | Ensemble, sources: Sequence[Sequence[int]],
                  request: DecodingRequest = DecodingRequest(), *,
                  prefixes: Sequence[Sequence[int]] | None = None,
                  constraints: Sequence[Sequence[Sequence[int]]] | None = None,
                  max_tokens: int = DEFAULT_MAX_TOKENS,
                  on_progress: Callable[[int], None] | None = None,
                  workers: SearchWorkers | None = None) -> list[list[Hypothesis]]:
    """Beam search (or, with `request.sampling`, `sample_search`) over many sentences, in
    input order: the one decoding path of validation, translation and evaluation (batched
    by `decode_batches`, at most the tuning table's `decode_max_rows` rows, sentences x
    beam, a batch). `sources` are
    source ids with EOS appended; `prefixes`, target ids each output must begin with (one
    list per source, [] for none); `constraints`, the phrases (target ids) each output must
    contain (one list of phrases per source, [] for none; beam search only). `beam_size=1`
    is greedy search. `model` may be an `ensemble.Ensemble`. Sampling draws from one
    generator per batch, seeded with `sampling.seed` and the batch (`search.search_batch`).
    `workers`: search processes with their own copies of `model` (as loaded), which then
    search every batch, a piece of a batch each where there are fewer batches than them; a
    single sentence, which no process could share, is searched here."""
    if workers is not None and sum(1 for ids in sources if ids) < 2:
        workers = None

    def job(batch: list[int]) -> BatchJob:
        return BatchJob([list(sources[i]) for i in batch],
                        None if prefixes is None else [list(prefixes[i]) for i in batch],
                        None if constraints is None else [constraints[i] for i in batch],
                        batch[0])

    run = functools.partial(search_batch, model) if workers is None else workers.search

    def search(batch: list[int]) -> list[list[Hypothesis]]:
        return run(job(batch), request)

    return decode_batches(sources, search, nbest=request.nbest, max_tokens=max_tokens,
                          max_sentences=max(1, hardware.TUNING.decode_max_rows
                                            // request.beam_size),
                          parallel=(parallel_searches(model.device) if workers is None
                                    else workers.count),
                          balanced=request.sampling is None, deal=workers is not None,
                          on_progress=on_progress)


def parallel_searches(device: torch.device) -> int:
    """How many batches `search_corpus` searches at once on `device` where it has that
    many: one per CPU thread, each with single-threaded operators; one on a GPU."""
    return torch.get_num_threads() if device.type == "cpu" else 1


def decode_batches(sources: Sequence[Sequence[int]],
                   search: Callable[[list[int]], list[list[Hypothesis]]], *,
                   nbest: int = 1, max_tokens: int = DEFAULT_MAX_TOKENS,
                   max_sentences: int | None = None, parallel: int = 1,
                   balanced: bool = False, deal: bool = False,
                   on_progress: Callable[[int], None] | None = None
                   ) -> list[list[Hypothesis]]:
    """Run `search` (a batch, as indices into `sources` -> n-best lists) over many
    sentences and return the results in input order; shared by `search_corpus` and the
    CTranslate2 engine. An empty source gets `nbest` empty hypotheses without a search.
    Sentences are sorted longest first and packed into batches of at most `max_tokens`
    padded source tokens (before the beam expands them) and `max_sentences` sentences
    (`search_corpus`: `decode_max_rows` rows). `on_progress(n)` is called as sentences are
    done. `parallel` > 1 (CPU threads): when there are at least that many batches, that
    many batches are searched at once, each on its own thread with single-threaded
    operators. `balanced`: the batches packed again so that the threads end together
    (`batching.even_rounds`); they then depend on `parallel`, so sampling, whose draws
    depend on the batches and must not depend on the threads, leaves it off. `deal`
    (`search` runs in one of `parallel` search processes, which cost this process nothing
    while they search): a balanced plan of fewer batches than that cut into a piece for
    each (`batching.dealt`)."""
    results = [[Hypothesis([], 0.0, 0.0)] * nbest for _ in sources]
    todo = [i for i, ids in enumerate(sources) if ids]
    if on_progress is not None and len(todo) < len(sources):
        on_progress(len(sources) - len(todo))
    sizes = [len(ids) for ids in sources]
    batches = sorted_batches(todo, sizes, max_tokens, max_sentences)
    if balanced:
        batches = even_rounds(batches, sizes, max_tokens, parallel, max_sentences)
        if deal:
            batches = dealt(batches, parallel)
    for batch, found in _each_searched(batches, search, parallel):
        for i, sentence_hyps in zip(batch, found, strict=True):
            results[i] = sentence_hyps
        if on_progress is not None:
            on_progress(len(batch))
    return results


def _each_searched(batches: list[list[int]],
                   search: Callable[[list[int]], list[list[Hypothesis]]],
                   parallel: int) -> Iterator[tuple[list[int], list[list[Hypothesis]]]]:
    """(batch, its search results) for each batch, in order; `parallel` at a time."""
    if parallel <= 1 or len(batches) < parallel:
        yield from ((batch, search(batch)) for batch in batches)
        return

    def single_threaded(batch: list[int]) -> list[list[Hypothesis]]:
        hardware.set_threads(1)  # this worker thread's operators (OpenMP: per thread)
        return search(batch)

    with hardware.threads_restored(), \
            ThreadPoolExecutor(parallel, thread_name_prefix="search") as pool:
        yield from zip(batches, pool.map(single_threaded, batches), strict=True)
