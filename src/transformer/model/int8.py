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
from collections.abc import Iterable
from typing import TypeVar

import torch
from torch import Tensor, nn

from .. import hardware
from .layers import Linear

__all__ = ["quantize_int8", "quantize_linears", "rows_per_call"]

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
    joining of the chunks' outputs); a oneDNN int8 layer's `int8_onednn_chunk_rows`."""
    tuning = hardware.TUNING
    if isinstance(layer, _RowChunkedInt8Linear):
        return max(1, tuning.int8_max_outputs // layer.out_features)
    if isinstance(layer, torch.ao.nn.quantized.dynamic.Linear):  # packed for oneDNN
        return tuning.int8_onednn_chunk_rows
    return None


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
