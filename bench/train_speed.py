"""How fast does our Transformer train, and in how much memory, against torch.nn.Transformer
of the same size?

    python bench/train_speed.py [--steps 10] [--warmup 2] [--rounds 3] [--sizes tiny small]
                                [--max-tokens 4096 [one per size]] [--data-root DIR]
                                [--device cpu|cuda] [--tf32] [--bf16]
                                [--cudnn-attention on|off|both] [--peak-tflops T]
                                [--compile] [--compiled-ours] [--all-positions] [--unfused]
                                [--no-memory]

Both models have the same dimensions (model presets `tiny`, `small`, `base`), the same tied
embedding x sqrt(d) + sinusoidal positions, the same dropout on residuals/FFN and none on the
attention weights, the same label-smoothed loss, the same fused Adam and the same real
Multi30k batches (max_tokens 4096 by default, vocab 8000), stepped alternately in one run so
machine noise hits both alike, the timed steps `--rounds` times: ours/ref is the median of
the rounds' ratios, printed with their range (how far the machine's drift moves it). One
table row per size and setting: float32 by default;
`--tf32` adds rows with float32 matrix products on TF32 tensor cores, `--bf16` rows under bf16
autocast (TF32 for what stays float32), and `--cudnn-attention both` repeats every row with
scaled_dot_product_attention's cuDNN kernel off (`transformer.runtime.configure_cuda`; TF32
and cuDNN are CUDA switches, no-ops on a CPU). The GPU table, e.g. on an H200 in ~1 minute:

    python3 bench/train_speed.py --device cuda --sizes tiny base --max-tokens 8192 16384 \\
        --steps 8 --warmup 3 --tf32 --bf16 --cudnn-attention both

  ours  transformer.model.transformer.Transformer with the training loop's loss module
        (model.loss.LabelSmoothedLoss): the output projection on non-pad positions only,
        fused into the loss (layers.linear_label_smoothed_cross_entropy), attention through
        SDPA where it applies; --unfused also times it with the projection's logits fed to
        nn.CrossEntropyLoss (ours_logits)
  ref   torch.nn.Transformer(batch_first=True) with padding masks and a causal mask, output
        projection over all positions (as a typical nn.Transformer user writes it), loss with
        ignore_index=pad

Columns: updates/s and target tokens/s; ours/ref speed; peak RSS on a CPU (each model trains
a few float32 steps in its own subprocess: whole-process VmHWM); model FLOPs utilisation
(MFU); peak GPU memory on CUDA: the model's weights and Adam state plus the largest growth
of allocated memory during one of its steps (what training it alone needs, less the batch).

MFU = the model's training FLOPs / time / the device's peak for the row's precision. The
FLOPs are counted from the shapes, matrix products only, real tokens only (the reference's
products over padding count as waste, not work): for a batch with source lengths S_i and
target lengths T_i (EOS included), n_src = sum S_i, n_tgt = sum T_i, width d, FFN width f,
L_e + L_d layers and output vocabulary V, the forward pass takes these multiply-adds:

    encoder          L_e * (n_src * (4 d^2 + 2 d f) + 2 d * sum S_i^2)
    decoder self     L_d * (n_tgt * (4 d^2 + 2 d f) + 2 d * sum T_i (T_i + 1) / 2)
    cross-attention  L_d * (n_tgt * 2 d^2 + n_src * 2 d^2 + 2 d * sum S_i T_i)
    output           n_tgt * d * V

(projections 4 d^2 per token and attention layer: Q, K, V, output; the FFN 2 d f; scores and
the weighted sum 2 d per query-key pair, causal pairs only in the decoder). Training =
3 x forward (the backward pass computes two products per forward one), 2 FLOPs per
multiply-add: FLOPs = 6 x multiply-adds. The peak: --peak-tflops (one number for every row),
else on a known GPU the dense peak of its datasheet (NVIDIA H200 SXM: bf16 989.5 TFLOP/s,
TF32 494.7, float32 66.9), else n/a; on a CPU the threads x the clock /proc/cpuinfo reports
x the FLOPs a core's vector units can do per cycle for the row's precision
(`cpu_flops_per_cycle`, from the instruction sets and the family: two FMA units, AVX-512's
16 float32 lanes or 8 on Zen 4 and AVX2; bf16 twice that with AVX512-BF16, 1,024 on AMX
tiles). A VM reports its host's base clock, not the turbo the cores may run at.

On a shared machine, OpenMP's spin-waiting threads slow everything down by up to 10x when
another process holds a core; OMP_WAIT_POLICY=PASSIVE keeps absolute numbers meaningful
(the ratio is measured alternately either way).
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from timing import peak_rss_mib
from torch import Tensor, nn

from transformer.data.multi30k import DEFAULT_ROOT
from transformer.data.store import Batch
from transformer.data.tokenizer import PAD_ID
from transformer.hardware import cpu_info
from transformer.model.loss import LabelSmoothedLoss
from transformer.model.transformer import ModelConfig, PositionalEncoding, Transformer
from transformer.run.compose import compose_config
from transformer.run.data import Data, load_data
from transformer.run.data_config import DataConfig
from transformer.runtime import configure_cuda

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


# Dense peaks of NVIDIA's datasheets, TFLOP/s, by a part of torch.cuda.get_device_name.
PEAK_TFLOPS = {"H200": {"fp32": 66.9, "tf32": 494.7, "bf16": 989.5}}
PRECISIONS = {"fp32": "float32", "tf32": "float32 on TF32", "bf16": "bf16 autocast"}


@dataclass(frozen=True)
class Setting:
    """How a contender computes: precision fp32 (IEEE float32 matrix products), tf32
    (float32 with TF32 matrix products) or bf16 (autocast, TF32 for what stays float32);
    cudnn: whether SDPA may choose cuDNN attention. Both only matter on CUDA."""

    precision: str = "fp32"
    cudnn: bool = True

    def label(self, both_cudnn: bool) -> str:
        return self.precision + (" noCuDNN" if both_cudnn and not self.cudnn else "")

    def apply(self, device: str) -> None:
        if device.startswith("cuda"):  # process-wide switches, set before each step
            configure_cuda(tf32=self.precision != "fp32", cudnn_attention=self.cudnn)


@dataclass
class Contender:
    model: nn.Module
    optimizer: torch.optim.Optimizer
    step: Callable[[Batch], None]  # forward, loss, backward, Adam

    def state_bytes(self) -> int:
        """The weights and the optimizer's state."""
        tensors = [*self.model.parameters(),
                   *(t for s in self.optimizer.state.values() for t in s.values()
                     if isinstance(t, Tensor))]
        return sum(t.numel() * t.element_size() for t in tensors)


def model_config(size: str, vocab: int) -> ModelConfig:
    """The `size` preset with the recipe's dropout at Wu et al.'s budget (the recipe leaves
    it to the budget: schedule.DROPOUT_ROWS)."""
    return compose_config([f"model={size}", "model.dropout=0.3"]).model.to_model_config(
        vocab, vocab, share_embeddings=True)


def train_flops(c: ModelConfig, b: Batch) -> float:
    """FLOPs of one training step on `b` (the module docstring's count)."""
    S, T = b.src_valid_lens.double().cpu(), b.tgt_valid_lens.double().cpu()
    n_src, n_tgt, d, f = S.sum().item(), T.sum().item(), c.num_hiddens, c.ffn_num_hiddens
    encoder = c.num_encoder_layers * (n_src * (4 * d * d + 2 * d * f)
                                      + 2 * d * (S * S).sum().item())
    decoder = c.num_decoder_layers * (n_tgt * (4 * d * d + 2 * d * f)
                                      + 2 * d * (T * (T + 1) / 2).sum().item())
    cross = c.num_decoder_layers * ((n_tgt + n_src) * 2 * d * d + 2 * d * (S * T).sum().item())
    return 6 * (encoder + decoder + cross + n_tgt * d * c.tgt_vocab_size)


def build(kind: str, size: str, vocab: int, compile_model: bool, device: str = "cpu",
          bf16: bool = False) -> Contender:
    """One contender: kind ours, ref, ours_all (projection over all positions),
    ours_logits (logits + nn.CrossEntropyLoss) or ours_compiled (ours through torch.compile,
    as `trainer.compile=true` trains), under bf16 autocast if `bf16`."""
    config = model_config(size, vocab)
    torch.manual_seed(0)
    model = (ReferenceModel(config) if kind == "ref" else Transformer(config)).to(device)
    model.train()
    fused = kind in ("ours", "ours_compiled")
    wrapped = LabelSmoothedLoss(model, 0.1) if fused else model  # ours: -> loss
    compile_model = compile_model or kind == "ours_compiled"
    run = torch.compile(wrapped, dynamic=True) if compile_model else wrapped
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), fused=True)
    autocast = torch.autocast(torch.device(device).type, dtype=torch.bfloat16, enabled=bf16)
    criterion = nn.CrossEntropyLoss(ignore_index=PAD_ID, reduction="sum", label_smoothing=0.1)

    def step(b: Batch) -> None:
        with autocast:
            if fused:
                loss = run(b.src, b.src_valid_lens, b.tgt_in, b.tgt_out, b.tgt_index)
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

    return Contender(model, optimizer, step)


def peak_rss_child(kind: str, size: str, steps: int, data_root: str, max_tokens: int) -> None:
    """In a subprocess: the process's peak RSS (MiB) after `steps` float32 CPU steps."""
    data = load_bench_data(data_root, max_tokens)
    batches = [data.train.collate(i) for i in data.train_batches(1)[:steps]]
    step = build(kind, size, data.tokenizers.src.vocab_size, False).step
    for b in batches:
        step(b)
    print(json.dumps({"peak_mib": peak_rss_mib()}))


def peak_rss(kind: str, size: str, steps: int, data_root: str, max_tokens: int) -> float:
    out = subprocess.run([sys.executable, __file__, "--child", kind, "--sizes", size,
                          "--steps", str(steps), "--data-root", data_root,
                          "--max-tokens", str(max_tokens)], check=True,
                         capture_output=True,
                         text=True).stdout
    return json.loads(out.strip().splitlines()[-1])["peak_mib"]


def time_size(size: str, data: Data, steps: int, warmup: int, compile_model: bool,
              kinds: tuple[str, ...] = ("ours", "ref"), device: str = "cpu",
              settings: tuple[Setting, ...] = (Setting(),),
              extra_kinds: tuple[str, ...] = (), rounds: int = 1) -> dict:
    """Alternate the contenders (each kind under each setting, `extra_kinds` under the first
    setting only, ours_compiled among them under every setting) over the same batches, the
    timed ones `rounds` times: seconds per round (`round_seconds`) and in all (timed steps;
    `warmup_seconds`: the warm-up steps, a compilation's cost), peak GPU bytes (CUDA) and
    the totals of target tokens and training FLOPs of one round's batches."""
    cpu_batches = [data.train.collate(i) for i in data.train_batches(1)[: warmup + steps]]
    batches = [b.to(device) for b in cpu_batches]
    vocab = data.tokenizers.src.vocab_size
    keys = [(kind, s) for s in settings for kind in kinds]
    keys += [(kind, s) for kind in extra_kinds
             for s in (settings if kind == "ours_compiled" else settings[:1])]
    contenders = {key: build(key[0], size, vocab, compile_model, device,
                             bf16=key[1].precision == "bf16") for key in keys}
    cuda = device.startswith("cuda")
    sync = (lambda: torch.cuda.synchronize(device)) if cuda else (lambda: None)
    seconds, growth = dict.fromkeys(contenders, 0.0), dict.fromkeys(contenders, 0)
    warmup_seconds = dict.fromkeys(contenders, 0.0)
    round_seconds = {key: [0.0] * rounds for key in contenders}
    schedule = [*enumerate(batches[:warmup]),
                *((warmup + r * steps + j, b) for r in range(rounds)
                  for j, b in enumerate(batches[warmup:]))]
    for i, batch in schedule:
        for key, contender in contenders.items():
            key[1].apply(device)
            sync()
            if cuda:
                before = torch.cuda.memory_allocated(device)
                torch.cuda.reset_peak_memory_stats(device)
            start = time.perf_counter()
            contender.step(batch)
            sync()
            if i >= warmup:
                seconds[key] += time.perf_counter() - start
                round_seconds[key][(i - warmup) // steps] += time.perf_counter() - start
            else:
                warmup_seconds[key] += time.perf_counter() - start
            if cuda:
                growth[key] = max(growth[key], torch.cuda.max_memory_allocated(device) - before)
    timed = cpu_batches[warmup:]
    config = model_config(size, vocab)
    return {"seconds": {key: t / rounds for key, t in seconds.items()},
            "round_seconds": round_seconds, "warmup_seconds": warmup_seconds, "steps": steps,
            "gpu_bytes": ({key: c.state_bytes() + growth[key] for key, c in contenders.items()}
                          if cuda else {}),
            "tokens": sum(b.num_tgt_tokens for b in timed),
            "flops": sum(train_flops(config, b) for b in timed),
            "padding": 1 - sum(b.num_tgt_tokens for b in timed)
            / sum(b.tgt_out.numel() for b in timed)}


def peak_tflops(device: str, precision: str, override: float | None) -> float | None:
    if override is not None:
        return override
    if device.startswith("cuda"):
        name = torch.cuda.get_device_name(device)
        for part, peaks in PEAK_TFLOPS.items():
            if part in name:
                return peaks[precision]
        return None
    flops, _ = cpu_flops_per_cycle(precision)
    clock = cpu_info("cpu MHz")
    return None if clock is None else torch.get_num_threads() * float(clock) * flops / 1e6


def cpu_flops_per_cycle(precision: str) -> tuple[int, str]:
    """A CPU core's peak FLOPs per cycle for `precision`'s matrix products, and why: two
    FMA units a core (Intel's AVX-512 server cores, Zen 5; Zen 4 runs AVX-512 on 256-bit
    units, AVX2 cores on 256-bit ones), 2 FLOPs per lane and FMA; bf16 doubles the lanes
    where AVX512-BF16 has them natively (`vdpbf16ps`), and an AMX tile multiply does 1,024
    bf16 FLOPs a cycle (Intel's figure for Sapphire Rapids); bf16 without either is
    emulated in float32."""
    flags = set((cpu_info("flags") or "").split())
    family = cpu_info("cpu family")
    if "avx512f" in flags:
        lanes, why = (8, "Zen 4: AVX-512 on 256-bit units") if family == "25" else (
            16, "AVX-512, two FMA units")
    else:
        lanes, why = 8, "AVX2, two 256-bit FMA units"
    fp32 = 2 * lanes * 2
    if precision != "bf16":
        return fp32, why
    if "amx_bf16" in flags:
        return 1024, "AMX tiles, bf16"
    if "avx512_bf16" in flags:
        return 2 * fp32, why + ", AVX512-BF16"
    return fp32, why + ", bf16 emulated in float32"


def cell(value: float | None, width: int, spec: str) -> str:
    """`value` formatted, or n/a for a missing or NaN value."""
    missing = value is None or math.isnan(value)
    return f"{'n/a' if missing else format(value, spec):>{width}}"


def table_row(size: str, label: str, r: dict, setting: Setting, rss: dict[str, float],
              peak: float | None) -> str:
    """One row of the table: `r` from time_size, `rss` peak RSS by kind, `peak` TFLOP/s."""
    o, f, n = r["seconds"]["ours", setting], r["seconds"]["ref", setting], r["tokens"]
    ratios = sorted(ref / ours for ours, ref in zip(r["round_seconds"]["ours", setting],
                                                   r["round_seconds"]["ref", setting],
                                                   strict=True))
    mfu = {kind: None if peak is None else r["flops"] / t / (peak * 1e12)
           for kind, t in (("ours", o), ("ref", f))}
    gpu = {kind: r["gpu_bytes"][kind, setting] / 2**20 if r["gpu_bytes"] else None
           for kind in ("ours", "ref")}
    return (f"{size:<7}{label:<14}{r['steps'] / o:>11.2f}{r['steps'] / f:>10.2f}"
            f"{n / o:>11.0f}{n / f:>10.0f}{statistics.median(ratios):>8.2f}x"
            f"{f'{ratios[0]:.2f}-{ratios[-1]:.2f}x':>13}"
            f"{cell(rss.get('ours'), 9, '.0f')}{cell(rss.get('ref'), 8, '.0f')}"
            f"{cell(mfu['ours'], 9, '.1%')}{cell(mfu['ref'], 8, '.1%')}"
            f"{cell(gpu['ours'], 13, '.0f')}{cell(gpu['ref'], 12, '.0f')}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10, help="timed steps per model and size")
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3,
                        help="times the timed steps run (alternating the models): ours/ref "
                             "is the median of the rounds' ratios, with their range")
    parser.add_argument("--sizes", nargs="+", default=["tiny", "small"])
    parser.add_argument("--compile", action="store_true",
                        help="torch.compile both models (slow first steps: raise --warmup)")
    parser.add_argument("--compiled-ours", action="store_true",
                        help="also time ours through torch.compile (trainer.compile=true) "
                             "under every precision: the ratio to eager ours, and the "
                             "warm-up steps' seconds (what compiling costs a budget)")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak RSS runs")
    parser.add_argument("--all-positions", action="store_true",
                        help="also time ours with the projection over all positions")
    parser.add_argument("--unfused", action="store_true",
                        help="also time ours with logits + nn.CrossEntropyLoss (no fused loss)")
    parser.add_argument("--data-root", default=DEFAULT_ROOT,
                        help="folder of the Multi30k files (default: the download cache)")
    parser.add_argument("--max-tokens", type=int, nargs="+", default=[4096],
                        help="tokens per batch and side: one number, or one per size")
    parser.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N")
    parser.add_argument("--tf32", action="store_true",
                        help="also time both models with TF32 float32 matrix products (CUDA)")
    parser.add_argument("--bf16", action="store_true",
                        help="also time both models under bf16 autocast")
    parser.add_argument("--cudnn-attention", choices=["on", "off", "both"], default="on",
                        help="let SDPA choose cuDNN attention (CUDA; default on, PyTorch's "
                             "default), not, or time every row both ways")
    parser.add_argument("--peak-tflops", type=float,
                        help="the peak (TFLOP/s) for MFU, every row (default: the GPU's "
                             "datasheet peak for the row's precision where known, else n/a)")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if len(args.max_tokens) not in (1, len(args.sizes)):
        parser.error("--max-tokens takes one number, or one per size")
    max_tokens = dict(zip(args.sizes, args.max_tokens * len(args.sizes)
                          if len(args.max_tokens) == 1 else args.max_tokens, strict=True))
    if args.child:
        peak_rss_child(args.child, args.sizes[0], args.steps, args.data_root,
                       args.max_tokens[0])
        return

    cuda = args.device.startswith("cuda")
    precisions = ["fp32"] + ["tf32"] * args.tf32 + ["bf16"] * args.bf16
    cudnn = {"on": [True], "off": [False], "both": [True, False]}[args.cudnn_attention]
    settings = tuple(Setting(p, c) for p in precisions for c in cudnn)
    extra_kinds = (("ours_all",) * args.all_positions + ("ours_logits",) * args.unfused
                   + ("ours_compiled",) * args.compiled_ours)
    where = (torch.cuda.get_device_name(args.device) if cuda
             else f"CPU, {torch.get_num_threads()} threads")
    tokens = (", ".join(f"{n} ({size})" for size, n in max_tokens.items())
              if len(set(args.max_tokens)) > 1 else str(args.max_tokens[0]))
    print(f"torch {torch.__version__}, {where}, {', '.join(PRECISIONS[p] for p in precisions)}"
          f", Multi30k en-de batches (max_tokens {tokens}, vocab 8000), {args.steps} steps "
          f"per model after {args.warmup} warm-up{', torch.compile' if args.compile else ''}")
    print("ref = torch.nn.Transformer, output projection over all positions; "
          "ours = projection on non-pad positions only, fused into the loss")
    peaks = {p: peak_tflops(args.device, p, args.peak_tflops) for p in precisions}
    print("MFU against " + (", ".join(f"{p} {peaks[p]:.3g}" for p in precisions)
                            + " TFLOP/s" if peaks[precisions[0]] is not None
                            else "n/a: no known peak for this device (--peak-tflops)"))
    if not cuda and args.peak_tflops is None and peaks[precisions[0]] is not None:
        print("  (the CPU's peak: threads x /proc/cpuinfo's clock, "
              f"{cpu_info('cpu MHz')} MHz, x FLOPs per cycle and core: " + "; ".join(
                  f"{p} {cpu_flops_per_cycle(p)[0]} ({cpu_flops_per_cycle(p)[1]})"
                  for p in precisions) + "; a VM's clock is its host's base clock)")
    if cuda:
        print("CUDA switches per row (transformer.runtime.configure_cuda): fp32 IEEE float32 "
              "matrix products, tf32 and bf16 TF32; cuDNN attention allowed unless noCuDNN")
    header = (f"{'model':<7}{'setting':<14}{'ours upd/s':>11}{'ref upd/s':>10}"
              f"{'ours tok/s':>11}{'ref tok/s':>10}{'ours/ref':>9}{'rounds':>13}{'ours MiB':>9}"
              f"{'ref MiB':>8}{'ours MFU':>9}{'ref MFU':>8}{'ours GPU MiB':>13}"
              f"{'ref GPU MiB':>12}")
    rows = []
    for size in args.sizes:
        data = load_bench_data(args.data_root, max_tokens[size])
        r = time_size(size, data, args.steps, args.warmup, args.compile, ("ours", "ref"),
                      args.device, settings, extra_kinds, args.rounds)
        rss = ({} if args.no_memory or cuda else
               {kind: peak_rss(kind, size, min(args.steps, 3), args.data_root,
                               max_tokens[size]) for kind in ("ours", "ref")})
        s, n, first = r["seconds"], r["tokens"], settings[0]
        rows += [table_row(size, setting.label(len(cudnn) > 1), r, setting,
                           rss if setting is first else {},  # the RSS runs: float32
                           peaks[setting.precision]) for setting in settings]
        print(f"  ({size}: target padding in these batches {r['padding']:.1%}; "
              f"{r['flops'] / n / 1e6:.1f} MFLOP per target token to train)", flush=True)
        if len(settings) > 1:
            print(f"  ({size}: speed against {first.label(False)}: " + "; ".join(
                f"{kind} " + ", ".join(f"{p.label(len(cudnn) > 1)} "
                                       f"{s[kind, first] / s[kind, p]:.2f}x"
                                       for p in settings[1:]) for kind in ("ours", "ref")) + ")")
        if args.all_positions:
            print(f"  ({size}: ours with the projection over all positions: "
                  f"{n / s['ours_all', first]:.0f} tok/s, "
                  f"{s['ref', first] / s['ours_all', first]:.2f}x ref)")
        if args.unfused:
            print(f"  ({size}: ours with logits + nn.CrossEntropyLoss: "
                  f"{n / s['ours_logits', first]:.0f} tok/s; fused/unfused speed "
                  f"{s['ours_logits', first] / s['ours', first]:.2f}x)")
        if args.compiled_ours:
            print(f"  ({size}: ours compiled vs eager: " + "; ".join(
                f"{p.label(len(cudnn) > 1)} {s['ours', p] / s['ours_compiled', p]:.2f}x "
                f"({n / s['ours_compiled', p]:.0f} tok/s; its {args.warmup} warm-up steps "
                f"{r['warmup_seconds']['ours_compiled', p]:.1f} s, eager's "
                f"{r['warmup_seconds']['ours', p]:.1f} s)" for p in settings) + ")")
    print(header, *rows, sep="\n")


if __name__ == "__main__":
    main()
