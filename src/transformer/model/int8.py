"""Our engine in int8: a model whose linear layers are PyTorch's dynamically quantized ones.

`quantize_int8` copies a model and replaces every linear layer (`nn.Linear` and ours,
`layers.Linear`) by `torch.ao.quantization.quantize_dynamic`'s: int8 weights, each input
quantized as it comes, products of 8-bit integers summed in int32; CPU only (PyTorch has no
CUDA kernels for them). The narrow layers run FBGEMM's kernels, fed at most the tuning
table's `int8_max_outputs` outputs a call (`_RowChunkedInt8Linear`: FBGEMM slows down per row
past that), and call PyTorch's operator directly, without the module's Python; the wide ones
(the output projection, `int8_onednn_min_outputs` and more) run oneDNN's kernels wherever
PyTorch has them (`int8_onednn`), which take any number of rows. `rows_per_call` tells beam
search in how many rows to consume a layer's logits (`hardware.MEASURED` says where each
size was measured).
"""

from __future__ import annotations

import copy
import warnings
import weakref
from collections.abc import Iterable, Sequence
from typing import TypeVar

import torch
from torch import Tensor, nn

from .. import hardware
from .layers import Linear

__all__ = ["quantize_int8", "quantize_linears", "joined_int8", "rows_per_call"]

M = TypeVar("M", bound=nn.Module)

# The warnings `quantize_dynamic` gives on every call: eager-mode quantization and
# quantized tensors are deprecated in PyTorch (what they compute is unchanged).
_QUANTIZATION_DEPRECATED = (
    (r"torch\.ao\.quantization is deprecated", DeprecationWarning),
    (r"torch\.quantize_per_tensor, torch\.quantize_per_channel and other quantized tensor "
     r"creation functions", UserWarning),
)

# PyTorch's dynamically quantized product, called as its one overload: the module's
# `forward` and the operator's overload resolution cost as much Python per call as the
# product itself takes at a decoding step's few rows.
_LINEAR_DYNAMIC = torch.ops.quantized.linear_dynamic.default


class _RowChunkedInt8Linear(torch.ao.nn.quantized.dynamic.Linear):
    """PyTorch's dynamically quantized `Linear` (the same weights, state and products),
    applied to at most `rows_per_call(self)` input rows at a time."""

    parts = 1  # layers of out_features // parts outputs each, side by side (`joined_int8`)

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
    layers: an FBGEMM int8 layer's own row chunks (`int8_max_outputs // out_features`, the
    most it computes in one call: a caller that splits its work at this size saves the
    joining of the chunks' outputs; a joined layer's those of each of its parts, so each
    chunk quantizes the rows the parts' chunks would); a oneDNN int8 layer's
    `int8_onednn_chunk_rows`."""
    tuning = hardware.TUNING
    if isinstance(layer, _RowChunkedInt8Linear):
        return max(1, tuning.int8_max_outputs // (layer.out_features // layer.parts))
    if isinstance(layer, torch.ao.nn.quantized.dynamic.Linear):  # packed for oneDNN
        return tuning.int8_onednn_chunk_rows
    return None


# layers[0] of a `joined_int8` call -> (the packed weights it joined, the joined layer)
_JOINED: weakref.WeakKeyDictionary[
    nn.Module, tuple[tuple[object, ...], _RowChunkedInt8Linear]] = weakref.WeakKeyDictionary()


def joined_int8(layers: Sequence[nn.Module]) -> _RowChunkedInt8Linear | None:
    """One FBGEMM int8 layer computing `layers`' products side by side, their outputs
    concatenated, bit for bit: each keeps its int8 weights and its scale, now one scale per
    output channel, and the input is quantized once (the decoding step's W_q, W_k and W_v:
    one product instead of three), in the row chunks each of them takes. None unless all
    are FBGEMM int8 layers of one shape, with one scale per matrix and biases alike. The
    joined weights are packed for the quantized engine selected when first asked, as
    `quantize_int8` packs the narrow layers; packing takes longer than a search of one
    sentence, so the joined layer is kept for the next searches while the layers keep the
    same packed weights."""
    if not layers or not all(type(layer) is _RowChunkedInt8Linear for layer in layers):
        return None
    packed = tuple(layer._packed_params._packed_params for layer in layers)
    kept = _JOINED.get(layers[0])
    if kept is not None and len(kept[0]) == len(packed) and all(
            a is b for a, b in zip(kept[0], packed, strict=True)):
        return kept[1]
    joined = _joined_int8(layers)
    if joined is not None:
        _JOINED[layers[0]] = (packed, joined)
    return joined


def _joined_int8(layers: Sequence[_RowChunkedInt8Linear]) -> _RowChunkedInt8Linear | None:
    """`joined_int8`'s layer, made anew."""
    weights = [layer.weight() for layer in layers]  # each (out_i, in), qint8
    biases = [layer.bias() for layer in layers]
    if (any(w.qscheme() != torch.per_tensor_affine for w in weights)
            or len({w.shape for w in weights}) > 1 or len({b is None for b in biases}) > 1):
        return None
    int8 = torch.cat([w.int_repr() for w in weights])  # (sum out_i, in)
    scales = torch.cat([torch.full((len(w),), w.q_scale(), dtype=torch.double)
                        for w in weights])
    zero_points = torch.cat([torch.full((len(w),), w.q_zero_point(), dtype=torch.long)
                             for w in weights])
    joined = _RowChunkedInt8Linear(int8.shape[1], int8.shape[0])
    joined.parts = len(layers)
    joined.set_weight_bias(torch._make_per_channel_quantized_tensor(int8, scales, zero_points, 0),
                           None if biases[0] is None else torch.cat(biases))
    return joined


def quantize_int8(model: M) -> M:
    """A copy of `model`, in eval mode, whose linear layers (`nn.Linear` and ours,
    `Linear`) are PyTorch's dynamically quantized int8 layers: weights stored in int8 (one
    scale per matrix), each input quantized on the fly, products of 8-bit integers summed
    in int32. The rest (embeddings, layer norms, attention) stays float32; a weight shared
    with an embedding (the tied output projection) is quantized in the projection only: the
    embedding keeps its float32 values. CPU only (PyTorch has no CUDA kernels for these
    layers). `model` itself is left as it was."""
    tuning = hardware.TUNING
    quantized = copy.deepcopy(model).eval()
    layers = {name: module for name, module in quantized.named_modules()
              if isinstance(module, nn.Linear)}
    for module in layers.values():
        if isinstance(module, Linear):  # quantize_dynamic matches exact types only
            module.__class__ = nn.Linear  # the same parameters, computed by F.linear
    wide = {name for name, module in layers.items()
            if tuning.int8_onednn and module.out_features >= tuning.int8_onednn_min_outputs}
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
