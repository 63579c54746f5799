"""Losses: the training objective, and teacher-forced loss and nll over a set of batches.

- `LabelSmoothedLoss`: what training minimizes, label-smoothed cross-entropy summed over the
  real target tokens, with the output projection fused into it
  (`layers.linear_label_smoothed_cross_entropy`: the logits are never materialized).
- `teacher_forced_loss`: one batch's summed nll and label-smoothed loss, differentiable
  (head importance takes gradients of it).
- `evaluate_loss`: per-token loss and nll over many batches, in eval mode without gradients:
  training's validation loss and the head-masking scores both come from here.
- `sentence_log_probs`: each pair's log-probability (forced decoding: `transformer translate
  --score` scores given translations with it).

Both compute the same quantity as `nn.CrossEntropyLoss(label_smoothing=eps)`: the target
distribution is (1 - eps) on the reference token plus eps / V on every token, so the loss
is (1 - eps) * nll + eps * (mean over the vocabulary of -log p).

Outside training the log-probabilities come in chunks of rows (`_log_prob_chunks`, as many
rows as the training loss's chunks, `layers.default_chunk_rows`): a batch of thousands of
target tokens would otherwise hold its (tokens, vocabulary) logits and their log-softmax at
once, the largest allocation of a training run's validation.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from ..data.store import Batch
from .ensemble import Ensemble, mean_logits, members
from .layers import default_chunk_rows, linear_label_smoothed_cross_entropy
from .transformer import Transformer, eval_mode

__all__ = ["LabelSmoothedLoss", "TeacherForcedLoss", "teacher_forced_loss",
           "sentence_log_probs", "LossReport", "evaluate_loss"]


class LabelSmoothedLoss(nn.Module):
    """The training objective as a module around the model, so that DDP (and torch.compile)
    wrap model and loss together: label-smoothed cross-entropy summed over the batch's real
    target tokens, the output projection fused into it."""

    def __init__(self, model: Transformer, label_smoothing: float):
        super().__init__()
        self.model, self.label_smoothing = model, label_smoothing

    def forward(self, src: Tensor, src_valid_lens: Tensor, tgt_in: Tensor, tgt_out: Tensor,
                tgt_index: Tensor | None = None) -> Tensor:
        """`tgt_index` (N,) long: the flat positions (row * T + column) of `tgt_out`'s real
        tokens, row-major (`Batch.tgt_index`, made on the host by `collate`); None finds
        them here from the padding, which waits for the device (a boolean selection)."""
        if tgt_index is None:
            tgt_index = (tgt_out.flatten() != self.model.config.pad_id).nonzero().squeeze(1)
        hidden = self.model.hidden_states(src, src_valid_lens, tgt_in)  # (batch, T, d)
        hidden = hidden.flatten(0, 1).index_select(0, tgt_index)  # (N, d)
        projection = self.model.output_projection  # weight (V, d), bias (V,) or None
        return linear_label_smoothed_cross_entropy(
            hidden, projection.weight, tgt_out.flatten().index_select(0, tgt_index),
            self.label_smoothing, bias=projection.bias)


@dataclass
class TeacherForcedLoss:
    """Sums over one batch's real target tokens (tensors, differentiable)."""

    nll: Tensor  # sum of -log p(reference token)
    uniform: Tensor  # sum of the mean over the vocabulary of -log p (the smoothing term)
    tokens: int


def _real_tokens(model: Transformer, batch: Batch) -> tuple[Tensor, Tensor]:
    """Feed the reference prefix -> the decoder's last states at the batch's real target
    tokens (N, d) and those tokens (N,), row-major (`Batch.tgt_index`, as the training loss
    selects them)."""
    hidden = model.hidden_states(batch.src, batch.src_valid_lens, batch.tgt_in)
    return (hidden.flatten(0, 1).index_select(0, batch.tgt_index),
            batch.tgt_out.flatten().index_select(0, batch.tgt_index))


def _log_prob_chunks(models: Sequence[Transformer], states: Sequence[Tensor]
                     ) -> Iterator[tuple[slice, Tensor]]:
    """(rows, log-probs (rows, V) float32) over the N rows of `states` (each model's (N, d)
    states of the same tokens), a chunk of rows at a time; several models' log-probs are
    the normalized mean of theirs, as an ensemble's search reads them
    (`ensemble.mean_logits`)."""
    n, vocab_size = len(states[0]), models[0].config.tgt_vocab_size
    step = default_chunk_rows(vocab_size, states[0].device)
    for start in range(0, n, step):
        rows = slice(start, min(start + step, n))
        log_probs = [model.output_projection(hidden[rows]).float().log_softmax(-1)
                     for model, hidden in zip(models, states, strict=True)]
        if len(log_probs) == 1:
            yield rows, log_probs[0]
        else:
            yield rows, torch.log_softmax(mean_logits(log_probs), -1)


def teacher_forced_loss(model: Transformer, batch: Batch) -> TeacherForcedLoss:
    """One batch's summed nll and smoothing term over its real target tokens (the output
    projection on those positions only, a chunk of rows at a time), float64."""
    hidden, targets = _real_tokens(model, batch)
    nll = uniform = hidden.new_zeros((), dtype=torch.float64)
    for rows, log_probs in _log_prob_chunks([model], [hidden]):
        nll = nll - log_probs.gather(1, targets[rows, None]).sum().double()
        uniform = uniform - log_probs.mean(-1).sum().double()
    return TeacherForcedLoss(nll, uniform, batch.num_tgt_tokens)


@torch.no_grad()
def sentence_log_probs(model: Transformer | Ensemble, batch: Batch) -> Tensor:
    """Each pair's log-probability of its target given its source, teacher-forced: the
    sum over the target's tokens, EOS included, (batch,) float64. Forced decoding (scoring a
    given translation) runs on this; it is `-teacher_forced_loss(...).nll` pair by pair.
    An ensemble's token log-probabilities are the normalized mean of its members', as its
    search reads them (`ensemble.mean_logits`)."""
    states = []  # each member's (N target tokens, d)
    for member in members(model):
        with eval_mode(member):
            hidden, targets = _real_tokens(member, batch)
        states.append(hidden)
    picked = torch.cat([log_probs.gather(1, targets[rows, None]).squeeze(1)
                        for rows, log_probs in _log_prob_chunks(members(model), states)])
    pairs, length = batch.tgt_out.shape
    return torch.zeros(pairs, dtype=torch.float64, device=picked.device).index_add_(
        0, batch.tgt_index // length, picked.double())  # each token's pair


@dataclass
class LossReport:
    """Per-token averages over a set of batches."""

    loss: float  # label-smoothed cross-entropy
    nll: float  # negative log-likelihood (cross-entropy without smoothing)
    tokens: int


@torch.no_grad()
def evaluate_loss(model: Transformer, batches: Iterable[Batch],
                  label_smoothing: float = 0.0) -> LossReport:
    """Teacher-forced loss and nll per target token over `batches`, in eval mode (the
    model's mode is restored afterwards). Sums accumulate in float64."""
    device = model.device
    nll = torch.zeros((), dtype=torch.float64, device=device)
    uniform = torch.zeros_like(nll)
    tokens = 0
    with eval_mode(model):
        for batch in batches:
            sums = teacher_forced_loss(model, batch)
            nll += sums.nll.double()
            uniform += sums.uniform.double()
            tokens += sums.tokens
    mean_nll, mean_uniform = float(nll) / max(tokens, 1), float(uniform) / max(tokens, 1)
    loss = (1 - label_smoothing) * mean_nll + label_smoothing * mean_uniform
    return LossReport(loss, mean_nll, tokens)
