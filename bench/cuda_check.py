"""Does the CUDA path compute what the CPU path does, and how fast does it train? Every line
compares the GPU against a reference (bench/cuda_check.sh runs it with a training run).

    python bench/cuda_check.py [--checkpoint runs/x/chosen.pt --src test.en --hyp cpu.hyp]

1. attention: the fused path (`scaled_dot_product_attention`) equals the book's explicit
   path on CUDA, with padding (`valid_lens`) and causal masks, in float32 and under bf16
   autocast; and it runs with the math fallback disabled, i.e. in a fused CUDA kernel.
2. model: CUDA logits equal CPU logits (same weights, float32); bf16 autocast stays close.
3. loss: `layers.linear_label_smoothed_cross_entropy` on CUDA equals nn.CrossEntropyLoss over
   the projected logits (value and gradients), float32 and bf16 autocast.
4. decoding: cached equals uncached decoding on CUDA.
5. training step speed on CUDA, float32 vs bf16 autocast (tokens/s, same run).
6. with --checkpoint: beam search of a trained model on CUDA reproduces the CPU hypotheses.

Exits 1 if any check fails. It runs on CPU too (checks 1-4 then compare CPU with CPU).
Needs torch >= 2.5 (`SDPBackend.CUDNN_ATTENTION`); run on the GPU with torch 2.11.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from timing import timed
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from transformer.decoding.translator import Translator
from transformer.model.attention import MultiHeadAttention
from transformer.model.layers import linear_label_smoothed_cross_entropy
from transformer.model.loss import LabelSmoothedLoss
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run.compose import compose_config

FAILED: list[str] = []


def check(name: str, ok: bool, detail: str) -> None:
    print(f"{'PASS' if ok else 'FAIL'}  {name}: {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return (a.float().cpu() - b.float().cpu()).abs().max().item()


def recipe_config() -> ModelConfig:
    """The recipe's model (configs/: Transformer-Tiny, with the dropout of Wu et al.'s
    budget, 0.3) over an 8k joint vocabulary."""
    return compose_config(["model=tiny", "model.dropout=0.3"]).model.to_model_config(8000, 8000,
                                                                      share_embeddings=True)


def random_batch(B: int, S: int, T: int, device: torch.device, vocab: int = 8000):
    g = torch.Generator().manual_seed(0)
    src = torch.randint(4, vocab, (B, S), generator=g)
    lens = torch.randint(S // 2, S + 1, (B,), generator=g)
    lens[0] = S
    src = src.masked_fill(torch.arange(S)[None] >= lens[:, None], 0)
    tgt = torch.randint(4, vocab, (B, T + 1), generator=g)
    return src.to(device), lens.to(device), tgt[:, :-1].to(device), tgt[:, 1:].to(device)


def check_attention(device: torch.device) -> None:
    torch.manual_seed(0)
    mha = MultiHeadAttention(64, 64, 64, 128, 4, 0.0, bias=True).to(device).eval()
    X = torch.randn(8, 50, 64, device=device)
    Y = torch.randn(8, 37, 64, device=device)
    valid_lens = torch.randint(1, 38, (8,), device=device)
    cases = {"self, causal": (X, X, None, True), "cross, valid_lens": (X, Y, valid_lens, False)}
    for name, (q, kv, lens, causal) in cases.items():
        for dtype, tol in ((None, 1e-5), (torch.bfloat16, 3e-2)):
            with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=bool(dtype)):
                explicit = mha(q, kv, kv, lens, causal=causal, need_weights=True)
                fused = mha(q, kv, kv, lens, causal=causal, need_weights=False)
            label = "bf16 autocast" if dtype else "float32"
            check(f"attention {name}, {label}: fused == explicit", max_diff(fused, explicit) <= tol,
                  f"max |diff| {max_diff(fused, explicit):.2e} (tol {tol:.0e}), "
                  f"output {fused.dtype}")
    if device.type == "cuda":
        for name, (q, kv, lens, causal) in cases.items():
            try:  # only fused kernels allowed: an error here means the math fallback ran
                with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION,
                                  SDPBackend.CUDNN_ATTENTION]), \
                        torch.autocast("cuda", dtype=torch.bfloat16):
                    mha(q, kv, kv, lens, causal=causal)
                check(f"attention {name}: runs in a fused CUDA kernel", True,
                      "flash/efficient/cuDNN only, no math fallback")
            except RuntimeError as e:
                check(f"attention {name}: runs in a fused CUDA kernel", False,
                      str(e).splitlines()[0][:200])


def check_model_and_loss(device: torch.device) -> None:
    torch.manual_seed(0)
    cpu_model = Transformer(recipe_config()).eval()
    model = Transformer(recipe_config()).to(device).eval()
    model.load_state_dict(cpu_model.state_dict())
    src, lens, tgt_in, tgt_out = random_batch(16, 30, 25, device)
    with torch.no_grad():
        ref = cpu_model(src.cpu(), lens.cpu(), tgt_in.cpu())
        out = model(src, lens, tgt_in)
        with torch.autocast(device.type, dtype=torch.bfloat16):
            out_bf16 = model(src, lens, tgt_in)
    check(f"model logits, {device.type} float32 == CPU float32", max_diff(out, ref) <= 1e-4,
          f"max |diff| {max_diff(out, ref):.2e}")
    rel = max_diff(out_bf16, ref) / ref.abs().max().item()
    check(f"model logits, {device.type} bf16 autocast ~ CPU float32", rel <= 0.05,
          f"max |diff| / max |logit| {rel:.2e}, logits {out_bf16.dtype}")

    # The fused loss against nn.CrossEntropyLoss over the projected logits.
    h = torch.randn(3000, 128, device=device, requires_grad=True)
    W = (torch.randn(8000, 128, device=device) * 128 ** -0.5).requires_grad_()
    t = torch.randint(0, 8000, (3000,), device=device)
    ref_loss = nn.CrossEntropyLoss(label_smoothing=0.1, reduction="sum")(h @ W.t(), t)
    ref_grads = torch.autograd.grad(ref_loss, (h, W))
    for dtype, tol in ((None, 1e-5), (torch.bfloat16, 1e-2)):
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=bool(dtype)):
            loss = linear_label_smoothed_cross_entropy(h, W, t, 0.1)
        grads = torch.autograd.grad(loss, (h, W))
        rel_loss = abs(loss.item() - ref_loss.item()) / ref_loss.item()
        rel_grad = max(max_diff(g, r) / r.abs().max().item()
                       for g, r in zip(grads, ref_grads, strict=True))
        label = "bf16 autocast" if dtype else "float32"
        check(f"fused loss, {label} == CrossEntropyLoss(label_smoothing=0.1)",
              rel_loss <= tol and rel_grad <= 10 * tol,
              f"relative loss diff {rel_loss:.1e}, gradient {rel_grad:.1e}; loss {loss.dtype}, "
              f"grads {grads[0].dtype}/{grads[1].dtype}")

    # Cached decoding (one step at a time) equals the full teacher-forced pass.
    with torch.no_grad():
        enc = model.encode(src, lens)
        cache = model.new_cache()
        steps = [model.decode_step(tgt_in[:, i:i + 1], enc, lens, cache) for i in range(25)]
    diff = max_diff(torch.cat(steps, 1), out)
    check(f"cached decoding == full forward on {device.type}", diff <= 1e-4,
          f"max |diff| {diff:.2e} over 25 steps")


def time_training(device: torch.device, steps: int = 30) -> None:
    """Tokens/s of the training step (model + fused loss + Adam), float32 vs bf16, alternating."""
    torch.manual_seed(0)
    model = Transformer(recipe_config()).to(device).train()
    loss_fn = LabelSmoothedLoss(model, 0.1)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98))
    src, lens, tgt_in, tgt_out = random_batch(256, 16, 16, device)  # ~4,096 target tokens
    ntok = int((tgt_out != 0).sum())
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def step(dtype) -> None:
        with torch.autocast(device.type, dtype=dtype or torch.float32, enabled=bool(dtype)):
            loss = loss_fn(src, lens, tgt_in, tgt_out)
        opt.zero_grad(set_to_none=True)
        (loss / ntok).backward()
        opt.step()

    times = {None: 0.0, torch.bfloat16: 0.0}
    for dtype in times:  # warm-up
        for _ in range(min(3, steps)):
            step(dtype)
    for _ in range(steps):
        for dtype in times:
            sync()
            start = time.perf_counter()
            step(dtype)
            sync()
            times[dtype] += time.perf_counter() - start
    fp32, bf16 = (steps * ntok / times[d] for d in times)
    print(f"INFO  training step on {device.type}, {ntok} target tokens/step: float32 "
          f"{fp32:,.0f} tok/s, bf16 autocast {bf16:,.0f} tok/s ({bf16 / fp32:.2f}x)", flush=True)


def check_translation(device: torch.device, checkpoint: Path, src: Path, hyp: Path,
                      alpha: float) -> None:
    lines = src.read_text(encoding="utf-8").splitlines()
    reference = hyp.read_text(encoding="utf-8").splitlines()
    translator = Translator.load(checkpoint, device=device)
    seconds, out = timed(lambda: translator.translate(lines, beam_size=5, alpha=alpha))
    same = sum(a == b for a, b in zip(out, reference, strict=True))
    check(f"beam 5 on {device.type} reproduces the CPU hypotheses", same >= 0.99 * len(lines),
          f"{same}/{len(lines)} identical; {len(lines) / seconds:.0f} sentences/s")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--checkpoint", type=Path)
    p.add_argument("--src", type=Path, help="source lines to translate with --checkpoint")
    p.add_argument("--hyp", type=Path, help="the CPU's translations of --src to reproduce")
    p.add_argument("--alpha", type=float, default=1.0)
    p.add_argument("--steps", type=int, default=30, help="timed training steps per precision")
    args = p.parse_args()
    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    print(f"INFO  torch {torch.__version__}, device {device} ({name})", flush=True)
    check_attention(device)
    check_model_and_loss(device)
    time_training(device, args.steps)
    if args.checkpoint:
        check_translation(device, args.checkpoint, args.src, args.hyp, args.alpha)
    print(f"{len(FAILED)} check(s) failed" + (f": {FAILED}" if FAILED else ""))
    sys.exit(1 if FAILED else 0)


if __name__ == "__main__":
    main()
