"""Decoding a batch of sentences: beam search and sampling over the model's key/value cache.
Many sentences are decoded by `corpus.search_corpus`, which batches them and calls these.

Each step feeds only the newest token to the decoder (`step.DecoderState`): its
self-attention keys/values grow in a cache sized for the whole search (`cache.StepCache`),
and the encoder-decoder keys/values are projected once per sentence and shared by its
beams. A request's `use_cache=False` re-runs the decoder over the whole prefix instead (the
reference for tests and benchmarks).

Conventions shared by both searches:
- The output of a sentence is at most `max_len = a * source_len + b` tokens, EOS not counted
  (`max_output_lengths`), and at least its prefix; at the limit EOS is forced.
- Decoding starts from the model's `start_id` (BOS; Marian models: PAD) and ends with its
  `eos_id`; PAD and the start token are never generated (their logits are masked); UNK may
  be. A target prefix forces each output's first tokens (their log-probs count).
- A finished hypothesis of `n` output tokens plus EOS has the GNMT length-normalised score
  `log_prob / lp(n + 1)`, `lp(L) = ((5 + L) / 6) ** alpha`: L counts the EOS token.

Beam search, in short (rows = sentences x beam, scores = cumulative log-probs), as fairseq
and CTranslate2 search:
- Step 0 decodes one row per sentence and its best tokens start the beam, so no hypothesis
  appears twice.
- Each step takes the best 2 * beam candidates over beam x vocab per sentence (each row's
  log-probs computed in place, then one top-k; an int8 output projection's logits a chunk
  of whole sentences at a time, `int8.rows_per_call`). Candidates ending in EOS among the best
  `beam` become finished hypotheses; the best `beam` others go on, so the beam stays full
  (with `beam_size=1` this is exactly greedy search, whatever alpha).
- A sentence stops when it has `beam` finished hypotheses and, at some step, its best
  candidate was EOS (CTranslate2's and OpenNMT-py's rule: as long as the most likely
  continuation goes on, a longer output may still win), or earlier when the best alive one
  cannot beat its `nbest`-th finished one: log-probs only decrease and, for alpha >= 0,
  `lp` only grows with length, so an alive hypothesis with cumulative log-prob `s` can at
  best reach `s / lp(max_len + 1)`. All finished hypotheses are ranked by their GNMT score.
- Finished sentences leave the batch (their rows are dropped from the caches).

Sampling (`request.Sampling`, `sample_search`) draws each token instead (back-translation);
top-k 1 is greedy search.

Both search with one model or an `ensemble.Ensemble` alike (`_Decoder`): each member reads
the batch with its own encoder outputs and step, and the search normalizes the mean of
their logits as one model's. Beam search with constraints (phrases each output must
contain) picks its 2k candidates by dynamic beam allocation (`constraints.ConstraintState`)
instead of by score alone.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import Tensor
from torch.nn import functional as F

from .. import hardware
from ..data.batching import pad_rows
from ..model.ensemble import Ensemble, mean_logits, members
from ..model.int8 import rows_per_call
from ..model.step import DecoderState
from ..model.transformer import Transformer, eval_mode
from ..run.config import DecodingSettings
from .constraints import ConstraintState
from .request import DecodingRequest, Sampling

__all__ = ["DEFAULT_ALPHA", "Hypothesis", "GREEDY", "draw", "length_penalty",
           "max_output_lengths", "sample_search", "beam_search", "pad_prefixes", "BatchJob",
           "search_batch"]

DEFAULT_ALPHA = DecodingSettings.alpha


@dataclass(frozen=True)
class Hypothesis:
    """One finished translation: output ids (no BOS/EOS) and its scores."""

    tokens: list[int]
    score: float  # log_prob / length_penalty(len(tokens) + 1, alpha), used for ranking
    log_prob: float  # sum of the token log-probs, EOS included
    # encoder-decoder attention (tokens, source + EOS), where an engine was asked for it
    attention: Tensor | None = field(default=None, compare=False, repr=False)
    # False: a constrained search's output that does not contain all its phrases (none did
    # within the length limit)
    constraints_met: bool = True


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT's length penalty ((5 + length) / 6) ** alpha; `length` counts EOS."""
    return ((5 + length) / 6) ** alpha


def max_output_lengths(src_valid_lens: Tensor, max_len_a: float, max_len_b: int,
                       max_positions: int) -> Tensor:
    """The most output tokens (EOS not counted) per sentence: a * source_len + b, within
    the model's limit (BOS + output must fit in `max_positions`; a and b of any size)."""
    lengths = ((src_valid_lens.float() * max_len_a).clamp(max=max_positions).long()
               + min(max_len_b, max_positions))
    return lengths.clamp(min=1, max=max_positions - 1)


def _logits(model: Transformer, hidden: Tensor) -> Tensor:
    """Float logits of the next token from decoder states (rows, d) -> (rows, vocab), PAD
    and the start token at -inf (never generated)."""
    c = model.config
    logits = model.output_projection(hidden).float()
    logits[:, c.pad_id] = float("-inf")  # a fresh tensor: in place
    logits[:, c.start_id] = float("-inf")
    return logits


class _Decoder:
    """A search's models over its batch: each one's encoder outputs and decoder step
    (`step.DecoderState`, or without `use_cache` the decoder re-reading the whole prefix),
    and the next-token logits; an ensemble's are the mean of its members'
    (`ensemble.mean_logits`: the search normalizes them as one model's).

    Made when a search starts, in eval mode, for at most `max_rows` rows and the steps
    `max_lens` allow; `release` (when the search ends) gives the step's buffers to
    `cache.CACHE_BUFFERS` for the next search."""

    def __init__(self, model: Transformer | Ensemble, src: Tensor, src_valid_lens: Tensor,
                 max_rows: int, max_lens: Tensor, use_cache: bool):
        self.models = members(model)
        self.src_valid_lens = src_valid_lens
        self.enc_outputs = [m.encode(src, src_valid_lens) for m in self.models]
        max_steps = int(max_lens.max()) + 1
        self.states = [DecoderState(m.decoder, enc, src_valid_lens, max_rows, max_steps)
                       if use_cache else None
                       for m, enc in zip(self.models, self.enc_outputs, strict=True)]
        chunks = [rows_per_call(m.output_projection) for m in self.models]
        # rows the output projections take at a time (int8 layers), None: any number
        self.rows_per_call = None if None in chunks else min(chunks)

    def hidden(self, tokens: Tensor) -> list[Tensor]:
        """Each model's decoder state after each row of `tokens` (rows, steps) -> (rows,
        d), the output projection's input. With the step, only the last token is fed;
        without, the decoder re-reads the whole prefix."""
        return [state(tokens[:, -1]) if state is not None
                else m.decoder(tokens, enc, self.src_valid_lens)[:, -1]
                for m, enc, state in zip(self.models, self.enc_outputs, self.states,
                                         strict=True)]

    def logits(self, hidden: list[Tensor], rows: slice = slice(None)) -> Tensor:
        """The next-token logits of the rows `rows` of `hidden` -> (rows, vocab), float, a
        fresh tensor; an ensemble's: the mean of its members' (`ensemble.mean_logits`)."""
        return mean_logits([_logits(m, h[rows])
                            for m, h in zip(self.models, hidden, strict=True)])

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep the decoder rows `rows` (in their new order), and where given the sentences
        `sentences` (one row per sentence: the encoder outputs)."""
        for state in self.states:
            if state is not None:
                state.reorder(rows, sentences)
        if sentences is not None and None in self.states:  # the decoder re-reads them
            self.enc_outputs = [enc.index_select(0, sentences) for enc in self.enc_outputs]
            self.src_valid_lens = self.src_valid_lens.index_select(0, sentences)

    def release(self) -> None:
        """Give the steps' buffers back for the next search."""
        for state in self.states:
            if state is not None:
                state.release()


@contextlib.contextmanager
def _decoding(model: Transformer | Ensemble, src: Tensor, src_valid_lens: Tensor,
              max_rows: int, max_lens: Tensor, use_cache: bool) -> Iterator[_Decoder]:
    """A search's `_Decoder`, in eval mode; its buffers released when the search ends,
    exceptions included."""
    with eval_mode(model):
        decoder = _Decoder(model, src, src_valid_lens, max_rows, max_lens, use_cache)
        try:
            yield decoder
        finally:
            decoder.release()


def draw(sampling: Sampling, logits: Tensor, generator: torch.Generator | None) -> Tensor:
    """One token per row of logits (rows, vocab) -> (rows,), drawn as `sampling` says, by
    inverse transform sampling over the candidates: one uniform number per row
    (`torch.multinomial` draws one per row and token)."""
    if sampling.topk == 1:
        return logits.argmax(-1)
    if sampling.topk > 0:  # the k most likely tokens, most likely first
        values, tokens = logits.topk(min(sampling.topk, logits.shape[1]), dim=-1)
    elif sampling.topp < 1:
        values, tokens = logits.sort(-1, descending=True)
    else:
        values, tokens = logits, None
    values = values / sampling.temperature
    if sampling.topp < 1:  # out: candidates after the first whose cumulative probability >= p
        probs = values.softmax(-1)
        values = values.masked_fill(probs.cumsum(-1) - probs >= sampling.topp, float("-inf"))
    cdf = values.softmax(-1).cumsum(-1)  # (rows, candidates)
    u = torch.rand(len(cdf), 1, generator=generator, device=cdf.device) * cdf[:, -1:]
    choice = torch.searchsorted(cdf, u, right=True).clamp(max=cdf.shape[1] - 1)  # (rows, 1)
    return (choice if tokens is None else tokens.gather(1, choice)).squeeze(1)


GREEDY = Sampling(topk=1)


@torch.inference_mode()
def sample_search(model: Transformer | Ensemble, src: Tensor, src_valid_lens: Tensor,
                  request: DecodingRequest = DecodingRequest(beam_size=1), *,
                  generator: torch.Generator | None = None,
                  prefix: Tensor | None = None) -> list[Hypothesis]:
    """Translate a batch one token at a time, each drawn by `request.sampling` (None: the
    most likely one, greedy search) -> one hypothesis per sentence. Its log-prob is the
    model's, whatever the temperature. `prefix` (batch, longest) holds tokens each output
    must begin with, -1 after a sentence's own (see `pad_prefixes`)."""
    sampling, alpha = request.sampling or GREEDY, request.alpha
    start, eos = model.config.start_id, model.config.eos_id
    max_lens, prefix, prefix_lens = _limits(model, src_valid_lens, request, prefix)
    outputs: list[Hypothesis] = [Hypothesis([], 0.0, 0.0)] * src.shape[0]
    forcing = _forcing_steps(max_lens, prefix_lens)
    with _decoding(model, src, src_valid_lens, src.shape[0], max_lens,
                   request.use_cache) as decoder:
        tokens = torch.full((src.shape[0], 1), start, dtype=torch.long, device=src.device)
        log_probs = torch.zeros(src.shape[0], device=src.device)
        sentence = torch.arange(src.shape[0], device=src.device)  # original index of each row
        for step in range(int(max_lens.max()) + 1):
            logits = decoder.logits(decoder.hidden(tokens))
            next_tokens = draw(sampling, logits, generator)
            if step in forcing:
                forced = _forced(step, max_lens, prefix, prefix_lens, eos)  # (rows,)
                next_tokens = torch.where(forced >= 0, forced, next_tokens)
            log_probs += torch.log_softmax(logits, -1, out=logits).gather(
                1, next_tokens[:, None]).squeeze(1)  # in place, as beam search
            tokens = torch.cat([tokens, next_tokens[:, None]], 1)  # (rows, 2 + step)
            done = next_tokens == eos
            if not bool(done.any()):
                continue
            for row in done.nonzero().squeeze(1).tolist():
                log_prob = float(log_probs[row])
                outputs[int(sentence[row])] = Hypothesis(
                    tokens[row, 1:-1].tolist(), log_prob / length_penalty(step + 1, alpha),
                    log_prob)
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            tokens, max_lens, sentence, log_probs, prefix, prefix_lens = (
                x.index_select(0, keep) for x in (tokens, max_lens, sentence, log_probs,
                                                  prefix, prefix_lens))
            decoder.reorder(keep, keep)
    return outputs


def _limits(model: Transformer | Ensemble, src_valid_lens: Tensor, request: DecodingRequest,
            prefix: Tensor | None) -> tuple[Tensor, Tensor, Tensor]:
    """-> each sentence's length limit (at least its prefix), the prefix (batch, P >= 1),
    -1 padded, and its lengths (batch,)."""
    max_lens = max_output_lengths(src_valid_lens, request.max_len_a, request.max_len_b,
                                  model.config.max_positions)  # (batch,)
    if prefix is None:
        prefix = torch.full((len(src_valid_lens), 1), -1, device=src_valid_lens.device)
    prefix_lens = (prefix >= 0).sum(1)
    if int(prefix_lens.max()) >= model.config.max_positions:
        raise ValueError(f"a prefix of {int(prefix_lens.max())} tokens leaves no room for EOS "
                         f"within model.max_positions={model.config.max_positions}")
    return torch.maximum(max_lens, prefix_lens), prefix, prefix_lens


def _forcing_steps(max_lens: Tensor, prefix_lens: Tensor) -> set[int]:
    """The steps at which a sentence's token may be forced (`_forced`): within a prefix, and
    at each length limit; at the others, every token is free (read once per search)."""
    return set(range(int(prefix_lens.max()))) | set(max_lens.tolist())


def _forced(step: int, max_lens: Tensor, prefix: Tensor, prefix_lens: Tensor,
            eos: int) -> Tensor:
    """The token each sentence must take at `step`: its prefix's, EOS at its length limit,
    else -1 (free) -> (batch,)."""
    forced = (prefix[:, step] if step < prefix.shape[1]
              else torch.full_like(prefix_lens, -1))
    return torch.where(max_lens == step, eos, forced)


def pad_prefixes(prefixes: Sequence[Sequence[int]], device: torch.device) -> Tensor:
    """Per-sentence target prefixes (piece ids) -> (batch, longest or 1), -1 padded."""
    return pad_rows(prefixes, -1, device)[0]


@dataclass(frozen=True)
class BatchJob:
    """One batch's search, as ids: what `search_batch` takes (in this process, or sent to a
    search process: `workers.SearchWorkers`)."""

    sources: list[list[int]]  # source ids, EOS appended
    prefixes: list[list[int]] | None  # target ids each output must begin with ([]: none)
    constraints: list[list[list[int]]] | None  # phrases each output must contain
    first: int  # the index of the batch's first sentence in its corpus: sampling's seed


def search_batch(model: Transformer | Ensemble, job: BatchJob,
                 request: DecodingRequest) -> list[list[Hypothesis]]:
    """Beam search (or, with `request.sampling`, `sample_search`) over one batch -> each
    sentence's n-best list. A sampled batch draws from its own generator, seeded by the
    request's seed and `job.first`, so its draws do not depend on which thread or process
    searches it, nor on the other batches."""
    device = model.device
    src, src_valid_lens = pad_rows(job.sources, model.config.pad_id, device)
    prefix = None if job.prefixes is None else pad_prefixes(job.prefixes, device)
    if request.sampling is not None:
        generator = torch.Generator(device).manual_seed(
            hash((request.sampling.seed, job.first)) & 0x7FFF_FFFF_FFFF_FFFF)
        return [[hyp] for hyp in sample_search(model, src, src_valid_lens, request,
                                               generator=generator, prefix=prefix)]
    return beam_search(model, src, src_valid_lens, request, prefix=prefix,
                       constraints=job.constraints)


@torch.inference_mode()
def beam_search(model: Transformer | Ensemble, src: Tensor, src_valid_lens: Tensor,
                request: DecodingRequest = DecodingRequest(), *,
                prefix: Tensor | None = None,
                constraints: Sequence[Sequence[Sequence[int]]] | None = None
                ) -> list[list[Hypothesis]]:
    """Translate a batch with beam search -> the `request.nbest` best hypotheses per
    sentence, best first (see the module docstring for the search and stopping rule).
    `prefix` (batch, longest), -1 padded: tokens each output must begin with
    (`pad_prefixes`). `constraints`: per sentence the phrases (target ids) its output must
    contain (`constraints.ConstraintState`; in order with `request.ordered_constraints`);
    a sentence none of whose hypotheses met them by its length limit gets those that did
    not, `constraints_met` False."""
    k, nbest, alpha, device = request.beam_size, request.nbest, request.alpha, src.device
    start, eos = model.config.start_id, model.config.eos_id
    num_sentences = src.shape[0]
    finished: list[list[Hypothesis]] = [[] for _ in range(num_sentences)]  # best first
    unmet: list[list[Hypothesis]] = [[] for _ in range(num_sentences)]  # constraints unmet
    constrained = (None if constraints is None or not any(constraints) else
                   ConstraintState(constraints, request.ordered_constraints, eos, device))
    # Per active sentence (a): original index, length limit, hypotheses finished so far,
    # the nbest-th best of their scores, and whether its best candidate has ended.
    sentence = torch.arange(num_sentences, device=device)
    max_lens, prefix, prefix_lens = _limits(model, src_valid_lens, request, prefix)
    num_finished = torch.zeros(num_sentences, dtype=torch.long, device=device)
    top_ended = torch.zeros(num_sentences, dtype=torch.bool, device=device)
    kth_score = torch.full((num_sentences,), float("-inf"), device=device)
    scores = torch.zeros(num_sentences, 1, device=device)  # (a, rows per sentence)
    ranks = torch.arange(2 * k, device=device)
    in_beam = ranks < k  # (2k,) the candidates that may finish
    forcing = _forcing_steps(max_lens, prefix_lens)
    # an alive hypothesis's best final score is its log-prob / this (the longest output)
    longest_penalty = length_penalty(max_lens + 1, alpha)
    with _decoding(model, src, src_valid_lens, num_sentences * k, max_lens,
                   request.use_cache) as decoder:
        # Step 0 runs one row per sentence, then each row becomes its sentence's k beams:
        # rows a * k + j. The encoder outputs and the cross-attention cache keep one row
        # per sentence: the decoder reads a sentence's rows as one row of k queries there.
        tokens = torch.full((num_sentences, 1), start, dtype=torch.long, device=device)
        for step in range(int(max_lens.max()) + 1):
            num_active, width = scores.shape
            hidden = decoder.hidden(tokens)
            forced = (_forced(step, max_lens, prefix, prefix_lens, eos).repeat_interleave(width)
                      if step in forcing else None)  # (a * width,)
            # 1. The best 2k candidates: at most k end in EOS (one per row), so at least k
            #    others remain to fill the beam.
            top_scores, beam, token = _best_candidates(decoder, scores, hidden, 2 * k,
                                                       forced, constrained)  # (a, 2k)
            parents = torch.arange(num_active, device=device)[:, None] * width + beam
            alive = top_scores > float("-inf")
            # 2. EOS candidates among the best k finish; the best k others go on.
            ended = alive & (token == eos) & in_beam
            going_on = alive & (token != eos)
            pick = torch.argsort((~going_on).byte(), dim=1, stable=True)[:, :k]  # (a, k)
            if bool(ended.any()):
                if constrained is not None:  # at the length limit: EOS without them
                    met = constrained.met_all()
                    _collect(unmet, None, ended & ~met, tokens, parents, top_scores,
                             sentence, step, alpha, nbest)
                    ended &= met
                _collect(finished, kth_score, ended, tokens, parents, top_scores, sentence,
                         step, alpha, nbest)
                num_finished += ended.sum(1)
                top_ended |= ended[:, 0]
            if constrained is not None:
                constrained.select(pick)
            rows = parents.gather(1, pick).view(-1)  # (a * k,) the hypotheses that go on
            tokens = torch.cat([tokens.index_select(0, rows), token.gather(1, pick).view(-1, 1)],
                               1)
            decoder.reorder(rows)
            scores = top_scores.gather(1, pick).masked_fill(~going_on.gather(1, pick),
                                                            float("-inf"))  # (a, k)
            # 3. A sentence stops when it has k finished hypotheses and its best candidate
            #    has ended, or when nothing alive can beat its nbest-th finished one
            #    (nothing alive: -inf, <= any score).
            best_reachable = scores.max(1).values / longest_penalty
            done = (best_reachable <= kth_score) | ((num_finished >= k) & top_ended)
            num_done = int(done.sum())  # the step's one host sync, besides collecting
            if num_done == num_active:
                break
            if num_done:
                keep = (~done).nonzero().squeeze(1)  # active sentences that go on
                keep_rows = (keep[:, None] * k + ranks[:k]).view(-1)
                scores, num_finished, kth_score, max_lens, longest_penalty, sentence, \
                    prefix, prefix_lens, top_ended = (
                        x.index_select(0, keep) for x in (
                            scores, num_finished, kth_score, max_lens, longest_penalty,
                            sentence, prefix, prefix_lens, top_ended))
                tokens = tokens.index_select(0, keep_rows)
                decoder.reorder(keep_rows, keep)
                if constrained is not None:
                    constrained.keep(keep, keep_rows)
    return [(hyps or [replace(h, constraints_met=False) for h in fallback])[:nbest]
            for hyps, fallback in zip(finished, unmet, strict=True)]


def _best_candidates(decoder: _Decoder, scores: Tensor, hidden: list[Tensor], k: int,
                     forced: Tensor | None, constrained: ConstraintState | None
                     ) -> tuple[Tensor, Tensor, Tensor]:
    """`_top_candidates` from the decoder states `hidden` (a * width, d): the logits of
    as many whole sentences at a time as `int8.rows_per_call` gives the output projection
    rows (an int8 layer's chunks: its logits are never joined into one (rows, vocab)
    tensor, and each chunk's stay in the CPU's caches for their log-softmax and top-k);
    a constrained search's at once."""
    num_active, width = scores.shape
    rows = decoder.rows_per_call
    per = num_active if rows is None else max(1, rows // width)  # sentences per chunk
    if per >= num_active or constrained is not None:
        return _top_candidates(scores, decoder.logits(hidden), k, forced, constrained)
    chunks = []
    for a in range(0, num_active, per):
        part = slice(a * width, (a + per) * width)  # the rows of sentences a to a + per
        chunks.append(_top_candidates(scores[a:a + per], decoder.logits(hidden, part), k,
                                      None if forced is None else forced[part]))
    return tuple(torch.cat(parts) for parts in zip(*chunks, strict=True))


def _top_candidates(scores: Tensor, logits: Tensor, k: int, forced: Tensor | None,
                    constrained: ConstraintState | None = None
                    ) -> tuple[Tensor, Tensor, Tensor]:
    """The k best continuations per sentence, best first: scores (a, width), next-token
    logits (a * width, vocab) -> cumulative scores, source row within the sentence, token;
    each (a, k). A row whose `forced` (a * width,) token is not -1 may continue with that
    token only (its log-prob kept); None: no row is forced. With `constrained`, EOS only
    where a row has met its constraints, and the k are those dynamic beam allocation takes
    (`ConstraintState.candidates`). Missing candidates (k > width * vocab: tiny test
    vocabularies) score -inf. `logits` is overwritten."""
    num_active, width = scores.shape
    vocab_size = logits.shape[1]
    log_probs = torch.log_softmax(logits, -1, out=logits)  # (a * width, vocab), in place
    rows = None if forced is None else (forced >= 0).nonzero().squeeze(1)
    if rows is not None and len(rows):
        kept = log_probs[rows, forced[rows]]
        log_probs[rows] = float("-inf")
        log_probs[rows, forced[rows]] = kept
    if constrained is not None:
        constrained.block_eos(log_probs, forced)
    candidates = log_probs.add_(scores.view(-1, 1)).view(num_active, width * vocab_size)
    top_scores, top_index = _topk(candidates, min(k, width * vocab_size))
    if constrained is not None:
        top_scores, top_index = constrained.candidates(candidates, top_index, k)
    if top_scores.shape[1] < k:
        top_scores = F.pad(top_scores, (0, k - top_scores.shape[1]), value=float("-inf"))
        top_index = F.pad(top_index, (0, k - top_index.shape[1]), value=0)
    return top_scores, top_index // vocab_size, top_index % vocab_size


def _topk(x: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """`x.topk(k, dim=1)` over wide rows (beam x vocabulary), best first, in two cheap
    passes: the k largest values of a row lie in the k blocks of `topk_block` columns (the
    tuning table's) with the largest maxima, so a vectorized max over every block picks
    those blocks, and the top-k runs over them only (with the columns left over after the
    last whole block)."""
    rows, n = x.shape
    block = hardware.TUNING.topk_block
    num_blocks = n // block
    if num_blocks < 4 * k:  # narrow rows: the plain top-k
        return x.topk(k, dim=1)
    whole = num_blocks * block
    blocks = x[:, :whole].unflatten(1, (num_blocks, block))  # a view
    best_blocks = blocks.amax(-1).topk(k, dim=1).indices  # (rows, k)
    columns = (best_blocks[:, :, None] * block
               + torch.arange(block, device=x.device)).flatten(1)  # (rows, k * block)
    columns = torch.cat([columns, torch.arange(whole, n, device=x.device).expand(rows, -1)], 1)
    values, picked = x.gather(1, columns).topk(k, dim=1)
    return values, columns.gather(1, picked)


def _collect(finished: list[list[Hypothesis]], kth_score: Tensor | None, ended: Tensor,
             tokens: Tensor, parents: Tensor, top_scores: Tensor, sentence: Tensor, step: int,
             alpha: float, nbest: int) -> None:
    """Store the hypotheses that just ended (`ended` (a, 2k): candidate j of active sentence
    a, continuing row `parents[a, j]` of `tokens` (BOS + output) with EOS); update each
    sentence's nbest-th best score (where `kth_score` is given). The tensors are read into
    lists once per step: a hypothesis costs no tensor operation."""
    penalty = length_penalty(step + 1, alpha)  # step + 1 tokens generated, EOS included
    active, candidate = ended.nonzero().unbind(1)
    log_probs = top_scores[active, candidate].tolist()
    outputs = tokens.index_select(0, parents[active, candidate])[:, 1:].tolist()
    kth = {}  # active sentence -> its new nbest-th best score
    for a, s, log_prob, output in zip(active.tolist(), sentence[active].tolist(), log_probs,
                                      outputs, strict=True):
        hyps = finished[s]
        hyps.append(Hypothesis(output, log_prob / penalty, log_prob))
        hyps.sort(key=lambda h: -h.score)
        if len(hyps) >= nbest:
            kth[a] = hyps[nbest - 1].score
    if kth and kth_score is not None:
        kth_score[list(kth)] = torch.tensor(list(kth.values()), dtype=kth_score.dtype,
                                            device=kth_score.device)
