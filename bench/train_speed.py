"""Benchmark: training speed and peak memory of our Transformer vs. torch.nn.Transformer.

Both models have the same dimensions (model presets `tiny` and `small`), the same tied
embedding x sqrt(d) + sinusoidal positions, the same dropout on residuals/FFN and none on the
attention weights, the same label-smoothed loss, the same fused Adam and the same real
Multi30k batches (max_tokens 4096 by default, vocab 8000), stepped alternately in one run so
machine noise hits both alike. CPU float32 by default; `--device cuda --bf16` also times both
under bf16 autocast (ours_bf16, ref_bf16), e.g. the base model at 16k tokens on a GPU:

    python bench/train_speed.py --device cuda --sizes base --max-tokens 16384 --bf16 --no-memory

  ours  transformer.model.Transformer with the training loop's loss module
        (training.LabelSmoothedLoss): the output projection on non-pad positions only, fused
        into the loss (ops.linear_label_smoothed_cross_entropy), attention through SDPA where
        it applies; --unfused also times it with the projection's logits fed to
        nn.CrossEntropyLoss (ours_logits)
  ref   torch.nn.Transformer(batch_first=True) with padding masks and a causal mask, output
        projection over all positions (as a typical nn.Transformer user writes it), loss with
        ignore_index=pad

Peak RSS: each model trains a few steps in its own subprocess (whole-process VmHWM).

    python bench/train_speed.py [--steps 10] [--sizes tiny small] [--compile] [--all-positions]
                                [--unfused] [--data-root DIR] [--max-tokens 4096]
                                [--device cpu|cuda] [--bf16]

On a shared machine, OpenMP's spin-waiting threads slow everything down by up to 10x when
another process holds a core; OMP_WAIT_POLICY=PASSIVE keeps absolute numbers meaningful
(the ratio is measured alternately either way).
"""

from __future__ import annotations

import argparse
import json
import math
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch
from memory import status_mib  # bench/memory.py
from torch import Tensor, nn

from transformer.config import DataConfig, compose_config
from transformer.data import Data, load_data
from transformer.loss import LabelSmoothedLoss
from transformer.model import ModelConfig, PositionalEncoding, Transformer
from transformer.multi30k import DEFAULT_ROOT
from transformer.store import Batch
from transformer.tokenizer import PAD_ID

REPO = Path(__file__).resolve().parents[1]
DATA_DIR = Path(tempfile.gettempdir()) / "transformer-bench-train-speed"  # spm + cache, reused


class ReferenceModel(nn.Module):
    """torch.nn.Transformer with the same embeddings, positions and tied output projection."""

    def __init__(self, c: ModelConfig):
        super().__init__()
        self.d = c.num_hiddens
        self.embedding = nn.Embedding(c.src_vocab_size, c.num_hiddens, padding_idx=PAD_ID)
        nn.init.normal_(self.embedding.weight, std=c.num_hiddens ** -0.5)
        self.pos = PositionalEncoding(c.num_hiddens, c.dropout, c.max_positions)
        self.transformer = nn.Transformer(
            c.num_hiddens, c.num_heads, c.num_encoder_layers, c.num_decoder_layers,
            c.ffn_num_hiddens, c.dropout, batch_first=True)
        for module in self.transformer.modules():  # no attention-weight dropout, as ours
            if isinstance(module, nn.MultiheadAttention):
                module.dropout = 0.0

    def forward(self, src: Tensor, src_valid_lens: Tensor, tgt_in: Tensor) -> Tensor:
        src_pad, tgt_pad = src == PAD_ID, tgt_in == PAD_ID
        T = tgt_in.shape[1]
        causal = torch.ones(T, T, dtype=torch.bool, device=tgt_in.device).triu(1)  # True: masked
        hidden = self.transformer(
            self.pos(self.embedding(src) * math.sqrt(self.d)),
            self.pos(self.embedding(tgt_in) * math.sqrt(self.d)),
            tgt_mask=causal, src_key_padding_mask=src_pad, tgt_key_padding_mask=tgt_pad,
            memory_key_padding_mask=src_pad, tgt_is_causal=True)
        return hidden @ self.embedding.weight.T  # (batch, tgt_len, vocab): all positions


def load_bench_data(data_root: str, max_tokens: int = 4096) -> Data:
    """Multi30k en-de from `data_root` (downloaded if missing), vocab 8000; the tokenizer and
    encoded cache are kept in a temporary folder between runs."""
    cfg = DataConfig(root=data_root, vocab_size=8000, max_tokens=max_tokens)
    return load_data(cfg, DATA_DIR)


def build(kind: str, size: str, vocab: int, compile_model: bool,
          device: str = "cpu") -> tuple[nn.Module, Callable]:
    """(model, step(batch) -> None) for one contender; step = forward, loss, backward, Adam.
    A kind ending in "_bf16" runs under bf16 autocast."""
    settings = compose_config([f"model={size}"]).model
    config = settings.to_model_config(vocab, vocab, share_embeddings=True)
    amp = kind.endswith("_bf16")
    kind = kind.removesuffix("_bf16")
    torch.manual_seed(0)
    model = (ReferenceModel(config) if kind == "ref" else Transformer(config)).to(device)
    model.train()
    wrapped = LabelSmoothedLoss(model, 0.1) if kind == "ours" else model  # ours: -> loss
    run = torch.compile(wrapped, dynamic=True) if compile_model else wrapped
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), fused=True)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=amp)
    criterion = nn.CrossEntropyLoss(ignore_index=PAD_ID, reduction="sum", label_smoothing=0.1)

    def step(b: Batch) -> None:
        with autocast:
            if kind == "ours":
                loss = run(b.src, b.src_valid_lens, b.tgt_in, b.tgt_out)
            elif kind == "ours_logits":
                mask = b.tgt_out != PAD_ID
                loss = criterion(run(b.src, b.src_valid_lens, b.tgt_in, output_mask=mask),
                                 b.tgt_out[mask])
            else:  # ref, or ours_all: the projection over all positions, padding included
                logits = run(b.src, b.src_valid_lens, b.tgt_in)
                loss = criterion(logits.flatten(0, 1).float(), b.tgt_out.flatten())
        (loss / b.num_tgt_tokens).backward()
        nn.utils.clip_grad_norm_(model.parameters(), math.inf)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return model, step


def peak_rss_child(kind: str, size: str, steps: int, data_root: str, max_tokens: int) -> None:
    """In a subprocess: the process's peak RSS (MiB) after `steps` training steps."""
    data = load_bench_data(data_root, max_tokens)
    batches = [data.train.collate(i) for i in data.train_batches(1)[:steps]]
    _, step = build(kind, size, data.tokenizers.src.vocab_size, False)
    for b in batches:
        step(b)
    print(json.dumps({"peak_mib": status_mib("VmHWM")}))


def peak_rss(kind: str, size: str, steps: int, data_root: str, max_tokens: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--sizes", size,
                          "--steps", str(steps), "--data-root", data_root,
                          "--max-tokens", str(max_tokens)], check=True,
                         capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


def time_size(size: str, data: Data, steps: int, warmup: int, compile_model: bool,
              kinds: tuple[str, ...] = ("ours", "ref"), device: str = "cpu") -> dict:
    """Alternate the contenders over the same batches; seconds and tokens per contender."""
    batches = [data.train.collate(i).to(device)
               for i in data.train_batches(1)[: warmup + steps]]
    vocab = data.tokenizers.src.vocab_size
    steppers = {kind: build(kind, size, vocab, compile_model, device)[1] for kind in kinds}
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    seconds = dict.fromkeys(steppers, 0.0)
    for i, batch in enumerate(batches):
        for kind, step in steppers.items():
            sync()
            start = time.perf_counter()
            step(batch)
            sync()
            if i >= warmup:
                seconds[kind] += time.perf_counter() - start
    tokens = sum(b.num_tgt_tokens for b in batches[warmup:])
    return {"seconds": seconds, "tokens": tokens, "steps": steps,
            "padding": 1 - tokens / sum(b.tgt_out.numel() for b in batches[warmup:])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model and size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile both models (slow first steps: raise --warmup)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak RSS runs")
    parser.add_argument("--all-positions", action="store_true",
                        help="also time ours with the projection over all positions")
    parser.add_argument("--unfused", action="store_true",
                        help="also time ours with logits + nn.CrossEntropyLoss (no fused loss)")
    parser.add_argument("--data-root", default=DEFAULT_ROOT,
                        help="folder of the Multi30k files (default: the download cache)")
    parser.add_argument("--max-tokens", type=int, default=4096, help="tokens per batch and side")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--bf16", action="store_true",
                        help="also time both models under bf16 autocast (ours_bf16, ref_bf16)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        peak_rss_child(args.child, args.sizes[0], args.steps, args.data_root, args.max_tokens)
        return

    data = load_bench_data(args.data_root, args.max_tokens)
    where = (torch.cuda.get_device_name(args.device) if args.device.startswith("cuda")
             else f"CPU, {torch.get_num_threads()} threads")
    print(f"torch {torch.__version__}, {where}, float32{' and bf16 autocast' * args.bf16}, "
          f"Multi30k en-de batches (max_tokens {args.max_tokens}, vocab 8000), {args.steps} "
          f"steps per model after {args.warmup} warm-up"
          f"{', torch.compile' if args.compile else ''}")
    print("ref = torch.nn.Transformer, output projection over all positions; "
          "ours = projection on non-pad positions only, fused into the loss")
    header = (f"{'model':<7}{'ours upd/s':>11}{'ref upd/s':>10}{'ours tok/s':>11}"
              f"{'ref tok/s':>10}{'ours/ref':>9}{'ours MiB':>9}{'ref MiB':>8}")
    rows = []
    for size in args.sizes:
        kinds = (("ours", "ref") + (("ours_all",) if args.all_positions else ())
                 + (("ours_logits",) if args.unfused else ())
                 + (("ours_bf16", "ref_bf16") if args.bf16 else ()))
        r = time_size(size, data, args.steps, args.warmup, args.compile, kinds, args.device)
        mem = ({} if args.no_memory else
               {kind: peak_rss(kind, size, min(args.steps, 3), args.data_root, args.max_tokens)
                for kind in ("ours", "ref")})
        s, n = r["seconds"], r["tokens"]
        rows.append(f"{size:<7}{r['steps'] / s['ours']:>11.2f}{r['steps'] / s['ref']:>10.2f}"
                    f"{n / s['ours']:>11.0f}{n / s['ref']:>10.0f}{s['ref'] / s['ours']:>8.2f}x"
                    f"{mem.get('ours', math.nan):>9.0f}{mem.get('ref', math.nan):>8.0f}")
        print(f"  ({size}: target padding in these batches {r['padding']:.1%})", flush=True)
        if args.all_positions:
            print(f"  ({size}: ours with the projection over all positions: "
                  f"{n / s['ours_all']:.0f} tok/s, {s['ref'] / s['ours_all']:.2f}x ref)")
        if args.bf16:
            print(f"  ({size}: bf16 autocast: ours {n / s['ours_bf16']:.0f} tok/s, ref "
                  f"{n / s['ref_bf16']:.0f} tok/s, ours/ref {s['ref_bf16'] / s['ours_bf16']:.2f}x;"
                  f" ours bf16/fp32 speed {s['ours'] / s['ours_bf16']:.2f}x)")
        if args.unfused:
            print(f"  ({size}: ours with logits + nn.CrossEntropyLoss: "
                  f"{n / s['ours_logits']:.0f} tok/s; fused/unfused speed "
                  f"{s['ours_logits'] / s['ours']:.2f}x)")
    print(header, *rows, sep="\n")


if __name__ == "__main__":
    main()
