"""Greedy and beam search: beam 1 == greedy, cached == uncached, n-best, exact stopping."""

from __future__ import annotations

import itertools

import pytest
import torch

from transformer.model import ModelConfig, Transformer
from transformer.search import (
    DEFAULT_ALPHA,
    beam_search,
    greedy_search,
    length_penalty,
    max_output_lengths,
)
from transformer.tokenizer import BOS_ID, EOS_ID, PAD_ID

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def random_model(vocab: int = 50, eos_logit: float = 2.5, seed: int = 0) -> Transformer:
    """A random small model; `eos_logit` shifts EOS up so outputs end at mixed lengths."""
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, num_hiddens=32, ffn_num_hiddens=64,
        num_heads=4, num_encoder_layers=2, num_decoder_layers=2, dropout=0.1,
        max_positions=64))
    with torch.no_grad():  # the last LayerNorm's bias along the EOS output row
        w = model.output_projection.weight[EOS_ID]
        model.decoder.blks[-1].addnorm3.ln.bias.copy_(eos_logit * w / w.norm() ** 2)
    return model.eval()


def random_batch(batch: int = 12, max_len: int = 7, vocab: int = 50, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    lens = torch.randint(1, max_len + 1, (batch,), generator=g)
    src = torch.randint(4, vocab, (batch, max_len), generator=g)
    src = src.masked_fill(torch.arange(max_len)[None] >= lens[:, None], PAD_ID)
    return src, lens


def tokens(hyps):
    return [[h.tokens for h in sentence] for sentence in hyps]




@pytest.fixture(scope="module")
def model():
    return random_model()


@pytest.mark.parametrize("eos_logit", [0.0, 2.5])
@pytest.mark.parametrize("alpha", [0.0, DEFAULT_ALPHA, 1.5])
def test_beam_size_1_is_greedy(eos_logit, alpha):
    model = random_model(eos_logit=eos_logit)
    src, lens = random_batch()
    greedy = greedy_search(model, src, lens)
    beam = beam_search(model, src, lens, beam_size=1, alpha=alpha)
    assert [hyps[0].tokens for hyps in beam] == greedy
    if eos_logit:
        assert len({len(g) for g in greedy}) > 3  # mixed output lengths


def test_cached_equals_uncached(model):
    src, lens = random_batch()
    assert greedy_search(model, src, lens) == greedy_search(model, src, lens, use_cache=False)
    cached = beam_search(model, src, lens, beam_size=5, nbest=5)
    uncached = beam_search(model, src, lens, beam_size=5, nbest=5, use_cache=False)
    assert tokens(cached) == tokens(uncached)
    for a, b in zip(itertools.chain(*cached), itertools.chain(*uncached), strict=True):
        assert a.score == pytest.approx(b.score, rel=1e-5, abs=1e-5)
        assert a.log_prob == pytest.approx(b.log_prob, rel=1e-5, abs=1e-5)


def test_batched_equals_one_at_a_time(model):
    src, lens = random_batch()
    batched = beam_search(model, src, lens, beam_size=4, nbest=2)
    for i in range(src.shape[0]):
        single = beam_search(model, src[i:i + 1, :lens[i]], lens[i:i + 1], beam_size=4, nbest=2)
        assert tokens(single) == tokens(batched[i:i + 1])
        assert single[0][0].score == pytest.approx(batched[i][0].score, rel=1e-5, abs=1e-5)


def test_nbest_lists(model):
    src, lens = random_batch()
    alpha = 0.8
    hyps = beam_search(model, src, lens, beam_size=5, nbest=3, alpha=alpha)
    assert [len(h) for h in hyps] == [3] * src.shape[0]
    max_lens = max_output_lengths(lens, 1.5, 10, model.config.max_positions)
    for sentence, limit in zip(hyps, max_lens.tolist(), strict=True):
        scores = [h.score for h in sentence]
        assert scores == sorted(scores, reverse=True)
        assert len({tuple(h.tokens) for h in sentence}) == 3  # distinct hypotheses
        for h in sentence:
            assert h.score == pytest.approx(h.log_prob / length_penalty(len(h.tokens) + 1, alpha))
            assert len(h.tokens) <= limit
            assert not {PAD_ID, BOS_ID, EOS_ID} & set(h.tokens)
    # The best hypothesis does not depend on how many are asked for.
    best = beam_search(model, src, lens, beam_size=5, nbest=1, alpha=alpha)
    assert [h[0] for h in best] == [h[0] for h in hyps]


def test_length_limit_forces_eos():
    model = random_model(eos_logit=-20.0)  # EOS (almost) never chosen: outputs hit the limit
    src, lens = random_batch()
    limits = max_output_lengths(lens, 0.5, 2, model.config.max_positions).tolist()
    greedy = greedy_search(model, src, lens, max_len_a=0.5, max_len_b=2)
    beam = beam_search(model, src, lens, beam_size=3, nbest=3, max_len_a=0.5, max_len_b=2)
    assert [len(g) for g in greedy] == limits
    assert [[len(h.tokens) for h in s] for s in beam] == [[n] * 3 for n in limits]
    # The length limit also respects the model's positions (BOS + output <= max_positions).
    assert max_output_lengths(torch.tensor([1000]), 1.5, 10, 64).item() == 63


def test_pad_and_bos_never_generated():
    model = random_model(eos_logit=0.0)
    with torch.no_grad():  # make BOS and PAD by far the most likely next tokens
        w = model.output_projection.weight
        bias = 20 * (w[BOS_ID] / w[BOS_ID].norm() ** 2 + w[PAD_ID] / max(w[PAD_ID].norm(), 1))
        model.decoder.blks[-1].addnorm3.ln.bias.copy_(bias)
    src, lens = random_batch()
    for ids in greedy_search(model, src, lens) + [
            h.tokens for s in beam_search(model, src, lens, beam_size=3, nbest=3) for h in s]:
        assert BOS_ID not in ids and PAD_ID not in ids


def test_exact_search_with_a_beam_as_wide_as_all_outputs():
    """Vocabulary of 6 (4 specials: only UNK, 4, 5 and EOS can be generated), outputs of at
    most 3 tokens: 1 + 3 + 9 + 27 = 40 outputs. A 40-wide beam must return all of them, with
    the scores of brute force, in order; nbest=1 must stop early yet return the best."""
    model = random_model(vocab=6, eos_logit=1.0)
    src, lens = torch.tensor([[4, 5, 4]]), torch.tensor([3])
    alpha = 1.0
    outputs = [list(seq) for n in range(4) for seq in itertools.product([1, 4, 5], repeat=n)]
    with torch.no_grad():
        enc = model.encode(src, lens)
        expected = {}
        for out in outputs:
            tgt_in = torch.tensor([[BOS_ID] + out])
            logits = model.output_projection(model.decoder(tgt_in, enc, lens))[0]
            logits[:, [PAD_ID, BOS_ID]] = float("-inf")
            log_probs = torch.log_softmax(logits, -1)
            log_prob = log_probs[torch.arange(len(out) + 1), out + [EOS_ID]].sum().item()
            expected[tuple(out)] = log_prob / length_penalty(len(out) + 1, alpha)
    hyps = beam_search(model, src, lens, beam_size=40, nbest=40, alpha=alpha,
                       max_len_a=0.0, max_len_b=3)[0]
    assert sorted(tuple(h.tokens) for h in hyps) == sorted(expected)
    for h in hyps:
        assert h.score == pytest.approx(expected[tuple(h.tokens)], abs=1e-5)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    best = beam_search(model, src, lens, beam_size=40, nbest=1, alpha=alpha,
                       max_len_a=0.0, max_len_b=3)[0]
    assert best[0].tokens == list(max(expected, key=expected.get))


def test_search_restores_training_mode(model):
    src, lens = random_batch(batch=2)
    model.train()
    greedy_search(model, src, lens)
    beam_search(model, src, lens, beam_size=2)
    assert model.training
    model.eval()


def test_bad_arguments(model):
    src, lens = random_batch(batch=2)
    with pytest.raises(ValueError, match="nbest"):
        beam_search(model, src, lens, beam_size=2, nbest=3)
    with pytest.raises(ValueError, match="alpha"):
        beam_search(model, src, lens, alpha=-1.0)


def test_special_ids_come_from_the_model_config():
    """Marian's layout: EOS 0, PAD last and the decoder's start; the search starts from
    start_id, ends at eos_id, never emits PAD, and beam 1 is still greedy."""
    vocab = 50
    torch.manual_seed(0)
    model = Transformer(ModelConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, num_hiddens=32, ffn_num_hiddens=64,
        num_heads=4, num_encoder_layers=2, num_decoder_layers=2, dropout=0.0,
        max_positions=64, pad_id=vocab - 1, start_id=vocab - 1, eos_id=0)).eval()
    with torch.no_grad():  # EOS likely enough to end outputs at mixed lengths
        w = model.output_projection.weight[0]
        model.decoder.blks[-1].addnorm3.ln.bias.copy_(2.5 * w / w.norm() ** 2)
    src, lens = random_batch()
    src = src.masked_fill(src == PAD_ID, vocab - 1)  # padded with this model's pad
    greedy = greedy_search(model, src, lens)
    assert [hyps[0].tokens for hyps in beam_search(model, src, lens, beam_size=1)] == greedy
    assert len({len(g) for g in greedy}) > 3 and all(vocab - 1 not in g for g in greedy)
    assert all(0 not in g for g in greedy)  # EOS ends an output, it is not part of it
    start = torch.full((len(src), 1), vocab - 1)
    first = model(src, lens, start)[:, -1]  # (batch, vocab): the first step's logits
    first[:, vocab - 1] = float("-inf")
    assert [g[0] if g else 0 for g in greedy] == first.argmax(-1).tolist()
