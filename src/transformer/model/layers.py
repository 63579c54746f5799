"""Operations written out because PyTorch's generic ones are slow on CPU.

- `Linear` / `linear`: `nn.Linear` / `F.linear` that, for float32 inference on CPU, multiply
  through the library that is faster on the CPU at hand (`FLOAT32_LIBRARY`): oneDNN
  (`torch.ops.mkldnn._linear_pointwise`), which picks its kernels by the CPU's instruction
  set, or the BLAS `F.linear` calls (MKL's sgemm), whose AVX-512 kernels run on Intel's CPUs
  only (docs/RESULTS.md, "Engines on every CPU"). Training, autocast and other devices take
  `F.linear`.
- `quantize_int8`: a copy of a model whose linear layers (`nn.Linear` and `Linear`) are
  PyTorch's dynamically quantized int8 ones (`torch.ao.quantization.quantize_dynamic`):
  int8 weights, each input quantized as it comes; CPU only. Our engine's `quantize="int8"`.
  The narrow layers run FBGEMM's kernels, the wide ones (the output projection) oneDNN's
  (`INT8_ONEDNN`).

- `Dropout`: `nn.Dropout` with a cheaper random mask on CPU: `torch.bernoulli_` draws a float
  per element, this draws one random byte per element and compares it with a threshold.
- `linear_label_smoothed_cross_entropy`: the output projection and the label-smoothed loss
  as one autograd function that works through the target tokens in chunks of rows, writing
  the gradient `softmax - smoothed target` of each chunk and multiplying it into the
  gradients of the hidden states and the weight right away. The (tokens, vocabulary) logits
  are never materialized: a fresh logits-sized tensor costs page faults on every step, while
  a chunk stays in cache.

How much each saves is measured in docs/RESULTS.md ("Training speed").

Both use PyTorch's random generator and plain tensor ops, so seeds and devices behave as usual.
"""

from __future__ import annotations

import copy
import functools
import warnings
from collections.abc import Iterable
from typing import TypeVar

import torch
from torch import Tensor, nn
from torch.nn import functional as F

__all__ = ["Dropout", "Linear", "linear", "FLOAT32_LIBRARY", "quantize_int8", "INT8_MAX_OUTPUTS",
           "INT8_ONEDNN", "INT8_ONEDNN_MIN_OUTPUTS", "INT8_ONEDNN_CHUNK_ROWS", "quantize_linears",
           "rows_per_call", "cpu_info", "cpu_vendor", "cpu_has_amx",
           "linear_label_smoothed_cross_entropy"]


def linear(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """`F.linear(x, weight, bias)`, through oneDNN for float32 inference on CPU where
    `FLOAT32_LIBRARY` is "onednn"."""
    if (FLOAT32_LIBRARY == "onednn" and x.device.type == "cpu"
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


def cpu_info(field: str, path: str = "/proc/cpuinfo") -> str | None:
    """A field of the first processor in Linux's /proc/cpuinfo ("vendor_id", "model name",
    "model", "flags"), matched by its whole name ("model" is not "model name"); None where
    that cannot be read."""
    return _first_processor(path).get(field)


@functools.cache
def _first_processor(path: str) -> dict[str, str]:
    """The fields of the first processor's block of a cpuinfo file, read once per process
    (the CPU does not change while it runs); empty where the file cannot be read."""
    fields = {}
    try:
        with open(path) as f:
            for line in f:
                if not line.strip():  # the first block ends
                    break
                key, _, value = line.partition(":")
                fields[key.strip()] = value.strip()
    except OSError:
        pass
    return fields


def cpu_vendor() -> str | None:
    """The CPU's vendor as the processor names itself ("GenuineIntel", "AuthenticAMD"), None
    where that cannot be read. MKL runs its AVX-512 kernels on Intel's CPUs only, so which
    library multiplies fastest depends on it."""
    return cpu_info("vendor_id")


def cpu_has_amx() -> bool:
    """Whether this CPU has AMX tiles (Intel Xeon from Sapphire Rapids on): int8 and bf16
    matrix products in hardware, which oneDNN's kernels use."""
    return getattr(torch.cpu, "_is_amx_tile_supported", lambda: False)()


def float32_library() -> str:
    """Which library multiplies float32 inference products on this CPU: "blas" (MKL) on
    Intel's CPUs, where its kernels are 1.2-5x faster than oneDNN's on a decoding step's
    small products and as fast on the large ones; "onednn" elsewhere (on AMD's, MKL runs
    slower kernels: oneDNN is 1.4-2.3x faster from 150 rows on), and where PyTorch was built
    without oneDNN, "blas" (docs/RESULTS.md, "Engines on every CPU"). CTranslate2 chooses
    between the two libraries by the same rule."""
    if not (torch.backends.mkldnn.is_available()
            and hasattr(torch.ops.mkldnn, "_linear_pointwise")):
        return "blas"
    return "blas" if cpu_vendor() == "GenuineIntel" else "onednn"


FLOAT32_LIBRARY = float32_library()

# The warnings `quantize_dynamic` gives on every call: eager-mode quantization and
# quantized tensors are deprecated in PyTorch (what they compute is unchanged).
_QUANTIZATION_DEPRECATED = (
    (r"torch\.ao\.quantization is deprecated", DeprecationWarning),
    (r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor "
     r"creation functions", UserWarning),
)


M = TypeVar("M", bound=nn.Module)

# Outputs (rows x features) per call of an int8 linear layer on FBGEMM, at the most:
# FBGEMM's kernels take 2-8x longer per row once a call's output grows past ~2-4 MB of
# float32 (beam search's output projection over 128 or more rows of an 8,000-piece
# vocabulary), where oneDNN's float32 keeps its pace (docs/RESULTS.md, "Engines on every CPU").
INT8_MAX_OUTPUTS = 2 ** 19

# Int8 layers of at least this many output features (the output projection) run oneDNN's
# kernels, wherever PyTorch has them: faster than FBGEMM's at a decoding step's hundreds of
# rows on every instruction set measured (AMX, AVX-512 with and without VNNI, AVX2), and
# keeping their pace at any number of rows; the narrower layers stay on FBGEMM, faster at
# few rows (docs/RESULTS.md, "Engines on every CPU").
INT8_ONEDNN_MIN_OUTPUTS = 2048
INT8_ONEDNN = "onednn" in torch.backends.quantized.supported_engines
# Rows per chunk in which beam search consumes a oneDNN int8 layer's logits
# (`rows_per_call`; 26 sentences at beam 5): the layer takes any number of rows, but a
# chunk's logits stay in the CPU's caches for their log-softmax and top-k, at any
# vocabulary size (docs/RESULTS.md, "Engines on every CPU").
INT8_ONEDNN_CHUNK_ROWS = 130

# PyTorch's dynamically quantized product, called as its one overload: the module's
# `forward` and the operator's overload resolution cost as much Python per call as the
# product itself takes at a decoding step's few rows (docs/RESULTS.md, "Engines on every CPU").
_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default


class _RowChunkedInt8Linear(torch.ao.nn.quantized.dynamic.Linear):
    """PyTorch's dynamically quantized `Linear` (the same weights, state and products),
    applied to at most `rows_per_call(self)` input rows at a time."""

    def forward(self, x: Tensor) -> Tensor:
        weight = self._packed_params._packed_params  # int8, packed for FBGEMM
        flat = x.reshape(-1, x.shape[-1])  # (rows, in_features)
        rows = rows_per_call(self)
        if len(flat) <= rows:
            return _LINEAR_DYNAMIC(x, weight, True)  # reduce_range, as the module's forward
        out = torch.cat([_LINEAR_DYNAMIC(chunk, weight, True) for chunk in flat.split(rows)])
        return out.view(*x.shape[:-1], out.shape[-1])


def rows_per_call(layer: nn.Module) -> int | None:
    """The input rows at a time in which to feed `layer` when its outputs are consumed chunk
    by chunk (beam search over the output projection), None (all at once) for float32
    layers: an FBGEMM int8 layer's own row chunks (`INT8_MAX_OUTPUTS // out_features`, the
    most it computes in one call: a caller that splits its work at this size saves the
    joining of the chunks' outputs); a oneDNN int8 layer's `INT8_ONEDNN_CHUNK_ROWS`."""
    if isinstance(layer, _RowChunkedInt8Linear):
        return max(1, INT8_MAX_OUTPUTS // layer.out_features)
    if isinstance(layer, torch.ao.nn.quantized.dynamic.Linear):  # packed for oneDNN
        return INT8_ONEDNN_CHUNK_ROWS
    return None


def quantize_int8(model: M) -> M:
    """A copy of `model`, in eval mode, whose linear layers (`nn.Linear` and ours,
    `Linear`) are PyTorch's dynamically quantized int8 layers: weights stored in int8 (one
    scale per matrix), each input quantized on the fly, products of 8-bit integers summed
    in int32. The rest (embeddings, layer norms, attention) stays float32; a weight shared
    with an embedding (the tied output projection) is quantized in the projection only: the
    embedding keeps its float32 values. CPU only (PyTorch has no CUDA kernels for these
    layers). `model` itself is left as it was."""
    quantized = copy.deepcopy(model).eval()
    layers = {name: module for name, module in quantized.named_modules()
              if isinstance(module, nn.Linear)}
    for module in layers.values():
        if isinstance(module, Linear):  # quantize_dynamic matches exact types only
            module.__class__ = nn.Linear  # the same parameters, computed by F.linear
    wide = {name for name, module in layers.items()
            if INT8_ONEDNN and module.out_features >= INT8_ONEDNN_MIN_OUTPUTS}
    quantize_linears(quantized, layers.keys() - wide, torch.backends.quantized.engine)
    for module in quantized.modules():
        if type(module) is torch.ao.nn.quantized.dynamic.Linear:
            module.__class__ = _RowChunkedInt8Linear  # the same state, computed in row chunks
    quantize_linears(quantized, wide, "onednn")
    return quantized


def quantize_linears(model: nn.Module, names: Iterable[str], engine: str) -> None:
    """Replace `model`'s `nn.Linear` layers `names` by dynamically quantized int8 ones whose
    weights are packed for `engine`'s kernels ("x86": FBGEMM's; "onednn"), which they then
    run whatever the engine selected later."""
    names = set(names)
    if not names:
        return
    qconfig = torch.ao.quantization.default_dynamic_qconfig  # int8 weights, one scale
    selected = torch.backends.quantized.engine
    with warnings.catch_warnings():
        # a deprecation notice on every model load, about an API that still works: not ours
        for message, category in _QUANTIZATION_DEPRECATED:
            warnings.filterwarnings("ignore", message=message, category=category)
        try:
            torch.backends.quantized.engine = engine
            torch.ao.quantization.quantize_dynamic(model, dict.fromkeys(names, qconfig),
                                                   inplace=True)
        finally:
            torch.backends.quantized.engine = selected


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


MIN_CHUNK_ROWS = 512  # rows per chunk of the fused loss, at the least
# Logits per chunk of the fused loss: ~16 MB on a CPU (the chunk stays in cache); on a GPU
# 256 MB, so that a batch takes one or two chunks (each chunk launches ~10 kernels).
CHUNK_LOGITS = {"cpu": 2 ** 22, "cuda": 2 ** 26}


def default_chunk_rows(vocab_size: int, device: torch.device) -> int:
    """Rows per chunk of `linear_label_smoothed_cross_entropy` on `device`."""
    return max(MIN_CHUNK_ROWS, CHUNK_LOGITS.get(device.type, CHUNK_LOGITS["cpu"]) // vocab_size)


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
    but at least MIN_CHUNK_ROWS rows: with a large
    vocabulary (OPUS-MT's 58k pieces) fewer rows make the (V, n) @ (n, d) gradient product
    too thin to run fast (docs/RESULTS.md).
    """
    if hidden.dim() != 2 or weight.dim() != 2 or hidden.shape[1] != weight.shape[1] \
            or target.shape != hidden.shape[:1]:
        raise ValueError(f"expected hidden (N, d), weight (V, d) and target (N,), got "
                         f"{tuple(hidden.shape)}, {tuple(weight.shape)} and {tuple(target.shape)}")
    chunk_rows = chunk_rows or default_chunk_rows(weight.shape[0], hidden.device)
    return _LinearLabelSmoothedCrossEntropy.apply(hidden, weight, bias, target, float(epsilon),
                                                  chunk_rows)
