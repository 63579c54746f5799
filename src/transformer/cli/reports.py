"""What `transformer translate` writes and reports: translations of a stream chunk by
chunk in input order (`translate_lines`), n-best lines (`format_nbest`), scores of given
translations (`score_lines`), sacrebleu's reports as its command line prints them
(`bleu_report`) and Multi30k's paper protocol (`paper_protocol`); the progress bar of the
commands that translate files (`progress_bar`). Any engine (`translator.BaseTranslator`)
works with them."""

from __future__ import annotations

import contextlib
import itertools
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import TextIO

from tqdm import tqdm
from tqdm.contrib.logging import logging_redirect_tqdm

from ..decoding.alignment import format_alignment
from ..decoding.corpus import DEFAULT_MAX_TOKENS
from ..decoding.request import DecodingRequest
from ..decoding.translator import BaseTranslator, Translation
from ..errors import DataError, require

__all__ = ["format_nbest", "format_output", "translate_lines", "score_lines", "bleu_report",
           "paper_protocol", "progress_bar"]


@contextlib.contextmanager
def progress_bar(total: int | None, *, initial: int = 0, unit: str = "sent",
                 disable: bool = False) -> Iterator[tqdm]:
    """A tqdm bar on stderr (items per second; `update(n)` as they are done), with log
    lines printed above it rather than through it."""
    with tqdm(total=total, initial=initial, unit=unit, disable=disable, file=sys.stderr,
              dynamic_ncols=True) as bar, logging_redirect_tqdm():
        yield bar


def format_nbest(line_number: int, translations: Sequence[Translation]) -> list[str]:
    """n-best output lines: LINE_NUMBER <tab> SCORE <tab> TRANSLATION [<tab> ALIGNMENT],
    best first."""
    return [f"{line_number}\t{t.score:.4f}\t{format_output(t)}" for t in translations]


def format_output(translation: Translation) -> str:
    """The translation, and after a tab its alignment ("0-0 1-2") where there is one."""
    if translation.alignment is None:
        return translation.text
    return f"{translation.text}\t{format_alignment(translation.alignment)}"


def translate_lines(translator: BaseTranslator, lines: Iterable[str], out: TextIO,
                    request: DecodingRequest, *, chunk_lines: int = 10_000,
                    prefixes: Sequence[str] | None = None,
                    constraints: Sequence[Sequence[str]] | None = None, keep: bool = False,
                    flush: bool = False, max_tokens: int = DEFAULT_MAX_TOKENS,
                    on_progress: Callable[[int], None] | None = None) -> list[str]:
    """Translate `lines` chunk by chunk (memory stays bounded), writing each chunk's
    translations to `out` in input order before reading the next chunk: one line per input
    line (`format_output`), or `request.nbest` lines in `format_nbest`'s format.
    `prefixes`, `constraints`: one per input line. Returns the best translations when
    `keep` (for scoring), else []."""
    kept: list[str] = []
    it = iter(lines)
    start = 0
    while chunk := list(itertools.islice(it, chunk_lines)):
        chunk_prefixes, chunk_constraints = (
            None if per_line is None else _chunk(per_line, name, start, len(chunk))
            for per_line, name in ((prefixes, "prefixes"), (constraints, "constraints")))
        results = translator.translations(chunk, request, prefixes=chunk_prefixes,
                                          constraints=chunk_constraints,
                                          max_tokens=max_tokens, line_offset=start,
                                          on_progress=on_progress)
        for number, hyps in enumerate(results, start + 1):
            rows = (format_nbest(number, hyps) if request.nbest > 1
                    else [format_output(hyps[0])])
            out.write("".join(row + "\n" for row in rows))
        if flush:
            out.flush()
        if keep:
            kept.extend(hyps[0].text for hyps in results)
        start += len(chunk)
    for per_line, name in ((prefixes, "prefixes"), (constraints, "constraint lines")):
        if per_line is not None and start != len(per_line):
            raise DataError(f"{len(per_line)} {name} for {start} input lines")
    return kept


def _chunk(per_line: Sequence, name: str, start: int, size: int) -> Sequence:
    """The entries of `per_line` (one per input line) for the chunk of `size` input lines
    from line `start`; `DataError` where they end before the input does."""
    if len(per_line) < start + size:
        raise DataError(f"the {name} end at line {len(per_line)}, but the input goes on")
    return per_line[start:start + size]


def score_lines(translator: BaseTranslator, sources: Sequence[str], targets: Sequence[str],
                out: TextIO, *, alpha: float, chunk_lines: int = 10_000,
                max_tokens: int = DEFAULT_MAX_TOKENS, target_lang: str | None = None,
                on_progress: Callable[[int], None] | None = None) -> None:
    """Forced decoding of each (source, translation) pair, chunk by chunk: one line per
    pair, LOG_PROB <tab> SCORE (`BaseTranslator.score`, into `target_lang`; SCORE is
    length-normalised by `alpha`, as the search ranks)."""
    for start in range(0, len(sources), chunk_lines):
        end = start + chunk_lines
        for hyp in translator.score(sources[start:end], targets[start:end], alpha=alpha,
                                    max_tokens=max_tokens, line_offset=start,
                                    target_lang=target_lang):
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
    sacremoses = require("sacremoses", extra="paper", feature="the paper protocol")
    normalizer = sacremoses.MosesPunctNormalizer(lang=lang)
    tokenizer = sacremoses.MosesTokenizer(lang=lang)
    return [tokenizer.tokenize(normalizer.normalize(line.lower()), return_str=True, escape=True)
            for line in lines]
