"""The engine's decoding step (`model.step.DecoderState`) against the book's path: the
decoder's `forward` with `LayerCache`s, bit for bit, through beam search's reorders and
finished sentences; its cache (`StepCache`); the decoder with hooks."""

import pytest
import torch
from torch.profiler import ProfilerActivity, profile

from transformer.model.blocks import LayerCache
from transformer.model.cache import BufferPool, SpareBuffer, StepCache
from transformer.model.int8 import quantize_int8
from transformer.model.layers import transpose_linear_weights
from transformer.model.step import DecoderState
from transformer.model.transformer import ModelConfig, PositionalEncoding, Transformer

BEAM = 3


def make_model(**overrides) -> Transformer:
    torch.manual_seed(0)
    kw = dict(src_vocab_size=40, tgt_vocab_size=40, num_hiddens=32, ffn_num_hiddens=64,
              num_heads=4, num_encoder_layers=2, num_decoder_layers=3, dropout=0.1)
    kw.update(overrides)
    return Transformer(ModelConfig(**kw)).eval()


def source(lengths: list[int], vocab: int = 40) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    lens = torch.tensor(lengths)
    src = torch.randint(4, vocab, (len(lengths), max(lengths)), generator=g)
    return src.masked_fill(torch.arange(max(lengths)) >= lens[:, None], 0), lens


def decode_both(model: Transformer, src: torch.Tensor, lens: torch.Tensor, steps: int = 9):
    """Beam-search-like steps through the step and through the book's path, with the same
    tokens, reorders and finished sentences -> their outputs at every step."""
    g = torch.Generator().manual_seed(2)
    with torch.inference_mode():
        enc = model.encode(src, lens)
        state = DecoderState(model.decoder, enc, lens, len(src) * BEAM, steps)
        caches = [LayerCache() for _ in model.decoder.blks]
        sentences = len(src)
        tokens = torch.full((sentences,), 2)
        outputs = []
        for t in range(steps):
            ours = state(tokens)
            book = model.decoder(tokens[:, None], enc, lens, caches)[:, 0]
            outputs.append((ours, book))
            rows = len(tokens)
            if t == 0:  # every sentence's row becomes its beams
                keep = torch.arange(sentences).repeat_interleave(BEAM)
                kept_sentences = None
            elif t == 4 and sentences > 1:  # the first sentence finishes
                kept_sentences = torch.arange(1, sentences)
                within = torch.randint(0, BEAM, (sentences - 1, BEAM), generator=g)
                keep = (kept_sentences[:, None] * BEAM + within).view(-1)
                sentences -= 1
            else:  # beams reordered within their sentence
                within = torch.randint(0, BEAM, (rows // BEAM, BEAM), generator=g)
                keep = (torch.arange(rows // BEAM)[:, None] * BEAM + within).view(-1)
                kept_sentences = None
            state.reorder(keep, kept_sentences)
            for layer in caches:
                layer.self_attention.reorder(keep)
                if kept_sentences is not None:
                    layer.cross_attention.reorder(kept_sentences)
            if kept_sentences is not None:
                enc, lens = enc[kept_sentences], lens[kept_sentences]
            tokens = torch.randint(4, 40, (len(keep),), generator=g)
        state.release()
    return outputs


@pytest.mark.parametrize("overrides", [
    {}, {"norm_first": True}, {"activation": "gelu"}, {"output_bias": True},
    {"pruned_heads": {"decoder.blks.1.attention1": [0, 2], "decoder.blks.2.attention2": [3]}},
], ids=["post-norm", "pre-norm", "gelu", "output-bias", "pruned"])
def test_the_step_computes_the_book_path_bit_for_bit(overrides):
    model = make_model(**overrides)
    for ours, book in decode_both(model, *source([7, 4, 6])):
        assert ours.shape == book.shape
        assert torch.equal(ours, book)


@pytest.mark.parametrize("overrides", [{}, {"norm_first": True}], ids=["post-norm", "pre-norm"])
def test_the_step_computes_the_book_path_bit_for_bit_with_transposed_weights(overrides,
                                                                              tuning):
    """A loaded translator's weights stored transposed (`transpose_linear_weights`): the
    step's joined W_q/W_k/W_v weight keeps their layout, so its products give the separate
    layers' numbers, as MKL computes each layout differently at few rows."""
    tuning(float32_library="blas", transposed_weights=True)
    model = make_model(**overrides)
    transpose_linear_weights(model)
    for ours, book in decode_both(model, *source([7, 4, 6])):
        assert torch.equal(ours, book)
    for ours, book in decode_both(model, *source([5])):  # 3 rows a step
        assert torch.equal(ours, book)


def test_the_step_over_long_sources_and_few_keys(tuning):
    """Sources past `fused_attention_min_keys` (the fused kernel), an unpadded batch (no
    mask), and the explicit path's short-row kernels switched off: still bit for bit."""
    model = make_model()
    tuning(fused_attention_min_keys=5)
    for ours, book in decode_both(model, *source([9, 6])):
        assert torch.equal(ours, book)
    tuning(fused_attention_min_keys=48, short_softmax_keys=0, small_bmm_products=0)
    for ours, book in decode_both(model, *source([5, 5])):
        assert torch.equal(ours, book)


@pytest.mark.parametrize("max_queries", [0, 1000], ids=["explicit", "fused"])
def test_the_step_with_either_kernel_for_few_queries(max_queries, tuning):
    """Whichever kernel `fused_attention_max_queries` gives a step's few queries (one
    sentence's beams on AVX2-only CPUs: the fused one), the book's path takes the same:
    still bit for bit."""
    tuning(fused_attention_max_queries=max_queries)
    model = make_model()
    for ours, book in decode_both(model, *source([7, 4, 6])):
        assert torch.equal(ours, book)


def test_the_step_with_positions_of_another_kind():
    """Positions other than the book's sinusoidal ones (here a subclass that shifts them)
    reach the step through their module's `forward`: still bit for bit."""

    class Shifted(PositionalEncoding):
        def forward(self, X, offset=0):
            return super().forward(X, offset + 1)

    model = make_model()
    model.decoder.pos_encoding.__class__ = Shifted
    shifted = decode_both(model, *source([6, 5]))
    for ours, book in shifted:
        assert torch.equal(ours, book)
    unshifted, _ = decode_both(make_model(), *source([6, 5]))[-1]
    assert not torch.equal(shifted[-1][0], unshifted)


def test_a_step_past_the_models_positions_says_so():
    model = make_model(max_positions=4)
    src, lens = source([3])
    with torch.inference_mode():
        state = DecoderState(model.decoder, model.encode(src, lens), lens, 1, 6)
        for _ in range(4):
            state(torch.tensor([5]))
        with pytest.raises(ValueError, match="5 positions exceeds model.max_positions=4"):
            state(torch.tensor([5]))


def test_the_step_of_an_int8_model():
    """Bit for bit the book's path, with W_q, W_k and W_v in one int8 product per block
    (`int8.joined_int8`): six int8 products a block where the book's path runs eight."""
    model = quantize_int8(make_model())
    for ours, book in decode_both(model, *source([7, 4])):
        assert torch.equal(ours, book)
    src, lens = source([7, 4])
    with torch.inference_mode():
        enc = model.encode(src, lens)
        state = DecoderState(model.decoder, enc, lens, 2 * BEAM, 4)
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            state(torch.tensor([2, 2]))
        state.release()
    products = sum(event.count for event in prof.key_averages()
                   if event.key == "quantized::linear_dynamic")
    assert products == 6 * len(model.decoder.blks)


def test_a_decoder_with_hooks_decodes_through_its_forward():
    """A head mask (a pre-hook of W_o) and a user's forward hook run in the step too."""
    model = make_model()
    plain = decode_both(model, *source([6, 5]))
    attention = model.get_submodule("decoder.blks.0.attention1")
    with attention.masking_heads(torch.tensor([0.0, 1.0, 1.0, 1.0])):
        masked = decode_both(model, *source([6, 5]))
    for ours, book in masked:
        assert torch.equal(ours, book)
    assert not torch.equal(masked[-1][0], plain[-1][0])
    calls = []
    handle = model.decoder.blks[1].ffn.register_forward_hook(lambda *args: calls.append(1))
    try:
        decode_both(model, *source([6, 5]), steps=3)
    finally:
        handle.remove()
    assert len(calls) == 2 * 3  # each step, through both paths


def test_step_cache_appends_gathers_and_refuses_overflow():
    pool = BufferPool()
    cache = StepCache(max_rows=4, max_steps=3, pool=pool)
    with torch.inference_mode():
        first = torch.arange(2 * 2 * 1 * 2.0).view(2, 2, 1, 2)  # (k and v, rows, heads, hd)
        keys, values = cache.append(first)
        assert keys.shape == (2, 1, 1, 2) and torch.equal(keys[:, :, 0], first[0])
        cache.reorder(torch.tensor([1, 1, 0]))
        second = -torch.ones(2, 3, 1, 2)
        keys, values = cache.append(second)
        assert keys.shape == (3, 1, 2, 2)
        assert torch.equal(keys[:, :, 0], first[0][[1, 1, 0]])
        assert torch.equal(values[:, :, 0], first[1][[1, 1, 0]])
        assert torch.equal(values[:, :, 1], second[1])
        cache.append(second)
        with pytest.raises(ValueError, match="3 steps"):
            cache.append(second)
        cache.release()
    assert len(pool.kept) == 2
    with pytest.raises(RuntimeError, match="without gradients"):
        DecoderState(make_model().decoder, torch.zeros(1, 2, 32), None, 1, 1)


def test_the_layers_caches_pass_one_free_buffer_along():
    """L layers hold L + 1 buffers: each append writes into the buffer the layer before
    freed; every buffer is the pool's again after `release`."""
    pool = BufferPool()
    spare = SpareBuffer(pool)
    caches = [StepCache(max_rows=6, max_steps=4, pool=pool, spare=spare) for _ in range(3)]
    g = torch.Generator().manual_seed(0)
    with torch.inference_mode():
        steps = [torch.randn(2, 6, 2, 4, generator=g) for _ in range(4)]
        for t, kv in enumerate(steps):
            held = []
            for cache in caches:
                keys, values = cache.append(kv)
                assert torch.equal(keys[:, :, t], kv[0]) and torch.equal(values[:, :, t], kv[1])
                assert torch.equal(keys[:, :, 0], steps[0][0][[5, 4, 3, 2, 1, 0]]
                                   if t >= 2 else steps[0][0])  # kept through the reorder
                held.append(keys.data_ptr())
                cache.reorder(torch.tensor([5, 4, 3, 2, 1, 0]) if t == 1 else torch.arange(6))
            assert len(set(held)) == 3  # each layer its own buffer
        in_use = {cache._buffer.data_ptr() for cache in caches} | {spare._buffer.data_ptr()}
        assert len(in_use) == 4 and not pool.kept
        for cache in caches:
            cache.release()
        spare.release()
    assert {b.data_ptr() for b in pool.kept} == in_use


def test_a_spare_too_small_for_a_layer_goes_back_to_the_pool():
    pool = BufferPool()
    spare = SpareBuffer(pool)
    with torch.inference_mode():
        small = torch.empty(10)
        spare.put(small)
        taken = spare.take(20, small)
        assert taken.numel() >= 20 and [b.data_ptr() for b in pool.kept] == [small.data_ptr()]
        spare.put(taken)
        assert spare.take(20, small) is taken  # large enough: the spare itself
