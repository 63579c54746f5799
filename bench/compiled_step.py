"""Benchmark: what a compiled decoding step would gain. One beam-search step of a trained
model's decoder (embedding, positions, every block over the key/value caches) as the package
runs it (`model.decoder` over `LayerCache`s), against the same step written as one function of
tensors (the caches in, the grown caches out) run eagerly and through `torch.compile`
(inductor, dynamic shapes, weights frozen), at the shapes beam search meets: one sentence
(a step's fixed cost), and batches of short and long inputs.

All three read the same state (random tokens, caches and encoder keys/values) and must give
the same decoder states: the largest difference from the package's is printed beside each
time. Times are medians of `--calls` calls, after warm-up; "compile" is the first call's
time, the compiling included. The function is written for post-norm ReLU models (the
recipe's); it is a measurement, not a second decoder.

    python bench/compiled_step.py --checkpoint CKPT [--threads 1] [--calls 30]
"""

from __future__ import annotations

import argparse
import math
import statistics
import time
from collections.abc import Callable

import torch
import torch._inductor.config as inductor_config
from engines import DEFAULT_CHECKPOINT, cpu_description  # bench/engines.py
from torch import Tensor
from torch.nn import functional as F

from transformer.decoding.translator import Translator
from transformer.model.blocks import LayerCache
from transformer.model.masks import key_padding_mask
from transformer.model.transformer import Transformer

BEAM = 5
# (sentences, cached steps, source length): one input alone; a batch of long inputs as it
# shrinks; the start of a long batch; a batch of short inputs
SHAPES = [(1, 30, 60), (42, 30, 60), (134, 30, 60), (204, 15, 16)]


def linear(x: Tensor, layer: torch.nn.Linear) -> Tensor:
    """`F.linear` (which inductor lowers; the package's oneDNN call it cannot)."""
    return F.linear(x, layer.weight, layer.bias)


def functional_step(model: Transformer, tokens: Tensor, rows: Tensor, self_keys: list[Tensor],
                    self_values: list[Tensor], cross_keys: list[Tensor],
                    cross_values: list[Tensor], cross_mask: Tensor
                    ) -> tuple[Tensor, list[Tensor], list[Tensor]]:
    """The decoder's step as one function: tokens (rows,) at position = cached steps; each
    layer's self-attention cache (previous rows, heads, steps, head_dim), of which `rows`
    go on; cross-attention keys/values (sentences, heads, src_len, head_dim), `cross_mask`
    (sentences, 1, 1, src_len) -> states (rows, d) and the caches with this step."""
    decoder, c = model.decoder, model.config
    h, d = c.num_heads, c.num_hiddens
    steps = self_keys[0].shape[2]
    X = (decoder.embedding(tokens) * math.sqrt(d) + decoder.pos_encoding.P[0, steps])[:, None]
    n, a = X.shape[0], cross_keys[0].shape[0]
    keys, values = [], []
    for i, block in enumerate(decoder.blks):
        att = block.attention1
        q, k, v = (linear(X, W).view(n, 1, h, -1).transpose(1, 2)
                   for W in (att.W_q, att.W_k, att.W_v))  # (rows, heads, 1, head_dim)
        K = torch.cat([self_keys[i].index_select(0, rows), k], 2)  # (rows, heads, steps+1, hd)
        V = torch.cat([self_values[i].index_select(0, rows), v], 2)
        keys.append(K)
        values.append(V)
        weights = (q @ K.transpose(-1, -2) / math.sqrt(q.shape[-1])).softmax(-1)
        out = (weights @ V).transpose(1, 2).reshape(n, 1, d)
        Y = block.addnorm1.ln(X + linear(out, att.W_o))
        att = block.attention2
        q = linear(Y, att.W_q).view(a, -1, h, d // h).transpose(1, 2)  # (a, heads, beam, hd)
        scores = q @ cross_keys[i].transpose(-1, -2) / math.sqrt(d // h)
        weights = scores.masked_fill(~cross_mask, float("-inf")).softmax(-1)
        out = (weights @ cross_values[i]).transpose(1, 2).reshape(n, 1, d)
        Z = block.addnorm2.ln(Y + linear(out, att.W_o))
        ffn = block.ffn
        X = block.addnorm3.ln(Z + linear(F.relu(linear(Z, ffn.dense1)), ffn.dense2))
    return X[:, 0], keys, values


def state(model: Transformer, sentences: int, steps: int, src_len: int,
          generator: torch.Generator) -> dict:
    """Random tokens, caches and encoder keys/values of one step's shapes."""
    c = model.config
    h, hd, layers, n = c.num_heads, c.num_hiddens // c.num_heads, c.num_decoder_layers, \
        sentences * BEAM
    randn = lambda *shape: torch.randn(*shape, generator=generator)
    lens = torch.randint(src_len // 2, src_len + 1, (sentences,), generator=generator)
    lens[0] = src_len
    return {"tokens": torch.randint(4, c.tgt_vocab_size, (n,), generator=generator),
            "rows": torch.randperm(n, generator=generator),
            "self_keys": [randn(n, h, steps, hd) for _ in range(layers)],
            "self_values": [randn(n, h, steps, hd) for _ in range(layers)],
            "cross_keys": [randn(sentences, h, src_len, hd) for _ in range(layers)],
            "cross_values": [randn(sentences, h, src_len, hd) for _ in range(layers)],
            "lens": lens, "enc_outputs": randn(sentences, src_len, c.num_hiddens)}


def package_step(model: Transformer, s: dict, warm: bool
                 ) -> tuple[Callable[[], None], Callable[[], Tensor]]:
    """The package's decoder step on `s`: (prepare, call). `prepare` makes fresh caches
    holding `s` before the clock starts (a step appends to its caches); with `warm`, it
    also runs one step on them, so that the timed step finds its buffers made, as every
    step but the first does in a search (it then reads one cached step more). `call` runs
    the step on the caches prepared last, their rows reordered by `s["rows"]`."""
    caches: list[list[LayerCache]] = []

    def step(layers: list[LayerCache]) -> Tensor:
        for layer in layers:
            layer.self_attention.reorder(s["rows"])
        return model.decoder(s["tokens"][:, None], s["enc_outputs"], s["lens"], layers)[:, -1]

    def prepare() -> None:
        layers = model.new_cache()
        for i, layer in enumerate(layers):
            layer.self_attention.append(s["self_keys"][i].clone(), s["self_values"][i].clone())
            layer.cross_attention.append(s["cross_keys"][i], s["cross_values"][i])
        if warm:
            step(layers)
        caches.append(layers)

    return prepare, lambda: step(caches.pop())


def median_ms(call: Callable[[], object], calls: int, prepare: Callable[[], None] | None = None
              ) -> float:
    """Milliseconds of `call`, the median of `calls` after 3 warm-up calls; `prepare` runs
    before each, off the clock."""
    times = []
    for _ in range(calls + 3):
        if prepare is not None:
            prepare()
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times[3:])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--calls", type=int, default=30)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    model = Translator.load(args.checkpoint, device="cpu").model.eval()
    c = model.config
    if c.norm_first or c.activation != "relu" or c.pruned_heads:
        raise SystemExit("the functional step is written for post-norm ReLU models without "
                         "pruned heads")
    print(cpu_description())
    print(f"{c.num_decoder_layers} decoder layers, d {c.num_hiddens}, {c.num_heads} heads, "
          f"beam {BEAM}, {args.threads} thread(s); milliseconds per step (median of "
          f"{args.calls})")
    inductor_config.freezing = True  # weights as constants: inductor packs them for oneDNN
    compiled = torch.compile(functional_step, dynamic=True)
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for sentences, steps, src_len in SHAPES:
            s = state(model, sentences, steps, src_len, generator)
            args_ = (model, s["tokens"], s["rows"], s["self_keys"], s["self_values"],
                     s["cross_keys"], s["cross_values"],
                     key_padding_mask(s["lens"], src_len)[:, None, None, :])
            prepare, ours = package_step(model, s, warm=False)
            prepare()
            reference = ours()
            prepare, ours = package_step(model, s, warm=True)
            start = time.perf_counter()
            out = compiled(*args_)[0]
            first = time.perf_counter() - start
            diff = max((reference - x).abs().max().item()
                       for x in (out, functional_step(*args_)[0]))
            package = median_ms(ours, args.calls, prepare)
            eager = median_ms(lambda: functional_step(*args_), args.calls)  # noqa: B023
            fast = median_ms(lambda: compiled(*args_), args.calls)  # noqa: B023
            print(f"{sentences:>4} sentences, {steps} steps cached, source {src_len}: package "
                  f"{package:7.2f}  function eager {eager:7.2f}  compiled {fast:7.2f} "
                  f"({package / fast:.2f}x the package; compile {first:.1f}s); largest "
                  f"difference {diff:.1e}", flush=True)


if __name__ == "__main__":
    main()
