"""model.layers' Dropout, linear and linear_label_smoothed_cross_entropy against PyTorch's
own."""

from __future__ import annotations

import gc

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.profiler import ProfilerActivity, profile

from transformer.model import layers
from transformer.model.layers import (
    Dropout,
    Linear,
    default_chunk_rows,
    linear_label_smoothed_cross_entropy,
    may_take_onednn,
    random_bytes,
    transpose_linear_weights,
)
from transformer.model.transformer import ModelConfig, Transformer


def operators(f) -> set[str]:
    """The names of the operators `f()` runs (torch.profiler)."""
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        f()
    return {event.name for event in prof.events()}


@pytest.mark.parametrize("library", ["onednn", "blas"])
def test_linear_multiplies_float32_inference_through_the_library_chosen(library, tuning):
    """Whichever library the tuning table's `float32_library` names (forced here), `Linear`
    computes `F.linear` in inference (within float32 rounding), through oneDNN's operator for
    "onednn" only; with gradients it is `F.linear` itself, exactly."""
    tuning(float32_library=library, float32_blas_rows=range(0), float32_onednn_rows=range(0))
    torch.manual_seed(0)
    layer, x = Linear(64, 96), torch.randn(5, 7, 64)
    with torch.no_grad():
        out = layer(x)
        names = operators(lambda: layer(x))
    torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias), rtol=1e-5, atol=1e-5)
    assert ("mkldnn::_linear_pointwise" in names) == (library == "onednn")
    trained = layer(x)
    assert trained.requires_grad and torch.equal(trained, F.linear(x, layer.weight, layer.bias))
    assert "mkldnn::_linear_pointwise" not in operators(lambda: layer(x))


def test_linear_sends_a_wide_products_few_rows_to_onednn_where_the_table_says(tuning):
    """Where MKL's BLAS is the float32 library, `linear` multiplies through oneDNN a product
    with at least `float32_onednn_min_outputs` outputs whose rows (the leading dimensions
    together) are in `float32_onednn_rows`, and nothing else: narrower products, other row
    counts and products with gradients take `F.linear`; oneDNN's results equal it within
    float32 rounding, with the weight in either layout. The decoding step binds `F.linear`
    for the weights that never go to oneDNN (`may_take_onednn`)."""
    tuning(float32_library="blas", float32_onednn_min_outputs=96,
           float32_onednn_rows=range(4, 9))
    torch.manual_seed(0)
    wide, narrow = Linear(64, 96), Linear(64, 95)
    transposed = Linear(64, 96)
    transposed.weight.data = wide.weight.data.t().contiguous().t()
    transposed.bias.data = wide.bias.data.clone()
    assert may_take_onednn(wide.weight) and not may_take_onednn(narrow.weight)
    for shape, onednn in [((3, 64), False), ((4, 64), True), ((2, 4, 64), True),
                          ((8, 64), True), ((9, 64), False), ((3, 3, 64), False)]:
        x = torch.randn(shape)
        for layer, wide_layer in ((wide, True), (transposed, True), (narrow, False)):
            with torch.no_grad():
                out = layer(x)
                names = operators(lambda layer=layer, x=x: layer(x))
            assert ("mkldnn::_linear_pointwise" in names) == (onednn and wide_layer), shape
            torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias),
                                       rtol=1e-5, atol=1e-5)
        assert "mkldnn::_linear_pointwise" not in operators(lambda x=x: wide(x))  # gradients
    tuning(float32_onednn_rows=range(0))
    assert not may_take_onednn(wide.weight)
    tuning(float32_library="onednn")
    assert may_take_onednn(narrow.weight)


def test_linear_sends_a_narrow_products_few_rows_to_mkl_where_the_table_says(tuning):
    """Where oneDNN is the float32 library, `linear` multiplies through MKL's BLAS
    (`F.linear`) a product with fewer than `float32_onednn_min_outputs` outputs whose rows
    are in `float32_blas_rows`; other row counts and wide products (at any rows) take
    oneDNN, and the results equal `F.linear` within float32 rounding. The decoding step
    keeps calling `linear` for every weight (`may_take_onednn`)."""
    tuning(float32_library="onednn", float32_onednn_min_outputs=96,
           float32_blas_rows=range(1, 5))
    torch.manual_seed(0)
    wide, narrow = Linear(64, 96), Linear(64, 95)
    assert may_take_onednn(wide.weight) and may_take_onednn(narrow.weight)
    for shape, narrow_onednn in [((1, 64), False), ((4, 64), False), ((2, 2, 64), False),
                                 ((5, 64), True), ((3, 2, 64), True), ((40, 64), True)]:
        x = torch.randn(shape)
        for layer, onednn in ((wide, True), (narrow, narrow_onednn)):
            with torch.no_grad():
                out = layer(x)
                names = operators(lambda layer=layer, x=x: layer(x))
            assert ("mkldnn::_linear_pointwise" in names) == onednn, (shape, layer)
            torch.testing.assert_close(out, F.linear(x, layer.weight, layer.bias),
                                       rtol=1e-5, atol=1e-5)


def test_a_frozen_wide_weight_is_packed_for_onednn_once_and_again_when_it_changes(tuning):
    """oneDNN multiplies a wide product of 2 rows or more by a packed copy of a frozen weight
    (no gradient), made at the first such call and reused while the weight's storage and
    version stay the same: an in-place change or a new storage repacks it, and the copy
    goes with the weight. One row keeps the plain weight. The products equal `F.linear`
    within float32 rounding."""
    tuning(float32_library="onednn", float32_onednn_min_outputs=96)
    torch.manual_seed(0)
    layer, x = Linear(64, 96).requires_grad_(False), torch.randn(5, 64)
    assert "mkldnn::_reorder_linear_weight" not in operators(lambda: layer(x[:1]))
    assert layer.weight not in layers._PACKED
    assert "mkldnn::_reorder_linear_weight" in operators(lambda: layer(x))
    packed = layers._PACKED[layer.weight][2]
    for rows in (2, 5):
        names = operators(lambda rows=rows: layer(x[:rows]))
        assert "mkldnn::_reorder_linear_weight" not in names
        assert "mkldnn::_linear_pointwise" in names
        torch.testing.assert_close(layer(x[:rows]), F.linear(x[:rows], layer.weight,
                                                             layer.bias))
    assert layers._PACKED[layer.weight][2] is packed
    layer.weight.mul_(2)  # in place: the version moves
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    assert layers._PACKED[layer.weight][2] is not packed
    packed = layers._PACKED[layer.weight][2]
    layer.weight.data = layer.weight.data.t().contiguous().t()  # a new storage
    torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
    assert layers._PACKED[layer.weight][2] is not packed
    kept = len(layers._PACKED)
    layer = None  # the weight goes
    gc.collect()
    assert len(layers._PACKED) == kept - 1
    with torch.inference_mode():  # a weight without a version: never packed
        layer = Linear(64, 96)
        torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        assert layer.weight not in layers._PACKED


def test_a_weight_in_training_is_never_packed(tuning):
    """A weight that takes gradients goes to oneDNN plain in inference (validation during
    training): PyTorch's fused Adam updates it without moving its version, and a packed
    copy would keep the weights of an earlier update."""
    tuning(float32_library="onednn", float32_onednn_min_outputs=96)
    torch.manual_seed(0)
    layer, x = Linear(64, 96), torch.randn(5, 64)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.1, fused=True)
    for _ in range(2):
        with torch.no_grad():
            torch.testing.assert_close(layer(x), F.linear(x, layer.weight, layer.bias))
        assert layer.weight not in layers._PACKED
        layer(x).square().sum().backward()
        optimizer.step()
        optimizer.zero_grad()


def test_transposed_weights_keep_the_parameters_and_what_the_model_computes(tuning):
    """`transpose_linear_weights` stores each Linear's weight as the transpose of an (in, out)
    matrix: the same parameter objects, values and state dict, the tied output projection
    still the embedding's weight, the model's outputs equal within float32 rounding; it
    leaves the weights alone where the tuning table says so."""
    tuning(float32_library="blas", transposed_weights=True)
    torch.manual_seed(0)
    model = Transformer(ModelConfig(src_vocab_size=50, tgt_vocab_size=50, num_hiddens=32,
                                    ffn_num_hiddens=64, num_heads=4, num_encoder_layers=2,
                                    num_decoder_layers=2, dropout=0.0)).eval()
    src, tgt = torch.randint(4, 50, (3, 9)), torch.randint(4, 50, (3, 6))
    lens = torch.tensor([9, 5, 7])
    with torch.inference_mode():
        before = model(src, lens, tgt)
    state = {name: tensor.clone() for name, tensor in model.state_dict().items()}
    parameters = dict(model.named_parameters())
    assert model.output_projection.weight is model.decoder.embedding.weight
    transpose_linear_weights(model)
    linears = [m for m in model.modules() if type(m) is Linear]
    assert linears and all(m.weight.t().is_contiguous() and not m.weight.is_contiguous()
                           for m in linears)
    assert dict(model.named_parameters()) == parameters  # the same objects
    assert model.output_projection.weight is model.decoder.embedding.weight
    after_state = model.state_dict()
    assert after_state.keys() == state.keys()
    assert all(torch.equal(after_state[name], state[name]) for name in state)
    with torch.inference_mode():
        torch.testing.assert_close(model(src, lens, tgt), before, rtol=1e-5, atol=1e-5)

    tuning(transposed_weights=False)
    other = nn.Sequential(Linear(8, 4))
    transpose_linear_weights(other)
    assert other[0].weight.is_contiguous()


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
def test_dropout_drops_a_fraction_p_and_keeps_the_mean(p):
    torch.manual_seed(0)
    X = torch.rand(400, 500) + 0.5
    Y = Dropout(p).train()(X)
    dropped = (Y == 0).float().mean().item()
    assert abs(dropped - round(p * 256) / 256) < 0.005
    kept = Y != 0
    torch.testing.assert_close(Y[kept], X[kept] / (1 - round(p * 256) / 256))
    assert abs(Y.mean().item() / X.mean().item() - 1) < 0.01


def test_random_bytes_are_uniform_independent_and_seeded():
    """Every byte value equally often (chi-square), neighbouring bytes uncorrelated (the
    seven taken from one draw and across draws), the same bytes for the same seed."""
    torch.manual_seed(0)
    n = 7 * 200_000 + 3  # not a multiple of 7: the last draw is cut
    b = random_bytes(n)
    assert b.shape == (n,) and b.dtype == torch.uint8
    counts = torch.bincount(b.long(), minlength=256).double()
    expected = n / 256
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 330  # 255 degrees of freedom: p ~ 0.001
    x = b.double() - 127.5
    for lag in (1, 6, 7, 8):
        assert abs((x[:-lag] * x[lag:]).mean().item() / x.var().item()) < 0.01
    torch.manual_seed(0)
    assert torch.equal(random_bytes(n), b)


def test_dropout_gradient_is_the_mask_times_the_scale():
    torch.manual_seed(0)
    X = torch.randn(64, 32, requires_grad=True)
    Y = Dropout(0.3).train()(X)
    Y.sum().backward()
    scale = 256 / (256 - round(0.3 * 256))
    torch.testing.assert_close(X.grad, (Y != 0).float() * scale)


def test_dropout_is_seeded_and_off_in_eval_and_for_p0():
    X = torch.randn(8, 16)
    d = Dropout(0.3).train()
    torch.manual_seed(1)
    a = d(X)
    torch.manual_seed(1)
    b = d(X)
    assert torch.equal(a, b) and not torch.equal(a, d(X))
    assert torch.equal(d.eval()(X), X)
    assert torch.equal(Dropout(0.0).train()(X), X)
    assert torch.equal(Dropout(1.0).train()(X), torch.zeros_like(X))  # nn.Dropout's own


def _hidden_weight_target(N=50, d=12, V=40, dtype=torch.float32):
    torch.manual_seed(0)
    hidden = torch.randn(N, d, dtype=dtype, requires_grad=True)
    weight = (torch.randn(V, d, dtype=dtype) / 2).requires_grad_()
    return hidden, weight, torch.randint(0, V, (N,))


def _reference(hidden, weight, target, epsilon):
    """nn.CrossEntropyLoss over the projected logits, on copies of the inputs."""
    h, w = (x.detach().clone().requires_grad_() for x in (hidden, weight))
    loss = nn.CrossEntropyLoss(reduction="sum", label_smoothing=epsilon)(h @ w.t(), target)
    return loss, h, w


@pytest.mark.parametrize("epsilon", [0.0, 0.1, 0.3])
@pytest.mark.parametrize("chunk_rows", [None, 1, 7, 50, 64])  # whole, one row, remainder...
def test_fused_loss_equals_projection_then_cross_entropy_loss(epsilon, chunk_rows):
    hidden, weight, target = _hidden_weight_target()
    ours = linear_label_smoothed_cross_entropy(hidden, weight, target, epsilon, chunk_rows)
    ref, h, w = _reference(hidden, weight, target, epsilon)
    torch.testing.assert_close(ours, ref, rtol=1e-5, atol=1e-4)
    (2 * ours).backward()  # the upstream gradient scales both gradients
    (2 * ref).backward()
    torch.testing.assert_close(hidden.grad, h.grad, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(weight.grad, w.grad, rtol=1e-5, atol=1e-5)


def test_fused_loss_passes_gradcheck_and_adds_to_a_tied_weights_other_gradient():
    hidden, weight, target = _hidden_weight_target(N=9, d=4, V=6, dtype=torch.float64)
    assert torch.autograd.gradcheck(
        lambda h, w: linear_label_smoothed_cross_entropy(h, w, target, 0.1, chunk_rows=4),
        (hidden, weight))
    # The weight also used elsewhere (tied embedding): autograd adds both gradients.
    tokens = torch.tensor([1, 2, 2])
    (linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1)
     + weight[tokens].sum()).backward()
    ref, h, w = _reference(hidden, weight, target, 0.1)
    (ref + w[tokens].sum()).backward()
    torch.testing.assert_close(weight.grad, w.grad)


def test_fused_loss_under_bf16_autocast_computes_the_softmax_in_float32_and_checks_shapes():
    hidden, weight, target = _hidden_weight_target()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        loss = linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1, chunk_rows=16)
        ref = nn.functional.cross_entropy((hidden @ weight.t()).float(), target,
                                          reduction="sum", label_smoothing=0.1)
    assert loss.dtype == torch.float32
    torch.testing.assert_close(loss, ref, rtol=1e-3, atol=0.0)  # the same bf16 logits
    loss.backward()
    assert hidden.grad.dtype == hidden.dtype and weight.grad.dtype == weight.dtype
    with pytest.raises(ValueError, match=r"expected hidden \(N, d\), weight \(V, d\)"):
        linear_label_smoothed_cross_entropy(hidden[None], weight, target, 0.1)
    with pytest.raises(ValueError, match="expected hidden"):
        linear_label_smoothed_cross_entropy(hidden, weight[:, :3], target, 0.1)


def test_fused_loss_with_an_output_bias_equals_the_biased_projection():
    hidden, weight, target = _hidden_weight_target(N=9, d=4, V=6, dtype=torch.float64)
    bias = torch.randn(6, dtype=torch.float64, requires_grad=True)
    ours = linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1, 4, bias=bias)
    h, w, b = (x.detach().clone().requires_grad_() for x in (hidden, weight, bias))
    ref = nn.CrossEntropyLoss(reduction="sum", label_smoothing=0.1)(
        nn.functional.linear(h, w, b), target)
    torch.testing.assert_close(ours, ref)
    ours.backward()
    ref.backward()
    for mine, theirs in ((hidden, h), (weight, w), (bias, b)):
        torch.testing.assert_close(mine.grad, theirs.grad)


def test_fused_loss_with_a_bias_under_bf16_autocast_takes_the_bf16_products():
    """Under bf16 autocast the products run in bf16 (the hidden states and weight rounded
    to bf16) and the rest in float32: the loss and gradients of float64 cross-entropy over
    the rounded inputs, to bf16's precision."""
    hidden, weight, target = _hidden_weight_target(N=50, d=12, V=40)
    bias = torch.randn(40, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ours = linear_label_smoothed_cross_entropy(hidden, weight, target, 0.1, 16, bias=bias)
    ours.backward()
    h, w = (x.detach().bfloat16().double().requires_grad_() for x in (hidden, weight))
    b = bias.detach().double().requires_grad_()
    ref = nn.CrossEntropyLoss(reduction="sum", label_smoothing=0.1)(
        nn.functional.linear(h, w, b), target)
    ref.backward()
    torch.testing.assert_close(ours.double(), ref, rtol=1e-3, atol=0.0)  # bf16 logits
    for mine, theirs in ((hidden, h), (weight, w), (bias, b)):
        torch.testing.assert_close(mine.grad.double(), theirs.grad, rtol=0.0,
                                   atol=1e-2 * theirs.grad.abs().max().item())


def test_fused_loss_chunks_are_sized_for_the_device(tuning):
    """A CPU chunk holds ~4M logits (cache-sized), a GPU chunk ~64M (an 8k-token batch of an
    8k vocabulary in one chunk); never fewer than the table's loss_min_chunk_rows rows."""
    assert default_chunk_rows(8000, torch.device("cpu")) == 2 ** 22 // 8000 == 524
    assert default_chunk_rows(8000, torch.device("cuda")) == 2 ** 26 // 8000 >= 8192
    assert default_chunk_rows(58101, torch.device("cpu")) == 512
    tuning(loss_chunk_logits_cpu=2 ** 20, loss_min_chunk_rows=64)
    assert default_chunk_rows(8000, torch.device("cpu")) == 2 ** 20 // 8000 == 131
