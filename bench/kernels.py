"""Benchmark: the kernels one decoding step of Transformer-Tiny runs, on the CPU at hand, for
the choices the code makes by measurement: oneDNN or BLAS for the linear layers (`ops.linear`),
FBGEMM's or oneDNN's kernels for int8 layers (`ops.INT8_ONEDNN`), the explicit attention
path or PyTorch's fused kernel by the number of keys
(`attention.CPU_FUSED_MIN_KEYS`; for a decoding step's self- and cross-attention and for the
encoder's), the explicit path's softmax and weighted sum over few keys
(`attention.CPU_SHORT_SOFTMAX`, `attention.CPU_SMALL_BMM`), and the key/value cache's
layout (`attention.KVCache`).

Every variant is timed in turn, round after round in one process (the best round counts), at
one thread, on the shapes beam search at beam 5 produces for ~150 sentences of Multi30k
(rows = sentences x beams; d 128, 4 heads of 32, FFN 256, vocabulary 8,000).

    python bench/kernels.py
    python bench/kernels.py --isa AVX2   # the kernels an AVX2-only CPU runs (engines.ISA_LIMITS)
"""

from __future__ import annotations

import argparse
import math
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from engines import add_isa_argument, cpu_description, hold_to_isa  # bench/engines.py

from transformer.model.attention import CPU_SHORT_SOFTMAX, CPU_SMALL_BMM, _softmax, _weighted_values
from transformer.model.layers import linear, quantize_linears

HEADS, HEAD_DIM = 4, 32
LINEARS = [(128, 128), (256, 128), (128, 256), (8000, 128)]  # (out, in): attention, FFN, output
Variant = tuple[Callable[..., object], tuple]  # a function and its arguments


def best_us(variants: dict[str, Variant], rounds: int,
            calls: int = 10) -> dict[str, float]:
    """Microseconds per call of each variant (a function and its arguments): the best of
    `rounds` rounds, the variants in turn."""
    best = dict.fromkeys(variants, math.inf)
    for _ in range(rounds):
        for name, (f, args) in variants.items():
            f(*args)
            start = time.perf_counter()
            for _ in range(calls):
                f(*args)
            best[name] = min(best[name], (time.perf_counter() - start) / calls * 1e6)
    return best


def compared(first: Variant, second: Variant, rounds: int) -> str:
    """Both variants timed by `best_us`, as "first / second (second's time over first's)":
    above 1x the first is faster."""
    t = best_us({"first": first, "second": second}, rounds)
    return f"{t['first']:7.0f} / {t['second']:7.0f} ({t['second'] / t['first']:.2f}x)"


def explicit(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The explicit path as the package runs it: heads folded into the batch, bmm, softmax,
    bmm (with few keys, `attention._softmax` and `attention._weighted_values`)."""
    b, h, n, d = q.shape
    scores = torch.bmm(q.reshape(b * h, n, d), k.reshape(b * h, -1, d).transpose(1, 2))
    return _weighted_values(_softmax(scores / math.sqrt(d)), v.reshape(b * h, -1, d))


def linears(rounds: int) -> None:
    print("linear layers, us per call: oneDNN (ops.linear) / BLAS (F.linear)")
    for rows in (5, 40, 150, 750):
        cells = []
        for out_features, in_features in LINEARS:
            x, w = torch.randn(rows, in_features), torch.randn(out_features, in_features)
            b = torch.randn(out_features)
            cells.append(f"{in_features}->{out_features}: "
                         + compared((linear, (x, w, b)), (F.linear, (x, w, b)), rounds))
        print(f"  {rows:>4} rows  " + "  ".join(cells))


def int8_linear(layer: torch.nn.Linear, engine: str) -> torch.nn.Module:
    """`layer` in int8 as `quantize_int8` makes it, its weights packed for `engine`'s
    kernels ("x86": FBGEMM's; "onednn")."""
    model = torch.nn.Sequential(layer)
    quantize_linears(model, {"0"}, engine)
    return model[0]


def int8_linears(rounds: int) -> None:
    if "onednn" not in torch.backends.quantized.supported_engines:
        print("int8 linear layers: this PyTorch has no oneDNN int8 engine")
        return
    print("int8 linear layers (quantize_dynamic), us per call: FBGEMM / oneDNN (ops.INT8_ONEDNN "
          "sends the wide layers to oneDNN wherever PyTorch has it)")
    for rows in (5, 40, 150, 750):
        cells = []
        for out_features, in_features in LINEARS:
            layer = torch.nn.Linear(in_features, out_features)
            fbgemm, onednn = int8_linear(layer, "x86"), int8_linear(layer, "onednn")
            x = torch.randn(rows, in_features)
            cells.append(f"{in_features}->{out_features}: "
                         + compared((fbgemm, (x,)), (onednn, (x,)), rounds))
        print(f"  {rows:>4} rows  " + "  ".join(cells))


def attention(rounds: int) -> None:
    print("attention without gradients, us per call: explicit / fused (SDPA); a decoding "
          "step's self = 750 rows x 1 query, cross = 150 sentences x 5 queries; the "
          "encoder's = 150 sentences x as many queries as keys")
    for keys in (4, 8, 16, 32, 48, 64, 96, 128, 192):
        cells = []
        for name, batch, queries in (("self", 750, 1), ("cross", 150, 5),
                                     ("encoder", 150, keys)):
            q = torch.randn(batch, HEADS, queries, HEAD_DIM)
            k, v = (torch.randn(batch, HEADS, keys, HEAD_DIM) for _ in range(2))
            cells.append(f"{name} " + compared(
                (explicit, (q, k, v)), (F.scaled_dot_product_attention, (q, k, v)), rounds))
        print(f"  {keys:>3} keys  " + "  ".join(cells))


def few_keys(rounds: int) -> None:
    print(f"a decoding step's attention over few keys, us per call: the package's / "
          f"PyTorch's; softmax of 750 rows x 4 heads x 1 query (exp(x - max) / sum below "
          f"{CPU_SHORT_SOFTMAX} keys / F.softmax), weights x values of 750 rows x 4 heads x 1 "
          f"query (a sum of products below {CPU_SMALL_BMM} multiply-adds / bmm)")
    for keys in (2, 4, 8, 12, 13, 15, 16, 24):
        scores = torch.randn(750 * HEADS, 1, keys)
        weights, values = F.softmax(scores, -1), torch.randn(750 * HEADS, keys, HEAD_DIM)
        print(f"  {keys:>3} keys  softmax "
              + compared((_softmax, (scores,)), (F.softmax, (scores, -1)), rounds)
              + "  weighted values "
              + compared((_weighted_values, (weights, values)), (torch.bmm, (weights, values)),
                         rounds))


def cache_layout(rounds: int) -> None:
    print("self-attention over the cache, us per call: keys contiguous (batch, heads, steps, "
          "head_dim) / steps-first (steps, batch, heads, head_dim) read through a view")
    rows = 750
    for steps in (8, 16, 24, 32, 48, 64):
        q = torch.randn(rows, HEADS, 1, HEAD_DIM)
        stored = torch.randn(2, steps, rows, HEADS, HEAD_DIM)
        k_view, v_view = (x.permute(1, 2, 0, 3) for x in stored)  # (rows, heads, steps, hd)
        k, v = k_view.contiguous(), v_view.contiguous()
        print(f"  {steps:>3} steps  "
              + compared((explicit, (q, k, v)), (explicit, (q, k_view, v_view)), rounds))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=15)
    add_isa_argument(parser)
    args = parser.parse_args()
    hold_to_isa(args.isa)
    torch.set_num_threads(1)
    print(f"torch {torch.__version__}; one thread")
    print(cpu_description())
    with torch.no_grad():
        linears(args.rounds)
        int8_linears(args.rounds)
        attention(args.rounds)
        few_keys(args.rounds)
        cache_layout(args.rounds)


if __name__ == "__main__":
    main()
