"""Ensembles: several translation models decoding as one.

    ensemble = Ensemble([model_a, model_b, model_c, model_d])
    beam_search(ensemble, src, src_valid_lens)      # as with one model

At each step every member reads the sentence with its own encoder output and key/value
cache, and the ensemble's next-token distribution is the **mean of the members'
log-probabilities** (OpenNMT-py's and Marian's combination), normalized: the normalized
geometric mean of their probabilities,

    log p(y | x, prefix) = log_softmax( 1/N * sum_i log p_i(y | x, prefix) )
                         = log_softmax( 1/N * sum_i logits_i )

so the ensemble's logits are the mean of its members' (`mean_logits`), and the search
normalizes them as one model's: a hypothesis's score stays a log-probability, and an
N-model step costs N models' decoder steps and output projections, plus one addition per
member. A token one member finds unlikely is unlikely for the ensemble (a product of
experts), where the mean of probabilities (fairseq's) lets one member's confidence carry
it. Members are models trained independently (different seeds, even different sizes) that
share the source and target vocabularies and special ids; averaging the *weights* instead
is for checkpoints of one training run (`checkpoint.average_weights`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

import torch
from torch import Tensor, nn

from .transformer import ModelConfig, Transformer

__all__ = ["Ensemble", "members", "mean_logits"]


class Ensemble(nn.Module):
    """Models of one vocabulary decoding together (`members` in order; the first one's
    config stands for them, with the shortest position limit of all)."""

    def __init__(self, models: Sequence[Transformer]):
        super().__init__()
        if len(models) < 2:
            raise ValueError(f"an ensemble needs at least two models, got {len(models)}")
        first = models[0].config
        for i, model in enumerate(models[1:], 2):
            c = model.config
            differ = [name for name in ("src_vocab_size", "tgt_vocab_size", "pad_id",
                                        "start_id", "eos_id")
                      if getattr(c, name) != getattr(first, name)]
            if differ:
                raise ValueError(f"ensemble member {i} differs from member 1 in "
                                 f"{', '.join(differ)}")
        self.members = nn.ModuleList(models)
        # in the members' mode (a new module is in training mode): `eval_mode` restores this
        # module's mode to all of them
        self.training = all(model.training for model in models)
        self.members.training = self.training

    @property
    def config(self) -> ModelConfig:
        """The first member's config, limited to the positions every member has."""
        return replace(self.members[0].config,
                       max_positions=min(m.config.max_positions for m in self.members))

    @property
    def device(self) -> torch.device:
        """Where the first member's parameters are (all members are on one device)."""
        return self.members[0].device

    def num_parameters(self) -> int:
        """The members' parameters, summed."""
        return sum(m.num_parameters() for m in self.members)


def members(model: Transformer | Ensemble) -> tuple[Transformer, ...]:
    """The models that decode: an ensemble's members, or the model itself."""
    return tuple(model.members) if isinstance(model, Ensemble) else (model,)


def mean_logits(logits: Sequence[Tensor]) -> Tensor:
    """The ensemble's logits from its members' (N fresh tensors of one shape, -inf where a
    token is masked) -> their mean, written into the first; its log-softmax is the
    normalized mean of the members' log-probabilities (each one's normalizing constant
    drops out)."""
    total = logits[0]
    if len(logits) == 1:
        return total
    for other in logits[1:]:
        total += other
    return total.div_(len(logits))
