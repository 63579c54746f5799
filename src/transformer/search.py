"""Decoding: greedy and beam search over the model's key/value cache, and `search_corpus`,
the one path that decodes many sentences (training validation, the Translator, evaluation):
sorted longest first, packed into token-bounded batches (`batching.pack`), returned in input
order, with the settings of `DecodingSettings`.

Each step feeds only the newest token; the decoder's self-attention keys/values grow in the
cache and the encoder-decoder keys/values are projected once per sentence. `use_cache=False`
re-runs the decoder over the whole prefix instead (the reference for tests and benchmarks).

Conventions shared by both searches:
- The output of a sentence is at most `max_len = a * source_len + b` tokens, EOS not counted
  (`max_output_lengths`); beam search then forces EOS, greedy search just stops.
- Decoding starts from the model's `start_id` (BOS; Marian models: PAD) and ends with its
  `eos_id`; PAD and the start token are never generated (their logits are masked); UNK may
  be.

Beam search, in short (rows = sentences x beam, scores = cumulative log-probs):
- Step 0 decodes one row per sentence and its top `beam` tokens start the beam, so no
  hypothesis appears twice and encoder-decoder keys/values are projected once per sentence.
- Each step takes the top `beam` candidates over beam x vocab per sentence and accepts the
  best `beam - finished` of them; accepted candidates ending in EOS become finished
  hypotheses and leave the beam, so a sentence's beam shrinks as hypotheses finish (as in
  Marian/Nematus) and holds at most `beam` finished ones. With `beam_size=1` this is exactly
  greedy search, whatever alpha.
- A finished hypothesis of `n` output tokens plus EOS has the GNMT length-normalised score
  `log_prob / lp(n + 1)`, `lp(L) = ((5 + L) / 6) ** alpha`: L counts the EOS token.
- A sentence stops when no hypothesis is alive, or when it has `nbest` finished hypotheses and
  the best alive one cannot beat the `nbest`-th: log-probs only decrease and, for alpha >= 0,
  `lp` only grows with length, so an alive hypothesis with cumulative log-prob `s` can at best
  reach `s / lp(max_len + 1)`. The rule is exact (never drops a hypothesis that could win),
  and the best hypothesis does not depend on `nbest`.
- Finished sentences leave the batch (their rows are dropped from the caches).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor
from torch.nn import functional as F

from .batching import pack
from .blocks import LayerCache
from .config import DecodingSettings
from .model import Transformer, eval_mode

__all__ = ["DEFAULT_ALPHA", "DEFAULT_MAX_TOKENS", "Hypothesis",
           "length_penalty", "max_output_lengths", "greedy_search", "beam_search",
           "search_corpus", "decode_batches"]

DEFAULT_ALPHA = DecodingSettings.alpha
DEFAULT_MAX_TOKENS = 2048  # source tokens per decoding batch, padding included, before the beam


@dataclass(frozen=True)
class Hypothesis:
    """One finished translation: output ids (no BOS/EOS) and its scores."""

    tokens: list[int]
    score: float  # log_prob / length_penalty(len(tokens) + 1, alpha), used for ranking
    log_prob: float  # sum of the token log-probs, EOS included


def length_penalty(length: int | Tensor, alpha: float) -> float | Tensor:
    """GNMT's length penalty ((5 + length) / 6) ** alpha; `length` counts EOS."""
    return ((5 + length) / 6) ** alpha


def max_output_lengths(src_valid_lens: Tensor, max_len_a: float, max_len_b: int,
                       max_positions: int) -> Tensor:
    """The most output tokens (EOS not counted) per sentence: a * source_len + b, within
    the model's limit (BOS + output must fit in `max_positions`)."""
    lengths = (src_valid_lens.float() * max_len_a).long() + max_len_b
    return lengths.clamp(min=1, max=max_positions - 1)


def _next_logits(model: Transformer, tokens: Tensor, enc_outputs: Tensor,
                 src_valid_lens: Tensor, cache: list[LayerCache] | None) -> Tensor:
    """Float logits of the next token after each row of `tokens` (rows, steps) ->
    (rows, vocab), PAD and the start token at -inf (never generated).

    With `cache` only the last token is fed; without, the decoder re-reads the whole prefix.
    """
    if cache is not None:
        logits = model.decode_step(tokens[:, -1:], enc_outputs, src_valid_lens, cache)[:, -1]
    else:
        hidden = model.decoder(tokens, enc_outputs, src_valid_lens)[:, -1]  # (rows, d)
        logits = model.output_projection(hidden)
    c = model.config
    logits = logits.float()
    logits[:, c.pad_id] = float("-inf")  # a fresh tensor: in place
    logits[:, c.start_id] = float("-inf")
    return logits


def _select_cache(cache: list[LayerCache] | None, rows: Tensor,
                  sentences: Tensor | None = None) -> None:
    """Keep/reorder the self-attention cache `rows`, and the cross-attention cache (one
    row per sentence) `sentences`, where given."""
    for layer in cache or ():
        layer.self_attention.reorder(rows)
        if sentences is not None:
            layer.cross_attention.reorder(sentences)


@torch.no_grad()
def greedy_search(model: Transformer, src: Tensor, src_valid_lens: Tensor, *,
                  max_len_a: float = 1.5, max_len_b: int = 10,
                  use_cache: bool = True) -> list[list[int]]:
    """Translate a batch greedily -> token ids per sentence, without BOS/EOS. The package
    decodes with `beam_search(beam_size=1)`, which the tests check equals this plain loop."""
    max_lens = max_output_lengths(src_valid_lens, max_len_a, max_len_b,
                                  model.config.max_positions)  # (batch,)
    start, eos = model.config.start_id, model.config.eos_id
    outputs: list[list[int]] = [[] for _ in range(src.shape[0])]
    with eval_mode(model):
        enc_outputs = model.encode(src, src_valid_lens)
        cache = model.new_cache() if use_cache else None
        tokens = torch.full((src.shape[0], 1), start, dtype=torch.long, device=src.device)
        sentence = torch.arange(src.shape[0], device=src.device)  # original index of each row
        for step in range(int(max_lens.max())):
            next_tokens = _next_logits(model, tokens, enc_outputs, src_valid_lens,
                                       cache).argmax(-1)  # (rows,)
            tokens = torch.cat([tokens, next_tokens[:, None]], 1)  # (rows, 2 + step)
            done = (next_tokens == eos) | (max_lens == step + 1)
            if not bool(done.any()):
                continue
            for row in done.nonzero().squeeze(1).tolist():
                ids = tokens[row, 1:].tolist()
                outputs[int(sentence[row])] = ids[:-1] if ids[-1] == eos else ids
            keep = (~done).nonzero().squeeze(1)
            if keep.numel() == 0:
                break
            tokens, enc_outputs, src_valid_lens, max_lens, sentence = (
                x.index_select(0, keep)
                for x in (tokens, enc_outputs, src_valid_lens, max_lens, sentence))
            _select_cache(cache, keep, keep)
    return outputs


@torch.no_grad()
def beam_search(model: Transformer, src: Tensor, src_valid_lens: Tensor, *,
                beam_size: int = 5, nbest: int = 1, alpha: float = DEFAULT_ALPHA,
                max_len_a: float = 1.5, max_len_b: int = 10,
                use_cache: bool = True) -> list[list[Hypothesis]]:
    """Translate a batch with beam search -> the `nbest` best hypotheses per sentence,
    best first (see the module docstring for the search and stopping rule)."""
    if beam_size < 1 or not 1 <= nbest <= beam_size:
        raise ValueError(f"need beam_size >= 1 and 1 <= nbest <= beam_size, got "
                         f"beam_size={beam_size}, nbest={nbest}")
    if alpha < 0:
        raise ValueError(f"alpha must be >= 0, got {alpha}")
    k, device = beam_size, src.device
    start, eos = model.config.start_id, model.config.eos_id
    num_sentences = src.shape[0]
    finished: list[list[Hypothesis]] = [[] for _ in range(num_sentences)]  # best first
    # Per active sentence (a): original index, length limit, open slots, nbest-th score.
    sentence = torch.arange(num_sentences, device=device)
    max_lens = max_output_lengths(src_valid_lens, max_len_a, max_len_b,
                                  model.config.max_positions)
    budget = torch.full((num_sentences,), k, device=device)  # beam slots not yet finished
    kth_score = torch.full((num_sentences,), float("-inf"), device=device)
    scores = torch.zeros(num_sentences, 1, device=device)  # (a, rows per sentence)
    slots = torch.arange(k, device=device)
    with eval_mode(model):
        # Step 0 runs one row per sentence, then each row becomes its sentence's k beams:
        # rows a * k + j. The encoder outputs and the cross-attention cache keep one row
        # per sentence: the decoder reads a sentence's rows as one row of k queries there.
        enc_outputs = model.encode(src, src_valid_lens)
        cache = model.new_cache() if use_cache else None
        tokens = torch.full((num_sentences, 1), start, dtype=torch.long, device=device)
        for step in range(int(max_lens.max()) + 1):
            num_active, width = scores.shape
            logits = _next_logits(model, tokens, enc_outputs, src_valid_lens, cache)
            at_limit = (max_lens == step).repeat_interleave(width)  # (rows,) must end now
            top_scores, beam, token = _top_candidates(scores, logits, k, at_limit, eos)
            # The shrinking beam: the best `budget` candidates go on (or end, with EOS).
            accepted = (slots[None] < budget[:, None]) & (top_scores > float("-inf"))
            ended = accepted & (token == eos)
            rows = (torch.arange(num_active, device=device)[:, None] * width + beam).view(-1)
            tokens = torch.cat([tokens.index_select(0, rows), token.view(-1, 1)], 1)
            _select_cache(cache, rows)
            if bool(ended.any()):
                _collect(finished, kth_score, ended, tokens, top_scores, sentence, step,
                         alpha, nbest)
                budget = budget - ended.sum(1)
            scores = top_scores.masked_fill(~accepted | ended, float("-inf"))  # (a, k)
            # Stop a sentence when nothing alive can beat its nbest-th finished hypothesis
            # (nothing alive: -inf, which is <= any score).
            best_reachable = scores.max(1).values / length_penalty(max_lens + 1, alpha)
            done = best_reachable <= kth_score
            if bool(done.all()):
                break
            if bool(done.any()):
                keep = (~done).nonzero().squeeze(1)  # active sentences that go on
                keep_rows = (keep[:, None] * k + slots).view(-1)
                scores, budget, kth_score, max_lens, sentence, enc_outputs, src_valid_lens = (
                    x.index_select(0, keep) for x in (scores, budget, kth_score, max_lens,
                                                      sentence, enc_outputs, src_valid_lens))
                tokens = tokens.index_select(0, keep_rows)
                _select_cache(cache, keep_rows, keep)
    return [hyps[:nbest] for hyps in finished]


def _top_candidates(scores: Tensor, logits: Tensor, k: int, at_limit: Tensor,
                    eos: int) -> tuple[Tensor, Tensor, Tensor]:
    """The k best continuations per sentence, best first: scores (a, width), next-token
    logits (a * width, vocab) -> cumulative scores, source row within the sentence, token;
    each (a, k). Rows `at_limit` (a * width,) may continue with EOS only. Missing
    candidates (k > width * vocab: tiny test vocabularies) score -inf.

    Only each row's own k best tokens can be among its sentence's k best, so the whole
    vocabulary is read twice per row (its log-sum-exp, its top k), and the log-probs are
    computed for those k tokens only: log p = logit - logsumexp.
    """
    num_active, width = scores.shape
    per_row = min(k, logits.shape[1])
    log_norm = logits.logsumexp(-1, keepdim=True)  # (rows, 1)
    top_logits, top_tokens = logits.topk(per_row, dim=1)  # (rows, per_row)
    log_probs = top_logits - log_norm
    eos_only = torch.full_like(log_probs, float("-inf"))
    eos_only[:, 0] = logits[:, eos] - log_norm[:, 0]
    log_probs = torch.where(at_limit[:, None], eos_only, log_probs)
    top_tokens = torch.where(at_limit[:, None], eos, top_tokens)
    candidates = (log_probs + scores.view(-1, 1)).view(num_active, width * per_row)
    top_scores, top_index = candidates.topk(min(k, width * per_row), dim=1)
    token = top_tokens.view(num_active, -1).gather(1, top_index)
    if top_scores.shape[1] < k:
        top_scores = F.pad(top_scores, (0, k - top_scores.shape[1]), value=float("-inf"))
        top_index = F.pad(top_index, (0, k - top_index.shape[1]), value=0)
        token = F.pad(token, (0, k - token.shape[1]), value=eos)
    return top_scores, top_index // per_row, token


def _collect(finished: list[list[Hypothesis]], kth_score: Tensor, ended: Tensor,
             tokens: Tensor, top_scores: Tensor, sentence: Tensor, step: int, alpha: float,
             nbest: int) -> None:
    """Store the hypotheses that just ended (`ended` (a, k)); update each sentence's
    nbest-th best score. `tokens` rows are BOS + output + EOS."""
    k = ended.shape[1]
    penalty = length_penalty(step + 1, alpha)  # step + 1 tokens generated, EOS included
    for a, j in ended.nonzero().tolist():
        log_prob = float(top_scores[a, j])
        hyps = finished[int(sentence[a])]
        hyps.append(Hypothesis(tokens[a * k + j, 1:-1].tolist(), log_prob / penalty, log_prob))
        hyps.sort(key=lambda h: -h.score)
        if len(hyps) >= nbest:
            kth_score[a] = hyps[nbest - 1].score


def search_corpus(model: Transformer, sources: Sequence[Sequence[int]], *,
                  settings: DecodingSettings = DecodingSettings(), nbest: int = 1,
                  max_tokens: int = DEFAULT_MAX_TOKENS, use_cache: bool = True,
                  on_progress: Callable[[int], None] | None = None
                  ) -> list[list[Hypothesis]]:
    """Beam search over many sentences, in input order: the one decoding path of validation,
    translation and evaluation (batched by `decode_batches`). `sources` are source ids with
    EOS appended. `beam_size=1` is greedy search."""
    device = model.device

    def search(batch: list[Sequence[int]]) -> list[list[Hypothesis]]:
        src, src_valid_lens = _pad(batch, model.config.pad_id, device)
        return beam_search(model, src, src_valid_lens, beam_size=settings.beam_size,
                           nbest=nbest, alpha=settings.alpha, max_len_a=settings.max_len_a,
                           max_len_b=settings.max_len_b, use_cache=use_cache)

    return decode_batches(sources, search, nbest=nbest, max_tokens=max_tokens,
                          on_progress=on_progress)


def decode_batches(sources: Sequence[Sequence[int]],
                   search: Callable[[list[Sequence[int]]], list[list[Hypothesis]]], *,
                   nbest: int = 1, max_tokens: int = DEFAULT_MAX_TOKENS,
                   on_progress: Callable[[int], None] | None = None
                   ) -> list[list[Hypothesis]]:
    """Run `search` (a batch of sources -> n-best lists) over many sentences and return the
    results in input order; shared by `search_corpus` and the CTranslate2 engine. An empty
    source gets `nbest` empty hypotheses without a search. Sentences are sorted longest
    first and packed into batches of at most `max_tokens` padded source tokens (before the
    beam expands them). `on_progress(n)` is called as sentences are done."""
    results = [[Hypothesis([], 0.0, 0.0)] * nbest for _ in sources]
    todo = sorted((i for i, ids in enumerate(sources) if ids), key=lambda i: -len(sources[i]))
    if on_progress is not None and len(todo) < len(sources):
        on_progress(len(sources) - len(todo))
    for batch in pack(todo, [len(ids) for ids in sources], max_tokens):
        for i, sentence_hyps in zip(batch, search([sources[i] for i in batch]), strict=True):
            results[i] = sentence_hyps
        if on_progress is not None:
            on_progress(len(batch))
    return results


def _pad(sources: list[Sequence[int]], pad_id: int,
         device: torch.device) -> tuple[Tensor, Tensor]:
    """-> src (batch, longest) padded with `pad_id`, src_valid_lens (batch,)."""
    longest = max(map(len, sources))
    src = torch.tensor([list(ids) + [pad_id] * (longest - len(ids)) for ids in sources])
    return src.to(device), torch.tensor([len(ids) for ids in sources], device=device)
