"""Lexically constrained beam search: translations that must contain given phrases.

    translator.translations(lines, constraints=[["Vertrag"], [], ["Hund", "rote Ball"]])
    transformer translate --constraints terms.tsv     # a line's phrases, tab-separated

Each sentence may come with phrases (target token ids) that its translation must contain,
in any order or, with `DecodingRequest.ordered_constraints`, in the given order. The
search is dynamic beam allocation (Post & Vilar 2018) in its vectorized form (Hu et al.
2019, fairseq's `--constraints`):

- At each step a hypothesis's candidates are the usual best ones of the sentence, plus for
  each hypothesis its own best token and every token that would advance one of its
  constraints (the next token of the phrase it is in, the first token of each phrase it may
  start).
- A candidate's *bank* is the number of constraint tokens it has produced (a phrase begun
  counts its tokens so far; leaving a phrase unfinished gives them back). The beam is
  filled from the banks in turn, the best of the fullest bank first, then the best of the
  next, ... then the second best of each, so hypotheses that met more constraints stay in
  the beam although the model scores them lower.
- A hypothesis may end (EOS) only once it has met all its constraints. At the length limit
  EOS is forced; a sentence none of whose hypotheses met its constraints by then is given
  its best hypothesis without them (`Hypothesis.constraints_met` False; the translator
  counts them in a warning).

One phrase is tracked at a time: a hypothesis that starts a phrase and leaves it starts
over. A sentence without constraints is searched as without this module (its banks are all
0: the best candidates by score); a batch without any is searched by plain beam search.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..data.batching import pad_rows

__all__ = ["ConstraintState", "stripe"]


class ConstraintState:
    """The constraints of a beam search's active sentences and each hypothesis's progress.

    Per sentence (a): its phrases (a, P, L), -1 padded (a sentence with fewer phrases has
    empty ones, met from the start), their lengths (a, P). Per row (a * width): which
    phrases it has met (rows, P), the phrase it is in (-1: none) and how many of its tokens
    it has produced. `candidates` extends a step's candidates and stripes them over the
    banks; `select` keeps the rows the search kept; `keep` the sentences still searched.
    """

    def __init__(self, constraints: Sequence[Sequence[Sequence[int]]], ordered: bool,
                 eos: int, device: torch.device):
        num_phrases = max(1, max(len(phrases) for phrases in constraints))
        flat = [list(phrase) for phrases in constraints
                for phrase in [*phrases, *[[]] * (num_phrases - len(phrases))]]
        self.phrases = pad_rows(flat, -1, device)[0].view(len(constraints), num_phrases,
                                                          -1)  # (a, P, L)
        self.lengths = (self.phrases >= 0).sum(-1)  # (a, P)
        self.total = self.lengths.sum(-1)  # (a,) constraint tokens of each sentence
        self.max_bank = int(self.total.max())  # the most constraint tokens of any sentence
        self.ordered, self.eos = ordered, eos
        self.met = self.lengths == 0  # (rows, P); at step 0 one row per sentence
        self.current = torch.full((len(constraints),), -1, device=device)  # (rows,)
        self.position = torch.zeros_like(self.current)  # (rows,)
        self._pending: tuple[Tensor, Tensor, Tensor] | None = None  # the candidates' states

    def block_eos(self, log_probs: Tensor, forced: Tensor | None) -> None:
        """Forbid EOS to the rows (a * width, vocab) that have not met all their
        constraints, except where it is forced (the length limit). In place."""
        blocked = ~self.met.all(1)
        if forced is not None:
            blocked &= forced < 0
        log_probs[:, self.eos].masked_fill_(blocked, float("-inf"))

    def candidates(self, candidates: Tensor, top_index: Tensor, k: int
                   ) -> tuple[Tensor, Tensor]:
        """A step's candidates: `candidates` (a, width * vocab) the cumulative scores of
        every continuation, `top_index` (a, 2k) the best of them -> the k candidates the
        beam is filled from, striped over the banks (`stripe`): (scores, index into
        width * vocab), each (a, k). Their constraint states wait for `select`."""
        a, n = candidates.shape
        width = self.met.shape[0] // a
        vocab = n // width
        rows = candidates.view(a * width, vocab)
        own = torch.cat([rows.argmax(1, keepdim=True), self._advancing()], 1)  # (rows, E)
        extra = (torch.arange(width, device=own.device)[:, None] * vocab
                 + own.view(a, width, -1)).view(a, -1)  # (a, width * E), into width * vocab
        index = torch.cat([top_index, extra.clamp(min=0)], 1)  # (a, M)
        scores = candidates.gather(1, index)
        scores[:, top_index.shape[1]:].masked_fill_(extra < 0, float("-inf"))
        scores.masked_fill_(_repeated(index), float("-inf"))  # a candidate counts once
        parents = torch.arange(a, device=index.device)[:, None] * width + index // vocab
        met, current, position = self._advance(parents, index % vocab)  # (a, M, P), (a, M)
        bank = (met * self.lengths[:, None, :]).sum(-1) + position  # tokens produced
        order = stripe(scores, bank, self.max_bank)[:, :k]  # (a, k)
        self._pending = (met[torch.arange(a, device=order.device)[:, None], order],
                         current.gather(1, order), position.gather(1, order))
        return scores.gather(1, order), index.gather(1, order)

    def met_all(self) -> Tensor:
        """Whether each pending candidate (a, k) of the last `candidates` has met all its
        constraints."""
        return self._pending[0].all(-1)

    def select(self, picked: Tensor) -> None:
        """The rows that go on: `picked` (a, k), the pending candidates each row continues
        (by position in the last `candidates`' result), sentence by sentence."""
        met, current, position = self._pending
        rows = torch.arange(len(picked), device=picked.device)[:, None]
        self.met = met[rows, picked].flatten(0, 1)  # (a * k, P)
        self.current = current.gather(1, picked).view(-1)
        self.position = position.gather(1, picked).view(-1)

    def keep(self, sentences: Tensor, rows: Tensor) -> None:
        """Keep the sentences `sentences` still searched and their rows `rows`."""
        self.phrases, self.lengths, self.total = (
            x.index_select(0, sentences) for x in (self.phrases, self.lengths, self.total))
        self.met, self.current, self.position = (
            x.index_select(0, rows) for x in (self.met, self.current, self.position))

    def _may_start(self, met: Tensor) -> Tensor:
        """Which phrases (..., P) a hypothesis that met `met` may start: the unmet ones;
        ordered, only the first unmet one."""
        may = ~met
        if self.ordered:
            first = may.int().argmax(-1, keepdim=True)  # the first unmet phrase
            may &= torch.arange(met.shape[-1], device=met.device) == first
        return may

    def _advancing(self) -> Tensor:
        """Per row (rows, 1 + P): the next token of the phrase it is in, and the first token
        of every phrase it may start; -1 where none."""
        width = self.met.shape[0] // len(self.phrases)
        sentence = torch.arange(len(self.met), device=self.met.device) // width  # (rows,)
        next_token = self.phrases[sentence, self.current.clamp(min=0), self.position]
        firsts = self.phrases[sentence, :, 0].masked_fill(~self._may_start(self.met), -1)
        return torch.cat([torch.where(self.current >= 0, next_token, -1)[:, None], firsts], 1)

    def _advance(self, parents: Tensor, tokens: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The states after row `parents` (a, M) takes `tokens` (a, M) -> met (a, M, P), the
        phrase it is in (a, M), -1: none, and its tokens produced (a, M)."""
        met, current, position = (self.met[parents], self.current[parents],
                                  self.position[parents])
        sentence = torch.arange(len(tokens), device=tokens.device)[:, None]  # (a, 1)
        expected = self.phrases[sentence, current.clamp(min=0), position]  # (a, M)
        going_on = (current >= 0) & (tokens == expected)
        starts = self._may_start(met) & (self.phrases[:, None, :, 0]
                                         == tokens[..., None])  # (a, M, P)
        starting = ~going_on & starts.any(-1)
        current = torch.where(going_on, current,
                              torch.where(starting, starts.int().argmax(-1), -1))
        position = torch.where(going_on, position + 1, starting.long())
        done = (current >= 0) & (position == self.lengths[sentence, current.clamp(min=0)])
        met = met | (done[..., None] & (torch.arange(met.shape[-1], device=met.device)
                                        == current[..., None]))
        return met, current.masked_fill(done, -1), position.masked_fill(done, 0)


def _repeated(index: Tensor) -> Tensor:
    """Which entries of each row of `index` (a, M) repeat an earlier entry of the row."""
    values, order = index.sort(dim=1, stable=True)
    later = torch.zeros_like(index, dtype=torch.bool)
    later[:, 1:] = values[:, 1:] == values[:, :-1]
    return torch.zeros_like(later).scatter_(1, order, later)


def stripe(scores: Tensor, bank: Tensor, max_bank: int) -> Tensor:
    """The order in which dynamic beam allocation takes candidates (a, M): the best of the
    highest bank, the best of the next bank down, ..., then the second best of each, and so
    on (Hu et al. 2019's "striping"); candidates at -inf last. With every bank 0 this is the
    order of the scores, best first."""
    by_score = scores.argsort(dim=1, descending=True, stable=True)
    banks = bank.gather(1, by_score)  # candidates best first
    by_bank = banks.argsort(dim=1, stable=True)  # bank by bank, best first within each
    grouped = banks.gather(1, by_bank)
    positions = torch.arange(grouped.shape[1], device=grouped.device).expand_as(grouped)
    first = torch.where(torch.cat([torch.ones_like(grouped[:, :1], dtype=torch.bool),
                                   grouped[:, 1:] != grouped[:, :-1]], 1), positions, 0)
    rank = torch.empty_like(grouped).scatter_(1, by_bank, positions - first.cummax(1).values)
    key = rank * (max_bank + 1) + (max_bank - banks)
    last = key.shape[1] * (max_bank + 2)  # beyond every candidate's key
    key = key.masked_fill(scores.gather(1, by_score) == float("-inf"), last)
    return by_score.gather(1, key.argsort(dim=1, stable=True))
