"""Benchmark: which of a decoding step's kernels slow down when the second CPU thread runs
too. With 2 threads our engine searches two batches at once, one thread each
(`search.decode_batches`); this times each kernel alone on one thread, then on two threads
at once, each thread with its own copy of the data, as two batches have. A kernel bound by
arithmetic takes the same time beside another; one bound by what the cores share (the L3
cache, the memory bus) takes longer.

Shapes: the start of a long batch at beam 5 (134 joined test inputs: 670 rows, 30 cached
steps, 60 source tokens; d 128, 4 heads of 32, vocabulary 8,000).

    python bench/kernel_scaling.py [--rounds 3]
"""

from __future__ import annotations

import argparse
import statistics
import threading
import time
from collections.abc import Callable

import torch
import torch.nn.functional as F
from engines import cpu_description  # bench/engines.py

from transformer.model.layers import linear

ROWS, SENTENCES, STEPS, SOURCE, D, HEADS, VOCAB = 670, 134, 30, 60, 128, 4, 8000
Kernel = Callable[[], Callable[[], object]]  # makes its data, returns the call


def output_projection() -> Callable[[], object]:
    x, w = torch.randn(ROWS, D), torch.randn(VOCAB, D)
    return lambda: linear(x, w)


def attention_projection() -> Callable[[], object]:
    x, w = torch.randn(ROWS, D), torch.randn(D, D)
    return lambda: linear(x, w)


def log_softmax() -> Callable[[], object]:
    logits = torch.randn(ROWS, VOCAB)  # 21 MB
    return lambda: torch.log_softmax(logits, -1, out=logits)


def cache_gather() -> Callable[[], object]:
    """One layer's self-attention keys gathered into the next buffer (`KVCache.append`);
    a step does this for keys and values of every layer."""
    keys = torch.randn(ROWS, HEADS, STEPS, D // HEADS)  # 10 MB
    rows, out = torch.randint(0, ROWS, (ROWS,)), torch.empty_like(keys)
    return lambda: torch.index_select(keys, 0, rows, out=out)


def self_attention() -> Callable[[], object]:
    q = torch.randn(ROWS * HEADS, 1, D // HEADS)
    k, v = (torch.randn(ROWS * HEADS, STEPS, D // HEADS) for _ in range(2))
    return lambda: torch.bmm(torch.softmax(torch.bmm(q, k.transpose(1, 2)), -1), v)


def cross_attention() -> Callable[[], object]:
    q = torch.randn(SENTENCES, HEADS, ROWS // SENTENCES, D // HEADS)
    k, v = (torch.randn(SENTENCES, HEADS, SOURCE, D // HEADS) for _ in range(2))
    return lambda: F.scaled_dot_product_attention(q, k, v)


def small_operators() -> Callable[[], object]:
    """100 operators on a few rows, as a step of a nearly finished batch runs: the time is
    Python's and the dispatcher's, under the interpreter lock the threads share."""
    x = torch.randn(5, D)

    def call() -> object:
        y = x
        for _ in range(100):
            y = y + 1.0
        return y
    return call


KERNELS: dict[str, Kernel] = {
    "output projection (670 x 128 -> 8,000)": output_projection,
    "attention projection (670 x 128 -> 128)": attention_projection,
    "log-softmax over the logits (21 MB)": log_softmax,
    "cache gather, one layer's keys (10 MB)": cache_gather,
    "self-attention over 30 steps": self_attention,
    "cross-attention, fused kernel, 60 keys": cross_attention,
    "100 small operators (5 x 128)": small_operators,
}


def per_call(make: Kernel, threads: int, seconds: float = 0.5) -> float:
    """Median seconds per call, with `threads` threads each calling its own copy for about
    `seconds`; the mean over the threads."""
    calls = [make() for _ in range(threads)]
    medians = [0.0] * threads

    def run(i: int) -> None:
        torch.set_num_threads(1)  # this thread's operators
        times, end = [], time.perf_counter() + seconds
        while time.perf_counter() < end or len(times) < 5:
            start = time.perf_counter()
            calls[i]()
            times.append(time.perf_counter() - start)
        medians[i] = statistics.median(times)

    workers = [threading.Thread(target=run, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    return statistics.mean(medians)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    print(cpu_description())
    print(f"{'kernel':42s} {'alone us':>9s} {'beside us':>9s}  beside / alone, each round")
    for name, make in KERNELS.items():
        pairs = [(per_call(make, 1), per_call(make, 2)) for _ in range(args.rounds)]
        alone, beside = min(a for a, _ in pairs), min(b for _, b in pairs)
        ratios = " ".join(f"{b / a:.2f}x" for a, b in pairs)
        print(f"{name:42s} {alone * 1e6:9.0f} {beside * 1e6:9.0f}  {ratios}", flush=True)


if __name__ == "__main__":
    main()
