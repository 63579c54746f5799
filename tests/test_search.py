"""Greedy and beam search: beam 1 == greedy, cached == uncached, n-best, exact stopping;
sampling (frequencies, top-k, top-p, temperature, seeds) and target prefixes."""

from __future__ import annotations

import itertools
from dataclasses import replace

import pytest
import torch
from reference_search import reference_beam_search

from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from transformer.decoding.corpus import search_corpus
from transformer.decoding.request import DecodingRequest, Sampling
from transformer.decoding.search import (
    DEFAULT_ALPHA,
    Hypothesis,
    beam_search,
    length_penalty,
    max_output_lengths,
    pad_prefixes,
    sample_search,
)
from transformer.decoding.translator import Translator
from transformer.model.transformer import ModelConfig, Transformer

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


def greedy_search(model, src, lens, **options) -> list[list[int]]:
    """Greedy search's outputs (`sample_search`'s default: the most likely token)."""
    request = DecodingRequest(beam_size=1, **options)
    return [h.tokens for h in sample_search(model, src, lens, request)]




@pytest.fixture(scope="module")
def model():
    return random_model()


@pytest.mark.parametrize("eos_logit", [0.0, 2.5])
@pytest.mark.parametrize("alpha", [0.0, DEFAULT_ALPHA, 1.5])
def test_beam_size_1_is_greedy(eos_logit, alpha):
    model = random_model(eos_logit=eos_logit)
    src, lens = random_batch()
    greedy = greedy_search(model, src, lens)
    beam = beam_search(model, src, lens, DecodingRequest(beam_size=1, alpha=alpha))
    assert [hyps[0].tokens for hyps in beam] == greedy
    if eos_logit:
        assert len({len(g) for g in greedy}) > 3  # mixed output lengths


def test_cached_equals_uncached(model):
    src, lens = random_batch()
    assert greedy_search(model, src, lens) == greedy_search(model, src, lens, use_cache=False)
    cached = beam_search(model, src, lens, DecodingRequest(beam_size=5, nbest=5))
    uncached = beam_search(model, src, lens, DecodingRequest(beam_size=5, nbest=5, use_cache=False))
    assert tokens(cached) == tokens(uncached)
    for a, b in zip(itertools.chain(*cached), itertools.chain(*uncached), strict=True):
        assert a.score == pytest.approx(b.score, rel=1e-5, abs=1e-5)
        assert a.log_prob == pytest.approx(b.log_prob, rel=1e-5, abs=1e-5)


def test_a_search_leaves_its_cache_buffers_for_the_next_search(model, monkeypatch):
    """Beam and greedy search release their caches when they end (exceptions included):
    the next search writes into the same buffers, and finds the same outputs."""
    from transformer.model.cache import CACHE_BUFFERS
    src, lens = random_batch()
    CACHE_BUFFERS.clear()
    first = beam_search(model, src, lens, DecodingRequest(beam_size=5, nbest=5))
    kept = {b.data_ptr() for b in CACHE_BUFFERS.kept}
    # keys and values share a buffer per layer, and the layers pass one spare along
    assert len(kept) == model.config.num_decoder_layers + 1
    with torch.inference_mode():  # the searches' buffers: made in inference mode
        for buffer in CACHE_BUFFERS.kept:
            buffer.fill_(float("nan"))
    second = beam_search(model, src, lens, DecodingRequest(beam_size=5, nbest=5))
    assert tokens(second) == tokens(first)
    assert [h.score for h in itertools.chain(*second)] == [h.score for h in itertools.chain(*first)]
    assert {b.data_ptr() for b in CACHE_BUFFERS.kept} == kept  # taken and given back
    greedy = greedy_search(model, src, lens)
    assert {b.data_ptr() for b in CACHE_BUFFERS.kept} == kept
    assert greedy == greedy_search(model, src, lens, use_cache=False)
    CACHE_BUFFERS.clear()
    import transformer.decoding.search as search
    steps = []
    best = search._best_candidates

    def interrupted_at_step_3(*args):
        steps.append(1)
        if len(steps) == 3:
            raise KeyboardInterrupt
        return best(*args)

    monkeypatch.setattr(search, "_best_candidates", interrupted_at_step_3)
    with pytest.raises(KeyboardInterrupt):
        beam_search(model, src, lens, DecodingRequest(beam_size=5))
    assert len(CACHE_BUFFERS.kept) == model.config.num_decoder_layers + 1  # all the same


def test_batched_equals_one_at_a_time(model):
    src, lens = random_batch()
    batched = beam_search(model, src, lens, DecodingRequest(beam_size=4, nbest=2))
    for i in range(src.shape[0]):
        single = beam_search(model, src[i:i + 1, :lens[i]], lens[i:i + 1],
                             DecodingRequest(beam_size=4, nbest=2))
        assert tokens(single) == tokens(batched[i:i + 1])
        assert single[0][0].score == pytest.approx(batched[i][0].score, rel=1e-5, abs=1e-5)


def thirty_sources() -> list[list[int]]:
    """30 random sources of 1-8 ids and EOS."""
    return [torch.randint(4, 50, (n,)).tolist() + [EOS_ID]
            for n in torch.randint(1, 9, (30,), generator=torch.Generator().manual_seed(0))]


def batch_sizes_searched(monkeypatch) -> list[int]:
    """A list that each batch `search_corpus` searches from now on (by beam search or
    sampling) appends its number of sentences to."""
    import transformer.decoding.search as search
    sizes = []

    def counted(searcher):
        def run(model, src, *args, **kwargs):
            sizes.append(src.shape[0])
            return searcher(model, src, *args, **kwargs)
        return run

    for name in ("beam_search", "sample_search"):
        monkeypatch.setattr(search, name, counted(getattr(search, name)))
    return sizes


@pytest.mark.parametrize("request_", [DecodingRequest(beam_size=4),
                                      DecodingRequest(beam_size=1,
                                                      sampling=Sampling(topk=10, seed=1))])
def test_search_corpus_batches_at_most_max_rows(model, monkeypatch, request_, tuning):
    """Each batch of `search_corpus` holds at most the tuning table's `decode_max_rows` rows
    (sentences x beam; one row per sentence when sampling), and its results equal one
    batch's."""
    sources = thirty_sources()
    whole = search_corpus(model, sources, request_, max_tokens=10_000)
    sizes = batch_sizes_searched(monkeypatch)
    tuning(decode_max_rows=24)
    capped = search_corpus(model, sources, request_, max_tokens=10_000)
    assert sum(sizes) == len(sources) and max(sizes) == 24 // request_.beam_size
    if request_.sampling is None:  # draws depend on the batch; beam search does not
        assert tokens(capped) == tokens(whole)


def test_nbest_lists(model):
    src, lens = random_batch()
    alpha = 0.8
    hyps = beam_search(model, src, lens, DecodingRequest(beam_size=5, nbest=3, alpha=alpha))
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
    # The best hypothesis does not depend on how many are asked for (its score up to the
    # last bits: sentences searched longer for more hypotheses leave the others' steps
    # fewer rows, and kernels are picked by their rows).
    best = beam_search(model, src, lens, DecodingRequest(beam_size=5, nbest=1, alpha=alpha))
    assert same_hypotheses([h[:1] for h in best], [h[:1] for h in hyps])


def test_length_limit_forces_eos():
    model = random_model(eos_logit=-20.0)  # EOS (almost) never chosen: outputs hit the limit
    src, lens = random_batch()
    limits = max_output_lengths(lens, 0.5, 2, model.config.max_positions).tolist()
    greedy = greedy_search(model, src, lens, max_len_a=0.5, max_len_b=2)
    beam = beam_search(model, src, lens, DecodingRequest(beam_size=3, nbest=3, max_len_a=0.5,
                                                         max_len_b=2))
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
            h.tokens for s in beam_search(model, src, lens, DecodingRequest(beam_size=3,
                                                                            nbest=3)) for h in s]:
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
    hyps = beam_search(model, src, lens, DecodingRequest(beam_size=40, nbest=40, alpha=alpha,
                                                         max_len_a=0.0, max_len_b=3))[0]
    assert sorted(tuple(h.tokens) for h in hyps) == sorted(expected)
    for h in hyps:
        assert h.score == pytest.approx(expected[tuple(h.tokens)], abs=1e-5)
    assert [h.score for h in hyps] == sorted((h.score for h in hyps), reverse=True)
    best = beam_search(model, src, lens, DecodingRequest(beam_size=40, nbest=1, alpha=alpha,
                                                         max_len_a=0.0, max_len_b=3))[0]
    assert best[0].tokens == list(max(expected, key=expected.get))


def test_search_restores_training_mode(model):
    src, lens = random_batch(batch=2)
    model.train()
    greedy_search(model, src, lens)
    beam_search(model, src, lens, DecodingRequest(beam_size=2))
    assert model.training
    model.eval()


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
    assert [hyps[0].tokens for hyps in beam_search(model, src, lens,
                                                   DecodingRequest(beam_size=1))] == greedy
    assert len({len(g) for g in greedy}) > 3 and all(vocab - 1 not in g for g in greedy)
    assert all(0 not in g for g in greedy)  # EOS ends an output, it is not part of it
    start = torch.full((len(src), 1), vocab - 1)
    first = model(src, lens, start)[:, -1]  # (batch, vocab): the first step's logits
    first[:, vocab - 1] = float("-inf")
    assert [g[0] if g else 0 for g in greedy] == first.argmax(-1).tolist()


# ---- sampling and prefixes ------------------------------------------------------------------

def fixed_distribution_model(log_probs: torch.Tensor) -> Transformer:
    """A model whose next-token logits are `log_probs` (vocab,) at every step, whatever the
    input: the decoder's last LayerNorm outputs zeros and the output bias is the logits."""
    torch.manual_seed(0)
    vocab = log_probs.shape[0]
    model = Transformer(ModelConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, num_hiddens=16, ffn_num_hiddens=32,
        num_heads=2, num_encoder_layers=1, num_decoder_layers=1, dropout=0.0,
        max_positions=16, output_bias=True))
    with torch.no_grad():
        model.decoder.blks[-1].addnorm3.ln.weight.zero_()
        model.decoder.blks[-1].addnorm3.ln.bias.zero_()
        model.output_projection.bias.copy_(log_probs)
    return model.eval()


# the first output token's distribution: PAD and BOS impossible, the rest as written
FIRST = torch.tensor([0.0, 0.0, 0.0, 0.05, 0.30, 0.25, 0.20, 0.12, 0.05, 0.03])
DRAWS = 40_000


def first_token_frequencies(sampling: Sampling) -> torch.Tensor:
    """Frequencies of the first output token over DRAWS sentences (EOS forced after it)."""
    model = fixed_distribution_model(FIRST.clamp(min=1e-30).log())
    src, lens = torch.full((DRAWS, 2), 5), torch.full((DRAWS,), 2)
    request = DecodingRequest(beam_size=1, sampling=sampling, max_len_a=0.0, max_len_b=1)
    hyps = sample_search(model, src, lens, request,
                         generator=torch.Generator().manual_seed(sampling.seed))
    first = torch.tensor([h.tokens[0] if h.tokens else EOS_ID for h in hyps])
    return torch.bincount(first, minlength=len(FIRST)).double() / DRAWS


def assert_frequencies(freq: torch.Tensor, expected: torch.Tensor) -> None:
    """Within 6 binomial standard deviations per token (a false alarm has probability
    ~2e-9 per token; the draws are seeded, so the test cannot flake anyway)."""
    sd = (expected * (1 - expected) / DRAWS).sqrt()
    assert ((freq - expected).abs() <= 6 * sd + 1e-12).all(), (freq, expected)


def entropy(p: torch.Tensor) -> float:
    p = p[p > 0]
    return float(-(p * p.log()).sum())


def test_sampled_frequencies_match_the_models_probabilities():
    assert_frequencies(first_token_frequencies(Sampling(seed=1)), FIRST.double())


def test_topk_and_topp_keep_the_most_likely_tokens_renormalised():
    top3 = torch.zeros_like(FIRST, dtype=torch.float64)
    top3[[4, 5, 6]] = FIRST[[4, 5, 6]].double() / FIRST[[4, 5, 6]].sum()
    assert_frequencies(first_token_frequencies(Sampling(topk=3, seed=2)), top3)
    # top-p 0.6: 0.30 + 0.25 = 0.55 < 0.6, so the nucleus is those two plus 0.20
    assert_frequencies(first_token_frequencies(Sampling(topp=0.6, seed=3)), top3)
    nucleus = torch.zeros_like(top3)
    nucleus[[4, 5]] = FIRST[[4, 5]].double() / FIRST[[4, 5]].sum()
    assert_frequencies(first_token_frequencies(Sampling(topp=0.5, seed=4)), nucleus)


def test_temperature_sharpens_or_flattens_the_distribution():
    entropies = []
    for temperature in (0.5, 1.0, 2.0):
        expected = torch.softmax(FIRST.clamp(min=1e-30).log().double() / temperature, 0)
        freq = first_token_frequencies(Sampling(temperature=temperature, seed=5))
        assert_frequencies(freq, expected)
        entropies.append(entropy(freq))
    assert entropies[0] < entropies[1] < entropies[2]


def test_topk_1_is_greedy_and_a_seed_repeats_its_draws(model):
    sources = [list(range(4, 4 + n)) + [EOS_ID] for n in (3, 5, 2, 6, 4, 1, 7)]
    greedy = search_corpus(model, sources, DecodingRequest(beam_size=1))
    assert search_corpus(model, sources, DecodingRequest(beam_size=1,
                                                         sampling=Sampling(topk=1))) == greedy
    first = search_corpus(model, sources, DecodingRequest(beam_size=1, sampling=Sampling(seed=7)))
    assert search_corpus(model, sources, DecodingRequest(beam_size=1,
                                                         sampling=Sampling(seed=7))) == first
    assert search_corpus(model, sources, DecodingRequest(beam_size=1,
                                                         sampling=Sampling(seed=8))) != first
    for hyps in first:  # a sample's log-prob is the model's, as a forced decoding gives it
        assert hyps[0].score == pytest.approx(
            hyps[0].log_prob / length_penalty(len(hyps[0].tokens) + 1, DEFAULT_ALPHA))


def same_hypotheses(a: list[list[Hypothesis]], b: list[list[Hypothesis]]) -> bool:
    """The same n-best lists: tokens and constraints exactly, scores to float32 rounding."""
    def exact(hyps):
        return [[(h.tokens, h.constraints_met) for h in sentence] for sentence in hyps]

    def scores(hyps):
        return [x for sentence in hyps for h in sentence for x in (h.score, h.log_prob)]

    return exact(a) == exact(b) and scores(a) == pytest.approx(scores(b), rel=1e-5)


@pytest.mark.parametrize("beam_size", [1, 4])
def test_outputs_begin_with_the_prefix(model, beam_size):
    sources = [list(range(4, 4 + n)) + [EOS_ID] for n in (3, 5, 2, 6)]
    prefixes = [[7, 8], [], [9], list(range(10, 32))]  # the last: 22 tokens
    settings = DecodingRequest(beam_size=beam_size)
    hyps = search_corpus(model, sources, replace(settings, nbest=beam_size), prefixes=prefixes)
    for sentence, prefix in zip(hyps, prefixes, strict=True):
        for h in sentence:
            assert h.tokens[:len(prefix)] == prefix
    # the last prefix is longer than the length limit (1.5 * 7 + 10): the limit makes room
    assert max_output_lengths(torch.tensor([7]), 1.5, 10, 64).item() < len(prefixes[-1])
    # an empty prefix is no prefix: the same hypotheses, their scores up to the last bits
    # of products over other batches' rows (MKL picks its kernel by the rows)
    plain = search_corpus(model, sources, replace(settings, nbest=beam_size))
    assert same_hypotheses(hyps[1:2], plain[1:2])
    assert same_hypotheses(search_corpus(model, sources, replace(settings, nbest=beam_size),
                                         prefixes=[[]] * len(sources)), plain)
    # sampling honours prefixes too
    sampled = search_corpus(model, sources, DecodingRequest(beam_size=1, sampling=Sampling(seed=1)),
                            prefixes=prefixes)
    for sentence, prefix in zip(sampled, prefixes, strict=True):
        assert sentence[0].tokens[:len(prefix)] == prefix


def test_prefix_scores_are_the_forced_tokens_log_probs(model):
    """The best continuation of a forced prefix scores as the model scores prefix + rest."""
    src, lens = torch.tensor([[5, 6, 7, EOS_ID]]), torch.tensor([4])
    hyp = beam_search(model, src, lens, DecodingRequest(beam_size=3), prefix=pad_prefixes([[9, 8]],
                                                                         src.device))[0][0]
    with torch.no_grad():
        out = hyp.tokens + [EOS_ID]
        logits = model(src, lens, torch.tensor([[BOS_ID] + hyp.tokens]))[0]
        logits[:, [PAD_ID, BOS_ID]] = float("-inf")
        expected = torch.log_softmax(logits, -1)[torch.arange(len(out)), out].sum().item()
    assert hyp.log_prob == pytest.approx(expected, abs=1e-4)


@pytest.mark.parametrize("request_", [DecodingRequest(beam_size=4),
                                      DecodingRequest(beam_size=1,
                                                      sampling=Sampling(topk=10, seed=1))])
def test_two_threads_search_in_full_rounds_but_sample_the_batches_of_one(model, monkeypatch,
                                                                         request_):
    """With 2 threads, beam search's 3 packed batches become 2 (`batching.even_rounds`:
    no thread waits for another's last batch), with the outputs of 1 thread; sampling keeps
    the batches of 1 thread, so its draws do not depend on the thread count."""
    sources = thirty_sources()
    max_tokens = 90  # 3 batches of at most 90 padded positions: 2 at once
    sizes = batch_sizes_searched(monkeypatch)
    one = search_corpus(model, sources, request_, max_tokens=max_tokens)
    one_sizes, sizes[:] = list(sizes), []
    torch.set_num_threads(2)
    two = search_corpus(model, sources, request_, max_tokens=max_tokens)
    assert len(one_sizes) == 3 and sum(sizes) == len(sources)
    assert len(sizes) == (3 if request_.sampling else 2)
    if request_.sampling:
        assert sorted(sizes) == sorted(one_sizes)
    assert tokens(two) == tokens(one)


# ---- the fast search equals a plain one ---------------------------------------------------

@pytest.mark.parametrize("beam_size, nbest, alpha", [(1, 1, 1.0), (5, 1, 1.0), (5, 3, 2.0)])
def test_fast_search_equals_the_plain_reference(en_de_checkpoint, multi30k_lines, beam_size,
                                                nbest, alpha):
    """Cached, batched, preallocated, parallel: the same hypotheses and scores as a plain
    search of one sentence at a time without a cache (tests/reference_search.py), on a
    model trained on Multi30k."""
    translator = Translator.load(en_de_checkpoint, device="cpu")
    model = translator.model
    sources = translator._encode(multi30k_lines("test_2016_flickr.en.gz")[:20], 0)
    settings = DecodingRequest(beam_size=beam_size, alpha=alpha)
    threads = torch.get_num_threads()
    torch.set_num_threads(2)  # two batches at a time
    try:
        fast = search_corpus(model, sources, replace(settings, nbest=nbest), max_tokens=200)
    finally:
        torch.set_num_threads(threads)
    limits = max_output_lengths(torch.tensor([len(s) for s in sources]), 1.5, 10,
                                model.config.max_positions).tolist()
    for src, hyps, limit in zip(sources, fast, limits, strict=True):
        reference = reference_beam_search(model, src, beam_size=beam_size, nbest=nbest,
                                          alpha=alpha, max_len=limit)
        assert [h.tokens for h in hyps] == [h.tokens for h in reference]
        for h, r in zip(hyps, reference, strict=True):
            assert h.log_prob == pytest.approx(r.log_prob, abs=1e-4)
            assert h.score == pytest.approx(r.score, abs=1e-4)
