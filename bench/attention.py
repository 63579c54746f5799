"""Benchmark: forward+backward time and peak memory of multi-head self-attention.

Rows, all measured in the same run, alternating so machine noise hits each alike:
  (a) ours    transformer.model.attention.MultiHeadAttention, fused (SDPA) path
  (b) book    the book's naive version: separate bmm + masked softmax + bmm
  (c) torch   torch.nn.MultiheadAttention
float32 on CPU, self-attention with padding (valid_lens / key_padding_mask).
Peak memory of (a) and (b) at the long shape is measured in separate subprocesses.

    python bench/attention.py [--repeats 7]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import time

import torch
from memory import reset_peak_rss, status_mib  # bench/memory.py
from torch import nn

from transformer.model.attention import MultiHeadAttention

SHAPES = {"short": (64, 32, 256, 4), "long": (4, 1024, 512, 8)}  # batch, len, hiddens, heads


# --- (b) the book's naive multi-head attention, as written in Dive into Deep Learning ----
def book_sequence_mask(X, valid_len, value=0):
    maxlen = X.size(1)
    positions = torch.arange(maxlen, dtype=torch.float32, device=X.device)
    mask = positions[None, :] < valid_len[:, None]
    X[~mask] = value
    return X


def book_masked_softmax(X, valid_lens):
    if valid_lens is None:
        return nn.functional.softmax(X, dim=-1)
    shape = X.shape
    if valid_lens.dim() == 1:
        valid_lens = torch.repeat_interleave(valid_lens, shape[1])
    else:
        valid_lens = valid_lens.reshape(-1)
    X = book_sequence_mask(X.reshape(-1, shape[-1]), valid_lens, value=-1e6)
    return nn.functional.softmax(X.reshape(shape), dim=-1)


class BookDotProductAttention(nn.Module):
    def __init__(self, dropout):
        super().__init__()
        self.dropout = nn.Dropout(dropout)

    def forward(self, queries, keys, values, valid_lens=None):
        d = queries.shape[-1]
        scores = torch.bmm(queries, keys.transpose(1, 2)) / math.sqrt(d)
        self.attention_weights = book_masked_softmax(scores, valid_lens)
        return torch.bmm(self.dropout(self.attention_weights), values)


def book_transpose_qkv(X, num_heads):
    X = X.reshape(X.shape[0], X.shape[1], num_heads, -1)
    X = X.permute(0, 2, 1, 3)
    return X.reshape(-1, X.shape[2], X.shape[3])


def book_transpose_output(X, num_heads):
    X = X.reshape(-1, num_heads, X.shape[1], X.shape[2])
    X = X.permute(0, 2, 1, 3)
    return X.reshape(X.shape[0], X.shape[1], -1)


class BookMultiHeadAttention(nn.Module):
    def __init__(self, num_hiddens, num_heads, dropout, bias=False):
        super().__init__()
        self.num_heads = num_heads
        self.attention = BookDotProductAttention(dropout)
        self.W_q = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_k = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_v = nn.Linear(num_hiddens, num_hiddens, bias=bias)
        self.W_o = nn.Linear(num_hiddens, num_hiddens, bias=bias)

    def forward(self, queries, keys, values, valid_lens):
        queries = book_transpose_qkv(self.W_q(queries), self.num_heads)
        keys = book_transpose_qkv(self.W_k(keys), self.num_heads)
        values = book_transpose_qkv(self.W_v(values), self.num_heads)
        if valid_lens is not None:
            valid_lens = torch.repeat_interleave(valid_lens, repeats=self.num_heads, dim=0)
        output = self.attention(queries, keys, values, valid_lens)
        return self.W_o(book_transpose_output(output, self.num_heads))


# --- the three contenders, each a closure running one forward+backward -------------------
def make_step(kind: str, shape: tuple[int, int, int, int]):
    batch, length, d, heads = shape
    torch.manual_seed(0)
    X = torch.randn(batch, length, d, requires_grad=True)
    valid_lens = torch.randint(length // 2, length + 1, (batch,))
    valid_lens[0] = length
    pad = torch.arange(length)[None, :] >= valid_lens[:, None]
    if kind == "ours":
        module = MultiHeadAttention(d, d, d, d, heads, 0.0, bias=True)
        forward = lambda: module(X, X, X, valid_lens)
    elif kind == "book":
        module = BookMultiHeadAttention(d, heads, 0.0, bias=True)
        forward = lambda: module(X, X, X, valid_lens)
    elif kind == "torch":
        module = nn.MultiheadAttention(d, heads, bias=True, batch_first=True)
        forward = lambda: module(X, X, X, key_padding_mask=pad, need_weights=False)[0]
    else:
        raise ValueError(kind)
    module.train()

    def step():
        forward().sum().backward()
        X.grad = None
        module.zero_grad(set_to_none=True)

    return step


def time_rows(shape, repeats: int) -> dict[str, float]:
    steps = {kind: make_step(kind, shape) for kind in ("ours", "book", "torch")}
    for step in steps.values():  # warm-up
        step()
    times = {kind: [] for kind in steps}
    for _ in range(repeats):
        for kind, step in steps.items():  # alternate so noise hits each alike
            start = time.perf_counter()
            step()
            times[kind].append(time.perf_counter() - start)
    return {kind: statistics.median(t) for kind, t in times.items()}


def peak_memory_child(kind: str) -> None:
    """Run in a subprocess: peak RSS growth (MiB) of one forward+backward at the long shape."""
    step = make_step(kind, SHAPES["long"])
    before = reset_peak_rss()
    step()
    print(json.dumps({"peak_mib": status_mib("VmHWM") - before}))


def peak_memory(kind: str) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", kind], check=True,
                         capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        peak_memory_child(args.child)
        return

    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32 CPU, "
          f"self-attention with padding, forward+backward, median of {args.repeats}")
    print(f"{'shape (B, L, d, h)':<22}{'(a) ours ms':>12}{'(b) book ms':>12}{'(c) torch ms':>13}"
          f"{'a/c':>7}{'a/b':>7}")
    ratios = {}
    for name, shape in SHAPES.items():
        t = time_rows(shape, args.repeats)
        ratios[name] = (t["ours"] / t["torch"], t["ours"] / t["book"])
        print(f"{str(shape):<22}{t['ours'] * 1e3:>12.1f}{t['book'] * 1e3:>12.1f}"
              f"{t['torch'] * 1e3:>13.1f}{ratios[name][0]:>7.2f}{ratios[name][1]:>7.2f}")
    mem_ours, mem_book = peak_memory("ours"), peak_memory("book")
    print(f"peak memory growth at {SHAPES['long']}: (a) ours {mem_ours:.0f} MiB, "
          f"(b) book {mem_book:.0f} MiB, a/b {mem_ours / mem_book:.2f}")
    checks = [
        ("(a) <= 1.0x (c) time, short", ratios["short"][0] <= 1.0),
        ("(a) <= 1.0x (c) time, long", ratios["long"][0] <= 1.0),
        ("(a) <= 0.7x (b) time, long", ratios["long"][1] <= 0.7),
        ("(a) <= 0.5x (b) peak memory, long", mem_ours / mem_book <= 0.5),
    ]
    for label, ok in checks:
        print(f"{'PASS' if ok else 'FAIL'}  {label}")


if __name__ == "__main__":
    main()
