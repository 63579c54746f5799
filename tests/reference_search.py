"""A plain beam search, one sentence at a time, without a cache or batching: the reference
that `transformer.decoding.search.beam_search` (cached, batched, preallocated, parallel)
must equal.

The same search as the module docstring of `transformer.decoding.search` states it: the
best 2 * beam candidates per step, EOS candidates among the best `beam` finish, the best
`beam` others go on; stop at `beam` finished hypotheses once the best candidate of a step
has been EOS, or when the best alive one cannot beat the nbest-th finished one. Scores
accumulate in float32, as the fast search's do.
"""

from __future__ import annotations

import torch

from transformer.decoding.search import Hypothesis, length_penalty
from transformer.model.transformer import Transformer


@torch.no_grad()
def reference_beam_search(model: Transformer, src_ids: list[int], *, beam_size: int,
                          nbest: int, alpha: float, max_len: int) -> list[Hypothesis]:
    """The `nbest` best hypotheses of one source (ids with EOS), best first."""
    c = model.config
    src, lens = torch.tensor([src_ids]), torch.tensor([len(src_ids)])
    enc = model.encode(src, lens)
    alive = [([], torch.zeros((), dtype=torch.float32))]  # (output tokens, log-prob)
    finished: list[Hypothesis] = []
    top_ended = False  # the best candidate of a step was EOS
    for step in range(max_len + 1):
        candidates = []  # (cumulative log-prob, parent index, token)
        for parent, (tokens, score) in enumerate(alive):
            tgt_in = torch.tensor([[c.start_id, *tokens]])
            logits = model.output_projection(model.decoder(tgt_in, enc, lens))[0, -1].float()
            logits[[c.pad_id, c.start_id]] = float("-inf")
            log_probs = torch.log_softmax(logits, -1)
            if step == max_len:  # the length limit: EOS only
                candidates.append((score + log_probs[c.eos_id], parent, c.eos_id))
                continue
            top = log_probs.topk(min(2 * beam_size, len(log_probs)))
            for lp, token in zip(top.values, top.indices.tolist(), strict=True):
                if lp > float("-inf"):
                    candidates.append((score + lp, parent, token))
        candidates.sort(key=lambda cand: -float(cand[0]))  # stable: ties keep row order
        candidates = candidates[:2 * beam_size]
        top_ended = top_ended or candidates[0][2] == c.eos_id
        for rank, (score, parent, token) in enumerate(candidates):
            if token == c.eos_id and rank < beam_size:
                log_prob = float(score)
                finished.append(Hypothesis(alive[parent][0], log_prob / length_penalty(
                    len(alive[parent][0]) + 1, alpha), log_prob))
        finished.sort(key=lambda h: -h.score)
        alive = [(alive[parent][0] + [token], score) for score, parent, token in candidates
                 if token != c.eos_id][:beam_size]
        if (len(finished) >= beam_size and top_ended) or not alive:
            break
        best_reachable = max(float(s) for _, s in alive) / length_penalty(max_len + 1, alpha)
        if len(finished) >= nbest and best_reachable <= finished[nbest - 1].score:
            break
    return finished[:nbest]
