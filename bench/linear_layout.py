"""Does a linear layer's weight multiply faster stored transposed? `F.linear(x, W, b)` with W
(out, in) contiguous, as a model is made, against the same W stored as the transpose of a
contiguous (in, out) matrix (`layers.transpose_linear_weights`), per row count, and whether
the two give the same numbers, bit for bit; and oneDNN's operator with each.

    python bench/linear_layout.py [--threads 1] [--rows 1 5 10 50 100 500 1000]
                                  [--shapes 128x384 128x128 128x256 256x128 128x8000]
                                  [--rounds 7] [--isa AVX2|AVX512]

The shapes default to Transformer-Tiny's decoder (d 128, FFN 256, W_q/W_k/W_v joined: 384)
and its output projection (8,000 pieces); a decoding step multiplies beam x sentences rows.
Printed per shape and row count: the two layouts' medians over `--rounds` paired rounds,
their ratio (above 1x, the transposed one is faster) and "same" or "differs" (any bit, over
three random inputs); then oneDNN's operator with the transposed weight (reordered into
oneDNN's layout at every call) and with a copy of it packed into that layout once (what
`layers.linear` calls for the rows of `float32_onednn_rows` in the tuning table: a loaded
translator's frozen weights are packed, `layers._packed_for_onednn`), each its median, the
transposed product's time over it (above 1x, oneDNN is faster) and whether its bits are the
transposed product's. Each call runs in a loop of ~20M multiply-adds so one timing is not
one call's noise.
"""

from __future__ import annotations

import argparse
import statistics

import torch
from timing import add_isa_argument, cpu_description, hold_to_isa, paired_passes
from torch.nn import functional as F


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 10, 50, 100, 500, 1000])
    parser.add_argument("--shapes", nargs="+",
                        default=["128x384", "128x128", "128x256", "256x128", "128x8000"],
                        help="IN x OUT of each weight")
    parser.add_argument("--rounds", type=int, default=7)
    add_isa_argument(parser)
    return parser.parse_args()


def onednn_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """The product through oneDNN's operator, as `layers.linear` calls it."""
    return torch.ops.mkldnn._linear_pointwise(x, weight, bias, "none", [], "")


def same_numbers(product, weight: torch.Tensor, given: torch.Tensor, bias: torch.Tensor,
                 rows: int) -> str:
    """"same" where `product(x, given, bias)` (`given`: the weight in another layout) gives
    `F.linear(x, weight, bias)`'s every output bit for bit, over three random inputs;
    "differs" where not."""
    same = all(torch.equal(F.linear(x, weight, bias), product(x, given, bias))
               for x in torch.randn(3, rows, weight.shape[1]))
    return "same" if same else "differs"


def compare(d_in: int, d_out: int, rows: int, rounds: int) -> str:
    """One row of the table: both layouts' median microseconds a call, their ratio, same?;
    then oneDNN's with the transposed weight and with its packed copy, each: microseconds,
    the transposed product's time over it, same?"""
    weight, bias = torch.randn(d_out, d_in) / d_in ** 0.5, torch.randn(d_out)
    transposed = weight.t().contiguous().t()  # the same (out, in) values, (in, out) in memory
    x = torch.randn(rows, d_in)
    calls = max(3, 20_000_000 // (rows * d_in * d_out))

    def loop(product, w: torch.Tensor):
        def calls_of_w() -> None:  # each output freed before the next call, as in a step
            for _ in range(calls):
                product(x, w, bias)
        return calls_of_w

    arms = {"usual": loop(F.linear, weight), "transposed": loop(F.linear, transposed)}
    onednn = {}  # arm -> the weight oneDNN's operator is given
    if torch.backends.mkldnn.is_available():
        # packed as `layers._packed_for_onednn` packs, which leaves this loop's weights
        # (made under inference mode: no version to check) plain
        onednn = {"onednn": transposed,
                  "packed": torch.ops.mkldnn._reorder_linear_weight(transposed)}
        arms.update((arm, loop(onednn_linear, w)) for arm, w in onednn.items())
    seconds, _ = paired_passes(arms, rounds)
    us = {k: statistics.median(seconds[k]) / calls * 1e6 for k in arms}
    line = (f"{d_in:>5} x {d_out:<6} {rows:>6} {us['usual']:>10.1f} {us['transposed']:>12.1f} "
            f"{us['usual'] / us['transposed']:>7.2f}x  "
            f"{same_numbers(F.linear, weight, transposed, bias, rows):<8}")
    for arm, w in onednn.items():
        line += (f"{us[arm]:>10.1f} {us['transposed'] / us[arm]:>7.2f}x  "
                 f"{same_numbers(onednn_linear, transposed, w, bias, rows):<8}")
    return line


def main() -> None:
    args = parse_args()
    hold_to_isa(args.isa)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    print(f"torch {torch.__version__}; {args.threads} thread(s); median of {args.rounds} rounds")
    print(cpu_description())
    print(f"{'weight':>14} {'rows':>6} {'usual us':>10} {'transposed us':>12} {'ratio':>8}  "
          f"{'bits':<8}{'oneDNN us':>10} {'ratio':>8}  {'bits':<8}{'packed us':>10} "
          f"{'ratio':>8}  bits")
    with torch.inference_mode():
        for shape in args.shapes:
            d_in, d_out = (int(n) for n in shape.lower().split("x"))
            for rows in args.rows:
                print(compare(d_in, d_out, rows, args.rounds), flush=True)


if __name__ == "__main__":
    main()
