"""The layers written out because PyTorch's generic ones are slow on CPU.

- `Linear` / `linear`: `nn.Linear` / `F.linear` that, for float32 inference on CPU, multiply
  through the library that is faster on the CPU at hand (`hardware.TUNING.float32_library`):
  oneDNN (`torch.ops.mkldnn._linear_pointwise`), which picks its kernels by the CPU's
  instruction set, or the BLAS `F.linear` calls (MKL's sgemm), whose AVX-512 kernels run on
  Intel's CPUs only. Training, autocast and other devices take `F.linear`.
- `Dropout`: `nn.Dropout` with a cheaper random mask on CPU: `torch.bernoulli_` draws a float
  per element, this draws one random byte per element and compares it with a threshold.
- `linear_label_smoothed_cross_entropy`: the output projection and the label-smoothed loss
  as one autograd function that works through the target tokens in chunks of rows, writing
  the gradient `softmax - smoothed target` of each chunk and multiplying it into the
  gradients of the hidden states and the weight right away. The (tokens, vocabulary) logits
  are never materialized: a fresh logits-sized tensor costs page faults on every step, while
  a chunk stays in cache.

How much each saves is measured in docs/benchmarks.md ("The training step against
`nn.Transformer`"); the chunks' sizes are the tuning table's (`hardware.MEASURED`).
Both use PyTorch's random generator and plain tensor ops, so seeds and devices behave as usual.
The int8 form of the linear layers is `int8.py`'s.
"""

from __future__ import annotations

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from .. import hardware

__all__ = ["Dropout", "Linear", "linear", "default_chunk_rows",
           "linear_label_smoothed_cross_entropy"]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN for float32 inference on CPU where the
    tuning table's `float32_library` is "onednn"."""
    if (hardware.TUNING.float32_library == "onednn" and x.device.type == "cpu"
            and x.dtype == weight.dtype == torch.float32 and not torch.is_autocast_enabled("cpu")
            and not (torch.is_grad_enabled() and (x.requires_grad or weight.requires_grad
                                                  or (bias is not None
                                                      and bias.requires_grad)))):
        return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


class Linear(nn.Linear):
    """`nn.Linear` computed by `linear` (the same parameters and state dict)."""

    def forward(self, x: Tensor) -> Tensor:
        return linear(x, self.weight, self.bias)


class Dropout(nn.Dropout):
    """`nn.Dropout` that, on CPU, draws its mask from one random byte per element.

    The drop probability is rounded to a multiple of 1/256 there (0.3 -> 77/256 = 0.301); on
    other devices, or for p in {0, 1}, this is exactly `nn.Dropout`.
    """

    def forward(self, X: Tensor) -> Tensor:
        if not self.training:  # as nn.Dropout: X itself, without the calls (decoding's steps)
            return X
        threshold = round(self.p * 256)
        if X.device.type != "cpu" or not 0 < threshold < 256:
            return super().forward(X)
        keep = torch.empty(X.shape, dtype=torch.uint8).random_() >= threshold  # P = 1 - t/256
        return X * keep.to(X.dtype).mul_(256 / (256 - threshold))


def default_chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Rows per chunk of `linear_label_smoothed_cross_entropy` on `device`: the tuning
    table's logits per chunk (~16 MB on a CPU: the chunk stays in cache; on a GPU a batch in
    one or two chunks), but at least its `loss_min_chunk_rows`."""
    tuning = hardware.TUNING
    logits = (tuning.loss_chunk_logits_gpu if device.type == "cuda"
              else tuning.loss_chunk_logits_cpu)
    return max(tuning.loss_min_chunk_rows, logits // vocab_size)


class _LinearLabelSmoothedCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and both gradients, chunk by chunk; backward scales them."""

    @staticmethod
    def forward(ctx, hidden: Tensor, weight: Tensor, bias: Tensor | None, target: Tensor,
                epsilon: float, chunk_rows: int) -> Tensor:
        V = weight.shape[0]
        acc = torch.promote_types(weight.dtype, torch.float32)  # float32, or float64
        loss = torch.zeros((), dtype=acc, device=hidden.device)
        grad_hidden = torch.empty_like(hidden)  # (N, d)
        grad_weight = torch.zeros(weight.shape, dtype=acc, device=weight.device)
        grad_bias = None if bias is None else torch.zeros(bias.shape, dtype=acc,
                                                          device=bias.device)
        for start in range(0, len(hidden), chunk_rows):
            h, t = hidden[start:start + chunk_rows], target[start:start + chunk_rows, None]
            logits = torch.mm(h, weight.t())  # (n, V); a bf16 matmul under autocast
            if bias is not None:
                logits = logits + bias
            logits = logits.to(acc)
            lse = torch.logsumexp(logits, dim=1, keepdim=True)  # (n, 1)
            # -log p_y = lse - x_y;  -mean_v log p_v = lse - mean_v x_v
            loss += (lse.sum() - (1 - epsilon) * logits.gather(1, t).sum()
                     - epsilon / V * logits.sum())
            # d loss / d logits = softmax - ((1 - epsilon) * one_hot(y) + epsilon / V)
            G = logits.sub_(lse).exp_().sub_(epsilon / V)  # in place: (n, V)
            G.scatter_add_(1, t, G.new_full(t.shape, epsilon - 1))
            G = G.to(weight.dtype)
            grad_hidden[start:start + chunk_rows] = torch.mm(G, weight)  # (n, d)
            grad_weight += torch.mm(G.t(), h)  # (V, d)
            if grad_bias is not None:
                grad_bias += G.sum(0)  # (V,)
        ctx.save_for_backward(grad_hidden, grad_weight.to(weight.dtype),
                              None if bias is None else grad_bias.to(bias.dtype))
        return loss

    @staticmethod
    def backward(ctx, grad_loss: Tensor):
        grad_hidden, grad_weight, grad_bias = ctx.saved_tensors
        return (grad_hidden * grad_loss, grad_weight * grad_loss,
                None if grad_bias is None else grad_bias * grad_loss, None, None, None)


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
