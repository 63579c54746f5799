"""Multi-head attention against the book's formulas and torch.nn.MultiheadAttention."""

import math

import pytest
import torch
from torch import nn

from transformer import hardware
from transformer.model import kernels
from transformer.model.attention import (
    MultiHeadAttention,
    masked_softmax,
    transpose_output,
    transpose_qkv,
)
from transformer.model.cache import BufferPool, KVCache


def book_example():
    num_hiddens, num_heads = 100, 5
    attention = MultiHeadAttention(num_hiddens, num_hiddens, num_hiddens, num_hiddens,
                                   num_heads, 0.5)
    attention.eval()
    batch_size, num_queries, num_kvpairs = 2, 4, 6
    valid_lens = torch.tensor([3, 2])
    X = torch.ones((batch_size, num_queries, num_hiddens))
    Y = torch.ones((batch_size, num_kvpairs, num_hiddens))
    return attention, X, Y, valid_lens


def test_book_example_shape_and_weights():
    torch.manual_seed(0)
    attention, X, Y, valid_lens = book_example()
    assert attention(X, Y, Y, valid_lens).shape == (2, 4, 100)
    out = attention(X, Y, Y, valid_lens, need_weights=True)
    assert out.shape == (2, 4, 100)
    assert attention.attention.attention_weights.shape == (2 * 5, 4, 6)
    w = attention.head_attention_weights  # (batch, heads, queries, keys)
    assert w.shape == (2, 5, 4, 6)
    for b, n in enumerate(valid_lens.tolist()):
        assert torch.all(w[b, :, :, n:] == 0)
        assert torch.all(w[b, :, :, :n] > 0)
    torch.testing.assert_close(w.sum(-1), torch.ones(2, 5, 4))


def test_masked_softmax_matches_book():
    torch.manual_seed(0)
    X = torch.rand(2, 2, 4)
    out = masked_softmax(X, torch.tensor([2, 3]))
    expected = torch.zeros_like(X)
    expected[0, :, :2] = torch.softmax(X[0, :, :2], -1)
    expected[1, :, :3] = torch.softmax(X[1, :, :3], -1)
    torch.testing.assert_close(out, expected)
    out2 = masked_softmax(X, torch.tensor([[1, 3], [2, 4]]))  # one length per query
    torch.testing.assert_close(out2[0, 0, :1], torch.ones(1))
    assert torch.all(out2[0, 0, 1:] == 0) and torch.all(out2[1, 0, 2:] == 0)
    torch.testing.assert_close(out2[1, 1], torch.softmax(X[1, 1], -1))
    torch.testing.assert_close(masked_softmax(X, None), torch.softmax(X, -1))


def test_masked_softmax_empty_row_is_zero_not_nan():
    out = masked_softmax(torch.randn(2, 3, 4), torch.tensor([0, 2]))
    assert not torch.isnan(out).any()
    assert torch.all(out[0] == 0)
    torch.testing.assert_close(out[1].sum(-1), torch.ones(3))
    half = masked_softmax(torch.randn(2, 3, 4).half(), torch.tensor([0, 2]))
    assert not torch.isnan(half).any() and torch.all(half[0] == 0)


def test_transpose_roundtrip_and_layout():
    X = torch.randn(3, 7, 12)
    Z = transpose_qkv(X, 4)
    assert Z.shape == (12, 7, 3)
    # Row b * num_heads + h holds head h of example b: columns h*3:(h+1)*3.
    torch.testing.assert_close(Z[1 * 4 + 2], X[1, :, 6:9])
    torch.testing.assert_close(transpose_output(Z, 4), X)


def test_heads_must_divide_hiddens():
    with pytest.raises(ValueError, match=r"num_hiddens \(10\).*num_heads \(3\)"):
        MultiHeadAttention(10, 10, 10, 10, 3, 0.0)


def copy_to_torch_mha(ours: MultiHeadAttention, bias: bool) -> nn.MultiheadAttention:
    d = ours.W_q.out_features
    ref = nn.MultiheadAttention(d, ours.num_heads, dropout=0.0, bias=bias, batch_first=True)
    with torch.no_grad():
        ref.in_proj_weight.copy_(torch.cat([ours.W_q.weight, ours.W_k.weight, ours.W_v.weight]))
        ref.out_proj.weight.copy_(ours.W_o.weight)
        if bias:
            ref.in_proj_bias.copy_(torch.cat([ours.W_q.bias, ours.W_k.bias, ours.W_v.bias]))
            ref.out_proj.bias.copy_(ours.W_o.bias)
    return ref


def run_with_grads(fn, *inputs):
    inputs = [x.detach().clone().requires_grad_(True) for x in inputs]
    out = fn(*inputs)
    g = torch.randn(out.shape, generator=torch.Generator().manual_seed(1))
    (out * g).sum().backward()
    return out.detach(), [x.grad for x in inputs]


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("path", ["fused", "explicit", "auto"])
@pytest.mark.parametrize("kind", ["none", "padding", "causal", "causal+padding"])
def test_equals_torch_multihead_attention(bias, path, kind, tuning):
    # auto: need_weights=False with few keys on CPU, which takes the explicit path
    need_weights = path == "explicit"
    if path == "fused":
        tuning(fused_attention_min_keys=0)
    torch.manual_seed(0)
    d, h, B, T = 32, 4, 3, 7
    ours = MultiHeadAttention(d, d, d, d, h, 0.0, bias=bias).eval()
    if bias:  # make the biases non-trivial
        for lin in (ours.W_q, ours.W_k, ours.W_v, ours.W_o):
            nn.init.normal_(lin.bias)
    ref = copy_to_torch_mha(ours, bias).eval()
    valid_lens = torch.tensor([7, 3, 5])
    pad = torch.arange(T)[None, :] >= valid_lens[:, None]  # True = padding
    causal_block = torch.triu(torch.ones(T, T, dtype=torch.bool), 1)  # True = not allowed
    use_pad, use_causal = "padding" in kind, "causal" in kind

    def ours_fn(q, k, v):
        return ours(q, k, v, valid_lens if use_pad else None, causal=use_causal,
                    need_weights=need_weights)

    def ref_fn(q, k, v):
        return ref(q, k, v, key_padding_mask=pad if use_pad else None,
                   attn_mask=causal_block if use_causal else None, need_weights=False)[0]

    q, k, v = torch.randn(B, T, d), torch.randn(B, T, d), torch.randn(B, T, d)
    out1, grads1 = run_with_grads(ours_fn, q, k, v)
    out2, grads2 = run_with_grads(ref_fn, q, k, v)
    torch.testing.assert_close(out1, out2, atol=1e-5, rtol=1e-5)
    for g1, g2 in zip(grads1, grads2, strict=True):
        torch.testing.assert_close(g1, g2, atol=1e-5, rtol=1e-5)


def test_self_attention_equals_torch_with_key_mask_argument():
    """Self-attention with a boolean key_mask (True = real key),
    against torch's key_padding_mask (True = padding): the same masking, opposite polarity."""
    torch.manual_seed(0)
    d, h = 16, 2
    ours = MultiHeadAttention(d, d, d, d, h, 0.0, bias=True).eval()
    ref = copy_to_torch_mha(ours, True).eval()
    X = torch.randn(2, 5, d)
    pad = torch.tensor([[False] * 5, [False, False, True, True, True]])
    out1, (g1,) = run_with_grads(lambda x: ours(x, x, x, key_mask=~pad), X)
    out2, (g2,) = run_with_grads(lambda x: ref(x, x, x, key_padding_mask=pad)[0], X)
    torch.testing.assert_close(out1, out2, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(g1, g2, atol=1e-5, rtol=1e-5)


MASK_KINDS = {
    "none": {},
    "valid_lens_1d": {"valid_lens": torch.tensor([6, 2, 4])},
    "valid_lens_2d": {"valid_lens": torch.tensor([[1, 2, 3, 4, 5, 6], [6] * 6,
                                                  [2, 2, 3, 0, 4, 5]])},
    "valid_lens_zero": {"valid_lens": torch.tensor([0, 3, 6])},
    "key_mask": {"key_mask": torch.arange(6)[None, :] < torch.tensor([[6], [1], [3]])},
    "causal": {"causal": True},
    "causal+valid_lens": {"causal": True, "valid_lens": torch.tensor([6, 2, 4])},
}


@pytest.mark.parametrize("kind", sorted(MASK_KINDS))
@pytest.mark.parametrize("self_attention", [False, True])
def test_fused_path_equals_explicit_path(kind, self_attention, tuning):
    tuning(fused_attention_min_keys=0)  # short keys: fused too
    torch.manual_seed(0)
    d, h, B = 24, 3, 3
    K = 6
    Q = K if self_attention or kind in ("causal", "causal+valid_lens", "valid_lens_2d") else 5
    mha = MultiHeadAttention(d, d, d, d, h, 0.0, bias=True).eval()
    kwargs = MASK_KINDS[kind]
    if self_attention:
        fn = lambda x, y: mha(x, x, x, **kwargs, need_weights=need)
    else:
        fn = lambda x, y: mha(x, y, y, **kwargs, need_weights=need)
    q, kv = torch.randn(B, Q, d), torch.randn(B, K, d)
    need = True
    out_explicit, grads_explicit = run_with_grads(fn, q, kv)
    need = False
    out_fused, grads_fused = run_with_grads(fn, q, kv)
    assert not torch.isnan(out_fused).any()
    torch.testing.assert_close(out_fused, out_explicit, atol=1e-5, rtol=1e-5)
    for g1, g2 in zip(grads_fused, grads_explicit, strict=True):
        torch.testing.assert_close(g1, g2, atol=1e-5, rtol=1e-5)
    if kind == "valid_lens_zero":  # a query with no key to attend to: output is W_o's bias
        torch.testing.assert_close(out_fused[0], mha.W_o.bias.expand(Q, d).detach())


def test_few_queries_take_the_fused_kernel_in_cpu_inference_only(tuning):
    """At most `fused_attention_max_queries` rows of queries (batch x heads x queries) take
    the fused kernel over few keys in CPU inference (no weights returned), with the
    explicit path's numbers; more rows, training (dropout on, or gradients) and kept
    weights take the explicit path."""
    torch.manual_seed(0)
    dropout = nn.Dropout(0.1).eval()
    q, k, v = torch.randn(2, 4, 5, 8), torch.randn(2, 4, 7, 8), torch.randn(2, 4, 7, 8)
    mask = torch.arange(7)[None, None, None, :] < torch.tensor([7, 4])[:, None, None, None]
    explicit, weights = kernels.explicit_attention(q, k, v, mask, dropout)
    tuning(fused_attention_max_queries=40)  # 2 x 4 x 5 queries: few
    with torch.inference_mode():
        fused, none = kernels.attend(q, k, v, mask, dropout)
        assert none is None
        torch.testing.assert_close(fused, explicit, rtol=1e-6, atol=1e-6)
        out, kept = kernels.attend(q, k, v, mask, dropout, keep_weights=True)
        assert torch.equal(kept, weights) and torch.equal(out, explicit)
        tuning(fused_attention_max_queries=39)
        assert torch.equal(kernels.attend(q, k, v, mask, dropout)[1], weights)
    tuning(fused_attention_max_queries=40)
    grad_q = q.clone().requires_grad_(True)
    assert kernels.attend(grad_q, k, v, mask, dropout)[1] is not None  # gradients
    with torch.inference_mode():
        assert kernels.attend(q, k, v, mask, dropout.train())[1] is not None  # dropout


@pytest.mark.parametrize("bias", [False, True])
def test_self_attention_projection_same_with_and_without_gradients(bias):
    """Training projects q, k, v with one matmul over the concatenated weights, decoding
    (no gradients) with three: the same numbers."""
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 16, 16, 16, 4, 0.0, bias=bias).eval()
    X = torch.randn(3, 5, 16)
    valid_lens = torch.tensor([5, 2, 4])
    with_grad = attention(X, X, X, valid_lens)
    with torch.no_grad():
        without = attention(X, X, X, valid_lens)
    assert with_grad.requires_grad and not without.requires_grad
    torch.testing.assert_close(with_grad.detach(), without, rtol=1e-6, atol=1e-6)


def test_dropout_only_in_training():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 16, 16, 16, 2, 0.5)
    X = torch.randn(2, 5, 16)
    mha.eval()
    torch.testing.assert_close(mha(X, X, X), mha(X, X, X))
    mha.train()
    assert not torch.allclose(mha(X, X, X), mha(X, X, X))


def test_kv_cache_self_and_cross_attention_equal_full():
    torch.manual_seed(0)
    d, h, B, T, S = 16, 4, 2, 6, 5
    self_attn = MultiHeadAttention(d, d, d, d, h, 0.0, bias=True).eval()
    cross_attn = MultiHeadAttention(d, d, d, d, h, 0.0, bias=True).eval()
    X, memory = torch.randn(B, T, d), torch.randn(B, S, d)
    src_lens = torch.tensor([5, 3])
    full_self = self_attn(X, X, X, causal=True)
    full_cross = cross_attn(X, memory, memory, src_lens)
    self_cache, cross_cache = KVCache(), KVCache(static=True)
    steps_self, steps_cross = [], []
    for t in range(T):
        x = X[:, t:t + 1]
        steps_self.append(self_attn(x, x, x, causal=True, cache=self_cache))
        steps_cross.append(cross_attn(x, memory, memory, src_lens, cache=cross_cache))
    assert self_cache.length == T and cross_cache.length == S
    torch.testing.assert_close(torch.cat(steps_self, 1), full_self, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(torch.cat(steps_cross, 1), full_cross, atol=1e-5, rtol=1e-5)
    # Several new steps at once on top of a cache: causal offsets count the cached past.
    cache = KVCache()
    first = self_attn(X[:, :2], X[:, :2], X[:, :2], causal=True, cache=cache)
    rest = self_attn(X[:, 2:], X[:, 2:], X[:, 2:], causal=True, cache=cache)
    torch.testing.assert_close(torch.cat([first, rest], 1), full_self, atol=1e-5, rtol=1e-5)


def test_buffer_pool_hands_out_the_smallest_kept_buffer_that_fits_and_keeps_the_largest():
    pool = BufferPool(max_bytes=4 * (100 + 60))  # room for the 100 and the 60, not the 30
    like = torch.zeros(1)
    fresh = pool.take(10, like)
    assert fresh.numel() == 20 and fresh.dtype == torch.float32  # new: twice, room to grow
    kept = [torch.empty(n) for n in (30, 100, 60)]
    pool.give(kept)
    assert pool.take(70, like) is kept[1]  # the one that fits
    assert pool.take(20, like) is kept[2]  # the smallest that fits (the 30 was dropped)
    assert pool.take(20, like).numel() == 40  # none kept: new
    pool.give([torch.empty(50, dtype=torch.float64), torch.empty(50, device="meta")])
    assert pool.take(10, like).dtype == torch.float32  # another dtype is not handed out
    assert [b.device.type for b in pool.kept] == ["cpu"]  # nor kept off the CPU
    pool.clear()
    assert pool.take(5, torch.zeros(1, dtype=torch.float64)).numel() == 10


def test_buffers_made_in_inference_mode_are_handed_out_only_there():
    """PyTorch forbids writing a tensor made under `torch.inference_mode` outside it: a
    search in inference mode, then one without, both run (the second on new buffers)."""
    pool = BufferPool(max_bytes=2 ** 20)
    k = torch.randn(2, 4, 1, 8)

    def decode() -> torch.Tensor:
        cache = KVCache(pool=pool)
        for _ in range(3):
            cache.append(k, k)
            cache.reorder(torch.tensor([1, 0]))
        keys = cache.keys.clone()
        cache.release()
        return keys

    with torch.inference_mode():
        expected = decode()
    made_there = {b.data_ptr() for b in pool.kept}
    with torch.no_grad():
        assert torch.equal(decode(), expected)
    with torch.inference_mode():
        assert torch.equal(decode(), expected)
    assert made_there <= {b.data_ptr() for b in pool.kept}


def test_a_released_cache_gives_the_next_cache_its_buffers_whatever_they_hold():
    """`KVCache.release` gives its buffers to the pool; a later cache writes into them
    (the same memory, no new allocation) and reads only what it wrote: buffers filled with
    NaN give the same attention outputs as new ones."""
    torch.manual_seed(0)
    d, h, B, T = 16, 4, 3, 7
    attn = MultiHeadAttention(d, d, d, d, h, 0.0, bias=True).eval()
    X = torch.randn(B, T, d)
    rows = torch.tensor([2, 0, 0])

    def decode(cache):
        out = []
        for t in range(T):
            out.append(attn(X[:, t:t + 1], X[:, t:t + 1], X[:, t:t + 1], cache=cache))
            cache.reorder(rows)  # as beam search does between steps
        return torch.cat(out, 1)

    pool = BufferPool(max_bytes=2 ** 20)
    first = KVCache(pool=pool)
    expected = decode(first)
    used = {b.data_ptr() for b in first._buffers + first._spare + first._outgrown}
    first.release()
    assert first.length == 0 and first.keys is None
    for buffer in pool.kept:
        buffer.fill_(float("nan"))
    second = KVCache(pool=pool)
    assert torch.equal(decode(second), expected)
    assert {b.data_ptr() for b in second._buffers + second._spare} <= used


def test_scaled_dot_product_formula():
    """One head, no projections: softmax(QK^T / sqrt(d)) V written out by hand."""
    torch.manual_seed(0)
    from transformer.model.attention import DotProductAttention
    att = DotProductAttention(0.0)
    Q, K, V = torch.randn(2, 3, 8), torch.randn(2, 5, 8), torch.randn(2, 5, 4)
    expected = torch.softmax(Q @ K.transpose(1, 2) / math.sqrt(8), -1) @ V
    torch.testing.assert_close(att(Q, K, V), expected)


def test_padding_mask_built_once_equals_valid_lens_in_every_block():
    """The encoder and decoder build the source's (batch, src_len) key mask once and pass it
    to every block: the same outputs, bit for bit, as each block masking by valid_lens."""
    from transformer.model.blocks import DecoderBlock, EncoderBlock
    from transformer.model.masks import key_padding_mask

    torch.manual_seed(0)
    X, Y = torch.randn(3, 40, 16), torch.randn(3, 6, 16)  # 40 keys: the fused path on CPU
    valid_lens = torch.tensor([40, 17, 1])
    key_mask = key_padding_mask(valid_lens, 40)
    assert key_mask.shape == (3, 40) and key_mask.sum(1).tolist() == [40, 17, 1]
    enc, dec = EncoderBlock(16, 32, 4, 0.0).eval(), DecoderBlock(16, 32, 4, 0.0).eval()
    assert torch.equal(enc(X, valid_lens), enc(X, key_mask=key_mask))
    assert torch.equal(dec(Y, X, valid_lens), dec(Y, X, enc_key_mask=key_mask))
    short = X[:, :5], torch.tensor([5, 3, 1])  # few keys: the explicit path on CPU
    assert torch.equal(enc(short[0], short[1]),
                       enc(short[0], key_mask=key_padding_mask(short[1], 5)))


# ---- recording and head masks: the layer's own context managers ----------------------------

def test_recording_keeps_the_books_masked_softmax_per_head():
    """`recording()` keeps what the book's path computes: masked_softmax(QK^T / sqrt(d))
    per head, with the same output as a pass that records nothing (there: the fused path)."""
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 16, 16, 16, 4, 0.0, bias=True).eval()
    X, Y = torch.randn(2, 3, 16), torch.randn(2, 60, 16)  # 60 keys: the fused path on CPU
    valid_lens = torch.tensor([60, 17])
    plain = mha(X, Y, Y, valid_lens)
    with mha.recording() as record:
        assert mha.is_recording and record.weights is None
        recorded = mha(X, Y, Y, valid_lens)
    q, k = transpose_qkv(mha.W_q(X), 4), transpose_qkv(mha.W_k(Y), 4)  # (batch * heads, ...)
    scores = torch.bmm(q, k.transpose(1, 2)) / math.sqrt(4)
    expected = masked_softmax(scores, valid_lens.repeat_interleave(4))
    torch.testing.assert_close(record.weights, expected.unflatten(0, (2, 4)))
    torch.testing.assert_close(recorded, plain, atol=1e-5, rtol=1e-5)
    # On exit the layer keeps nothing and records nothing; the record keeps its weights.
    assert not mha.is_recording and mha.attention.attention_weights is None
    kept = record.weights
    mha(X, Y, Y, valid_lens, need_weights=True)
    assert record.weights is kept


def test_recording_ends_on_an_exception_and_nests():
    torch.manual_seed(0)
    mha = MultiHeadAttention(8, 8, 8, 8, 2, 0.0).eval()
    X = torch.randn(1, 3, 8)
    with pytest.raises(RuntimeError, match="inside"), mha.recording():
        mha(X, X, X)
        raise RuntimeError("inside")
    assert not mha.is_recording and mha.attention.attention_weights is None
    with mha.recording() as outer:
        with mha.recording() as inner:
            mha(X, X, X)
        assert inner.weights is outer.weights and mha.is_recording  # the outer still records
        mha(X[:, :2], X[:, :2], X[:, :2])
        assert outer.weights.shape == (1, 2, 2, 2) and inner.weights.shape == (1, 2, 3, 3)
    assert not mha.is_recording


def test_masking_heads_restores_the_previous_mask():
    torch.manual_seed(0)
    mha = MultiHeadAttention(16, 16, 16, 16, 4, 0.0, bias=True).eval()
    X = torch.randn(2, 3, 16)
    plain = mha(X, X, X)
    with mha.masking_heads(torch.zeros(4)):
        torch.testing.assert_close(mha(X, X, X), mha.W_o.bias.expand(2, 3, 16))
        with pytest.raises(RuntimeError, match="inside"), mha.masking_heads(torch.ones(4)):
            raise RuntimeError("inside")
        assert torch.equal(mha.head_mask, torch.zeros(4))  # the outer mask is back
        with pytest.raises(ValueError, match="cannot prune heads inside masking_heads"):
            mha.prune_heads([0])
    assert mha.head_mask is None and torch.equal(mha(X, X, X), plain)
    with pytest.raises(ValueError, match=r"one entry per head \(4\), got shape \(3,\)"), \
            mha.masking_heads(torch.ones(3)):
        pass


def test_short_softmax_equals_pytorchs_with_and_without_gradients():
    """On a CPU, rows shorter than the tuning table's short_softmax_keys are computed as
    exp(x - max) / sum: the same weights as F.softmax, masked entries (the dtype's minimum)
    exactly 0; with gradients too (its own backward: gradcheck in float64, and F.softmax's
    gradient in float32); a bf16 row in float32, nearer float64's softmax than bf16's own."""
    torch.manual_seed(0)
    for keys in (1, 2, 7, hardware.TUNING.short_softmax_keys - 1):
        X = torch.randn(6, 3, keys) * 4
        X[0, :, 1:] = torch.finfo(X.dtype).min  # one key left
        with torch.no_grad():
            short = kernels.softmax(X)
        torch.testing.assert_close(short, torch.softmax(X, -1), rtol=1e-6, atol=1e-7)
        if keys > 1:
            assert torch.all(short[0, :, 1:] == 0)
        ours, theirs = (X.clone().requires_grad_() for _ in range(2))
        weights = kernels.softmax(ours)
        grad = torch.randn_like(weights)
        weights.backward(grad)
        torch.softmax(theirs, -1).backward(grad)
        torch.testing.assert_close(weights, torch.softmax(X, -1), rtol=1e-6, atol=1e-7)
        torch.testing.assert_close(ours.grad, theirs.grad, rtol=1e-5, atol=1e-6)
    X = torch.randn(4, 2, 5, dtype=torch.float64, requires_grad=True)
    assert kernels.softmax(X).grad_fn.name() != torch.softmax(X, -1).grad_fn.name()
    assert torch.autograd.gradcheck(kernels.softmax, (X,))
    for keys in (5, hardware.TUNING.short_softmax_keys + 5):  # short and long rows
        X = (torch.randn(64, keys) * 4).bfloat16().requires_grad_()
        exact = torch.softmax(X.double(), -1)
        assert kernels.softmax(X).dtype == torch.bfloat16
        ours = (kernels.softmax(X).double() - exact).abs().max()
        assert ours <= (torch.softmax(X, -1).double() - exact).abs().max()
    masked = masked_softmax(torch.randn(2, 3, 4), torch.tensor([0, 2]))  # a row with no key
    assert torch.all(masked[0] == 0) and not torch.isnan(masked).any()


@pytest.mark.parametrize("queries, keys", [(1, 1), (1, 5), (1, 12), (3, 4), (2, 13)])
def test_weighted_values_equal_bmm(queries, keys):
    """Below CPU_SMALL_BMM multiply-adds per matrix, inference sums weight x value over the
    keys: the numbers of torch.bmm."""
    torch.manual_seed(0)
    weights = torch.softmax(torch.randn(40, queries, keys), -1)
    values = torch.randn(40, keys, 8)
    with torch.no_grad():
        out = kernels.weighted_values(weights, values)
    torch.testing.assert_close(out, torch.bmm(weights, values), rtol=1e-6, atol=1e-6)


def test_decoding_steps_same_with_and_without_the_few_keys_paths(tuning):
    """Step-by-step self- and cross-attention (few keys, one or a few queries) give the same
    outputs through the short softmax and the weighted sum as through F.softmax and bmm
    (forced by thresholds of 0)."""
    torch.manual_seed(0)
    d, h, B, T, S = 32, 4, 3, 9, 7
    self_attn = MultiHeadAttention(d, d, d, d, h, 0.0, bias=True).eval()
    cross_attn = MultiHeadAttention(d, d, d, d, h, 0.0, bias=True).eval()
    X, memory, src_lens = torch.randn(B, T, d), torch.randn(B, S, d), torch.tensor([7, 3, 5])

    def steps() -> torch.Tensor:
        self_cache, cross_cache, out = KVCache(), KVCache(static=True), []
        with torch.no_grad():
            for t in range(T):
                x = X[:, t:t + 1]
                y = self_attn(x, x, x, causal=True, cache=self_cache)
                out.append(cross_attn(y, memory, memory, src_lens, cache=cross_cache))
        return torch.cat(out, 1)

    fast = steps()
    tuning(short_softmax_keys=0, small_bmm_products=0)
    torch.testing.assert_close(fast, steps(), rtol=1e-5, atol=1e-6)
