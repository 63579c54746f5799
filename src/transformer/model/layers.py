"""The layers written out because PyTorch's generic ones are slow on CPU.

- `Linear` / `linear`: `nn.Linear` / `F.linear` that, for float32 inference on CPU, multiply
  through the library that is faster on the CPU at hand (`hardware.TUNING.float32_library`):
  oneDNN (`torch.ops.mkldnn._linear_pointwise`), which picks its kernels by the CPU's
  instruction set, or the BLAS `F.linear` calls (MKL's sgemm), whose AVX-512 kernels run on
  Intel's CPUs only; where MKL is the library on a CPU not Intel's, the output projection
  at a decoding step's rows goes to oneDNN (`float32_onednn_rows`), and where oneDNN is the
  library on an AMD CPU, the other products' few rows go to MKL (`float32_blas_rows`).
  Training, autocast and other devices take `F.linear`. oneDNN reads a wide weight from a
  copy packed into its layout once (`_packed_for_onednn`).
  `transpose_linear_weights` stores a loaded translator's weights in the layout MKL
  multiplies a decoding step's few rows fastest.
- `Dropout`: `nn.Dropout` with a cheaper random mask on CPU: `torch.bernoulli_` draws a float
  per element, this compares one random byte per element with a threshold, seven bytes
  from each 64-bit draw (`random_bytes`).
- `linear_label_smoothed_cross_entropy`: the output projection and the label-smoothed loss
  as one autograd function that works through the target tokens in chunks of rows, one
  reused buffer for a chunk's logits: their logsumexp and softmax, in place, multiplied
  into the gradients of the hidden states and the weight right away; the smoothed target's
  share of the gradients once for all rows. The (tokens, vocabulary) logits are never
  materialized: a fresh logits-sized tensor costs page faults on every step, while a chunk
  stays in cache.

How much each saves is measured in docs/benchmarks.md ("The training step against
`nn.Transformer`"); the chunks' sizes are the tuning table's (`hardware.MEASURED`).
Both use PyTorch's random generator and plain tensor ops, so seeds and devices behave as usual.
The int8 form of the linear layers is `int8.py`'s.
"""

from __future__ import annotations

import sys

import torch
from torch import Tensor, nn
from torch.nn import functional as F
from torch.utils.weak import WeakIdKeyDictionary

from .. import hardware

__all__ = ["Dropout", "Linear", "linear", "may_take_onednn", "transpose_linear_weights",
           "default_chunk_rows", "linear_label_smoothed_cross_entropy"]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN for float32 inference on CPU where the
    tuning table says so. Where its `float32_library` is "onednn": every wide product (at
    least `float32_onednn_min_outputs` outputs: the output projection), and a narrow one
    unless its rows (x's leading dimensions) are in `float32_blas_rows`, a decoding step's
    few rows on CPUs where oneDNN's call costs more than MKL's. Where not: a wide product
    whose rows are in `float32_onednn_rows`, a decoding step's rows on CPUs where MKL's
    kernels for them are slower. The cheap tests come first: every linear layer's call runs
    them."""
    tuning = hardware.TUNING
    rows, wide = x.numel() // max(x.shape[-1], 1), _wide(weight)
    if wide:
        onednn = tuning.float32_library == "onednn" or rows in tuning.float32_onednn_rows
    else:
        onednn = tuning.float32_library == "onednn" and rows not in tuning.float32_blas_rows
    if onednn and _float32_inference_on_cpu(x, weight, bias):
        if wide and rows > 1:  # at 1 row oneDNN's kernel for the plain weight sums otherwise
            weight = _packed_for_onednn(weight)
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


# a wide weight (by identity) -> (its storage and version when packed, oneDNN's packed copy)
_PACKED: WeakIdKeyDictionary = WeakIdKeyDictionary()


def _packed_for_onednn(weight: Tensor) -> Tensor:
    """A frozen `weight` (no gradient: a loaded translator's) in the blocked layout oneDNN's
    kernels read, kept while the weight lives and stays the same (its storage and its
    version: an in-place change repacks it); any other weight as it is.

    Given a plain weight, oneDNN's linear operator reorders it at every call, and for the
    output projection (V x d) that costs more than a decoding step's few rows of products;
    packed once, the products are the same bit for bit from 2 rows on (at 1 row oneDNN takes
    another kernel for the plain weight, whose sums differ, so `linear` keeps that one). The
    copy costs the weight's size in memory. A weight in training stays plain (PyTorch's
    fused optimizers update it without moving its version), as does one made under
    `torch.inference_mode` (no version to check)."""
    if weight.requires_grad or weight.is_inference():
        return weight
    key = (weight.data_ptr(), weight._version)
    kept = _PACKED.get(weight)
    if kept is not None and kept[:2] == key:
        return kept[2]
    packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach())
    _PACKED[weight] = (*key, packed)
    return packed


def may_take_onednn(weight: Tensor) -> bool:
    """Whether `linear` may multiply by `weight` through oneDNN (for some input); where not,
    it is `F.linear` whatever the input, so a caller that binds the weight (the decoding
    step) calls `F.linear` itself."""
    tuning = hardware.TUNING
    return (tuning.float32_library == "onednn"
            or (_wide(weight) and len(tuning.float32_onednn_rows) > 0))


def _wide(weight: Tensor) -> bool:
    """Whether a product by `weight` (out, in) is wide: at least the tuning table's
    `float32_onednn_min_outputs` outputs (the output projection)."""
    return weight.shape[0] >= hardware.TUNING.float32_onednn_min_outputs


def _float32_inference_on_cpu(x: Tensor, weight: Tensor, bias: Tensor | None) -> bool:
    """Whether `linear`'s product is float32 on CPU with nothing to differentiate (no
    autocast, no gradient needed): the products oneDNN's operator can take."""
    return (x.device.type == "cpu" and x.dtype == weight.dtype == torch.float32
            and not torch.is_autocast_enabled("cpu")
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None
                                                      and bias.requires_grad))))


def transpose_linear_weights(model: nn.Module) -> None:
    """Store each float32 CPU weight (out, in) of `model`'s `Linear`s as the transpose of a
    contiguous (in, out) matrix, where `hardware.TUNING.transposed_weights` (MKL's BLAS).

    The parameters stay the same objects with the same values and shapes (state dicts and
    tied weights unchanged); only their memory layout changes, so `F.linear`'s x @ weight.T
    reaches MKL as a plain product instead of one with a transposed operand, which MKL runs
    1.2-1.7x faster at the few rows of a decoding step (docs/benchmarks.md, "Linear weights
    stored transposed for MKL"). `Translator.load` calls it on the model it loaded; a
    model in training keeps the layout it was made with (its backward products and the
    optimizer's state were measured in it).
    """
    if not hardware.TUNING.transposed_weights:
        return
    for module in model.modules():
        weight = module.weight if type(module) is Linear else None
        if (weight is not None and weight.device.type == "cpu"
                and weight.dtype == torch.float32 and weight.is_contiguous()):
            weight.data = weight.data.t().contiguous().t()  # tied weights: changed once


class Linear(nn.Linear):
    """`nn.Linear` computed by `linear` (the same parameters and state dict)."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


class Dropout(nn.Dropout):
    """`nn.Dropout` that, on CPU, draws its mask from one random byte per element
    (`random_bytes`).

    The drop probability is rounded to a multiple of 1/256 there (0.3 -> 77/256 = 0.301); on
    other devices, or for p in {0, 1}, this is exactly `nn.Dropout`.
    """

    def forward(self, X: Tensor) -> Tensor:
        if not self.training:  # as nn.Dropout: X itself, without the calls (decoding's steps)
            return X
        threshold = round(self.p * 256)
        if X.device.type != "cpu" or not 0 < threshold < 256:
            return super().forward(X)
        keep = random_bytes(X.numel()).view(X.shape) >= threshold  # P = 1 - t/256
        return X * keep.to(X.dtype).mul_(256 / (256 - threshold))


def random_bytes(n: int) -> Tensor:
    """`n` uniform random bytes from PyTorch's CPU generator, seven from each 64-bit draw.

    An int64 `random_` is uniform over [0, 2**63): its seven low bytes are uniform, the high
    one is not and is skipped. A draw costs about what a uint8 `random_` costs per byte."""
    draws = torch.empty(-(-n // 7), dtype=torch.int64).random_()
    low = slice(0, 7) if sys.byteorder == "little" else slice(1, 8)
    return draws.view(torch.uint8).view(-1, 8)[:, low].flatten()[:n]  # (n,)


def default_chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Rows per chunk of `linear_label_smoothed_cross_entropy` (and of the log-probabilities
    `loss` computes outside training) on `device`: the tuning table's logits per chunk
    (~16 MB on a CPU: the chunk stays in cache; on a GPU a batch in one or two chunks), but
    at least its `loss_min_chunk_rows`."""
    tuning = hardware.TUNING
    logits = (tuning.loss_chunk_logits_gpu if device.type == "cuda"
              else tuning.loss_chunk_logits_cpu)
    return max(tuning.loss_min_chunk_rows, logits // vocab_size)


def _products_dtype(weight: Tensor) -> torch.dtype:
    """The dtype the loss's matrix products run in: autocast's (bf16) where it is on for a
    float32 weight, else the weight's own."""
    device = weight.device.type
    if torch.is_autocast_enabled(device) and weight.dtype == torch.float32:
        return torch.get_autocast_dtype(device)
    return weight.dtype


class _LinearLabelSmoothedCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and both gradients, chunk by chunk; backward scales them.

    With x = h W^T + b a row's logits, y its reference token, q the smoothed target
    ((1 - eps) on y plus eps / V everywhere), m = max_v x_v and s = sum_v exp(x_v - m):

        loss = lse - (1 - eps) x_y - eps / V sum_v x_v,   lse = m + log s
        d loss / d x = softmax(x) - q,                    softmax(x) = exp(x - m) / s

    Only what needs the (rows, V) logits runs per chunk: the logsumexp and the softmax's
    products, the 1/s applied to the thin side of each (rows, d). The parts of q are the
    same for every chunk and thin, so they run once for all rows: x_y = h . W_y,
    sum_v x_v = h . sum_v W_v, q @ W = (1 - eps) W_y + eps / V sum_v W_v, and q^T H adds
    (1 - eps) h to row y of the weight's gradient and eps / V sum_n h to every row.
    A chunk's logits go into one buffer reused by every chunk: a fresh logits-sized tensor
    costs page faults."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                epsilon: float, chunk_rows: int) -> Tensor:
        (N, d), V = hidden.shape, weight.shape[0]
        acc = torch.promote_types(weight.dtype, torch.float32)  # float32, or float64
        products = _products_dtype(weight)  # bf16 under autocast
        with torch.autocast(hidden.device.type, enabled=False):  # the dtypes are explicit
            H, W = hidden.to(products), weight.to(products)  # (N, d), (V, d)
            lse = torch.empty(N, 1, dtype=acc, device=hidden.device)
            grad_hidden = torch.empty(N, d, dtype=acc, device=hidden.device)
            grad_weight = torch.zeros(V, d, dtype=acc, device=weight.device)
            grad_bias = None if bias is None else torch.zeros(V, dtype=acc, device=bias.device)
            logits = torch.empty(min(chunk_rows, N), V, dtype=acc, device=hidden.device)
            low = None if products == acc else torch.empty_like(logits, dtype=products)
            for start in range(0, N, chunk_rows):
                rows = slice(start, start + chunk_rows)
                h = H[rows]
                x = logits[:len(h)]  # (n, V)
                if low is None:
                    torch.mm(h, W.t(), out=x)
                else:  # the product in bf16, the softmax in float32
                    x.copy_(torch.mm(h, W.t(), out=low[:len(h)]))
                if bias is not None:
                    x += bias
                m = x.amax(1, keepdim=True)  # (n, 1)
                E = x.sub_(m).exp_()  # exp(x - m) = softmax * s, in place
                s = E.sum(1, keepdim=True)  # (n, 1)
                lse[rows] = m + s.log()
                r = s.reciprocal()
                P = E if low is None else low[:len(h)].copy_(E)  # in the products' dtype
                _mm_into(grad_hidden[rows], P, W).mul_(r)  # softmax @ W
                _add_mm(grad_weight, P.t(), (h * r).to(products))  # softmax^T H
                if grad_bias is not None:
                    grad_bias += torch.mv(E.t(), r[:, 0])  # softmax summed over rows
            H, W, target_rows = H.to(acc), W.to(acc), W[target].to(acc)  # W_y: (N, d)
            w_sum, h_sum = W.sum(0), H.sum(0)  # (d,)
            target_logits = (H * target_rows).sum()  # sum_n x_y
            logits_sum = h_sum @ w_sum  # sum_n sum_v x_v
            if bias is not None:
                target_logits = target_logits + bias.to(acc)[target].sum()
                logits_sum = logits_sum + N * bias.to(acc).sum()
            loss = lse.sum() - (1 - epsilon) * target_logits - epsilon / V * logits_sum
            grad_hidden -= (1 - epsilon) * target_rows + epsilon / V * w_sum
            grad_weight.index_add_(0, target, H, alpha=epsilon - 1)
            grad_weight -= epsilon / V * h_sum
            if grad_bias is not None:
                grad_bias.index_add_(0, target, grad_bias.new_full((N,), epsilon - 1))
                grad_bias -= epsilon / V * N
        ctx.save_for_backward(grad_hidden.to(hidden.dtype), grad_weight.to(weight.dtype),
                              None if bias is None else grad_bias.to(bias.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        return (grad_hidden * grad_loss, grad_weight * grad_loss,
                None if grad_bias is None else grad_bias * grad_loss, None, None, None)


def _mm_into(out: Tensor, a: Tensor, b: Tensor) -> Tensor:
    """out = a @ b, straight into `out` where the dtypes agree."""
    if out.dtype == a.dtype:
        return torch.mm(a, b, out=out)
    return out.copy_(torch.mm(a, b))


def _add_mm(out: Tensor, a: Tensor, b: Tensor) -> None:
    """out += a @ b, in one call where the dtypes agree."""
    if out.dtype == a.dtype:
        out.addmm_(a, b)
    else:
        out += torch.mm(a, b)


def linear_label_smoothed_cross_entropy(hidden: Tensor, weight: Tensor, target: Tensor,
                                        epsilon: float, chunk_rows: int | None = None, *,
                                        bias: Tensor | None = None) -> Tensor:
    """Summed label-smoothed cross-entropy of the logits `hidden @ weight.T + bias` against
    `target`.

    hidden (N, d) are the states of the N target tokens to score (select real tokens first),
    weight (V, d) and bias (V,) or None the output projection, target (N,) token ids. Equals
    `nn.CrossEntropyLoss(reduction="sum", label_smoothing=epsilon)(F.linear(hidden, weight,
    bias), target)`
    in value and gradients: the target distribution is (1 - epsilon) on the reference token
    plus epsilon / V everywhere. The softmax is computed in float32 whatever the matmul's
    dtype (float64 stays float64). `chunk_rows` trades cache use for matmul size; the
    default (`default_chunk_rows`) is ~4M logits (16 MB) per chunk on a CPU, 64M on a GPU,
    but at least the tuning table's `loss_min_chunk_rows`: with a large vocabulary (OPUS-MT's
    58k pieces) fewer rows make the (V, n) @ (n, d) gradient product too thin to run fast.
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1] \
            or target.shape != hidden.shape[:1]:
        raise ValueError(f"expected hidden (N, d), weight (V, d) and target (N,), got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)} and {tuple(target.shape)}")
    chunk_rows = chunk_rows or default_chunk_rows(weight.shape[0], hidden.device)
    return _LinearLabelSmoothedCrossEntropy.apply(hidden, weight, bias, target, float(epsilon),
                                                  chunk_rows)
