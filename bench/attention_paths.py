"""Which attention kernel is faster at a decoding step's few queries? The book's explicit path
(`kernels.explicit_attention`: two products and a softmax, a dozen operators) against PyTorch's
fused kernel (`kernels.fused_attention`: one call), per number of sentences and keys, in CPU
inference: what the tuning table's `fused_attention_max_queries` decides.

    python bench/attention_paths.py [--threads 1] [--sentences 1 2 4 8 16]
                                    [--keys 5 15 30] [--beam 5] [--heads 4] [--head-dim 32]
                                    [--rounds 7] [--isa AVX2|AVX512]

A step's two attentions, at Transformer-Tiny's sizes by default: self-attention, one query per
row (sentences x beam rows) over its cached steps, and encoder-decoder attention, a
sentence's beams as one row of queries over its source. Printed per attention, sentences and
keys: the rows of queries (batch x heads x queries: what the table counts), both paths'
medians over `--rounds` paired rounds, their ratio (above 1x, the fused kernel is faster) and
the largest difference of their outputs. Each call runs in a loop of ~2,000 calls so one
timing is not one call's noise.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import add_isa_argument, cpu_description, hold_to_isa, paired_passes
from torch import nn

from transformer.model import kernels

CALLS = 2000


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--sentences", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--keys", type=int, nargs="+", default=[5, 15, 30])
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--head-dim", type=int, default=32)
    parser.add_argument("--rounds", type=int, default=7)
    add_isa_argument(parser)
    return parser.parse_args()


def shapes(kind: str, sentences: int, keys: int, args: argparse.Namespace
           ) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """The query's and the keys' shapes (batch, heads, queries or keys, head_dim) of one
    attention of a decoding step."""
    h, d, rows = args.heads, args.head_dim, sentences * args.beam
    if kind == "self":  # one query per row over the row's cached steps
        return (rows, h, 1, d), (rows, h, keys, d)
    return (sentences, h, args.beam, d), (sentences, h, keys, d)  # the beams over the source


def compare(kind: str, sentences: int, keys: int, args: argparse.Namespace) -> str:
    """One row of the table: both paths' median microseconds a call, their ratio, and the
    largest difference of their outputs."""
    q_shape, k_shape = shapes(kind, sentences, keys, args)
    q, k, v = torch.randn(q_shape), torch.randn(k_shape), torch.randn(k_shape)
    dropout = nn.Dropout(0.1).eval()

    def explicit() -> None:
        for _ in range(CALLS):
            kernels.explicit_attention(q, k, v, None, dropout)

    def fused() -> None:
        for _ in range(CALLS):
            kernels.fused_attention(q, k, v, None, 0.0, False)

    seconds, _ = paired_passes({"explicit": explicit, "fused": fused}, args.rounds)
    ex, fu = (statistics.median(seconds[name]) / CALLS * 1e6 for name in ("explicit", "fused"))
    difference = (kernels.explicit_attention(q, k, v, None, dropout)[0]
                  - kernels.fused_attention(q, k, v, None, 0.0, False)).abs().max().item()
    queries = q_shape[0] * q_shape[1] * q_shape[2]
    return (f"{kind:>8} {sentences:>9} {keys:>5} {queries:>8} {ex:>12.1f} {fu:>9.1f} "
            f"{ex / fu:>7.2f}x  {difference:.1e}")


def main() -> None:
    args = parse_args()
    hold_to_isa(args.isa)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}; {args.threads} thread(s); beam {args.beam}, "
          f"{args.heads} heads of {args.head_dim}; median of {args.rounds} rounds")
    print(cpu_description())
    print(f"{'attention':>8} {'sentences':>9} {'keys':>5} {'queries':>8} {'explicit us':>12} "
          f"{'fused us':>9} {'ratio':>8}  largest difference")
    with torch.inference_mode():
        for kind in ("self", "encoder"):
            for keys in args.keys:
                for sentences in args.sentences:
                    print(compare(kind, sentences, keys, args), flush=True)


if __name__ == "__main__":
    main()
