"""Benchmark: our PyTorch engine (float32, and int8: `quantize="int8"`) vs CTranslate2 float32
and int8 exports of the same model, each also with a vocabulary map (counted in Multi30k's
training pairs), on Multi30k test_2016_flickr (en -> de), beam 5, CPU, in one run; and the
decoding modes (sampling, alignments) of both engines.

For each thread count (default 1 and 2) and row, a fresh subprocess loads the model,
warms up on 8 sentences, then translates the whole test set (best of --repeats); all of that
--rounds times over, row after row, so a slow minute of the machine does not fall on
one row only; each row is its fastest run. Reported: sentences/s,
target tokens/s (output pieces + EOS, re-encoded from the text), the sentences/s of the
first timed pass ("1st": what a one-off `transformer translate` of the set sees, kernels for
new matrix shapes still being made), peak RSS of that process,
model size on disk (our checkpoint file; CTranslate2's model.bin) and cased sacreBLEU. Ratios
are against our engine's beam search at the same thread count, measured in this run. The
exports are made here from --checkpoint with scripts/export.py's code. Both engines decode
with the same settings (beam 5, the checkpoint's alpha, max length 1.5 * source + 10, batches
of --max-tokens source tokens, by default the package's own: a baseline row decodes with its
package's); see transformer/engines.py for how the searches are matched (a CTranslate2 row's
time includes its second search of sentences that ran past their own length limit; with
`--ct2-once` it searches each batch once, as CTranslate2 by itself does).

Rows: each engine's beam search ("torch int8": ours with its linear layers in PyTorch's
dynamic int8, `Translator.load(..., quantize="int8")`, compared with "ct2 int8"); "sampling"
(top-k 10, seed 1: back-translation's setting) and "+ alignment" (beam search, each output
also word-aligned) for ours and CTranslate2 float32; with `--baseline-src DIR`, "torch
baseline": our engine as the package in DIR/src decodes (e.g. a `git worktree` of an
earlier commit), for speed-ups measured in the same run.
`--rows` picks rows by name.

    python bench/engines.py [--checkpoint RUN_OR_PT] [--data-root DIR] [--threads 1 2]
                            [--sentences 1000] [--join 1] [--repeats 3] [--rounds 2]
                            [--profile] [--baseline-src DIR] [--rows "torch" "ct2 float32" ...]
                            [--ct2-once] [--isa AVX2|AVX512]

`--join 4` translates every 4 consecutive test lines as one input (long inputs; the
references joined alike). Below the table, at every thread count: ours float32 against
CTranslate2 float32 and ours int8 against CTranslate2 int8, as the ratio of sentences/s
(target: at least 0.8x) and the share of inputs with the same output (float32: at least 99%);
beside it the same ratio within each round (the two rows' processes run one after the other),
whose spread shows how far the machine's drift moves the ratio.

Above the table: the CPU's name and what PyTorch's kernels use on it (its CPU capability,
e.g. AVX512, and whether it computes bf16 natively, AVX512-BF16). `--isa AVX2` (or AVX512,
without VNNI) holds every library to that instruction set (`ISA_LIMITS`), as a CPU with
only it would run: this machine's clock and caches, another CPU's kernels.
`--profile` also prints where our engine's time goes (torch.profiler, operators by self CPU
time, at the smallest thread count: the least disturbed by other processes), how many
decoding steps ran over how many rows, and the fixed cost of a step (one input alone).
Needs `ctranslate2` (pip install -e '.[export]').
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu
import torch
from memory import reset_peak_rss, status_mib  # bench/memory.py

from transformer.data.multi30k import DEFAULT_ROOT, download_multi30k
from transformer.data.text import read_lines
from transformer.decoding.corpus import DEFAULT_MAX_TOKENS
from transformer.decoding.translator import Translator
from transformer.decoding.vocab_map import DEFAULT_PER_SOURCE, build_vocab_map
from transformer.deploy.engines import load_translator
from transformer.deploy.export import VOCAB_MAP, export_ctranslate2
from transformer.model.transformer import Transformer
from transformer.runtime import cpu_has_native_bf16

# a trained model beside the repository (../runs/ref: the recipe run for 10 minutes)
DEFAULT_CHECKPOINT = str(Path(__file__).resolve().parents[2]
                         / "runs/ref/checkpoints/checkpoint_best.pt")
MAPPED = "ct2 int8 + vmap"
BASELINE = "torch baseline"
QUANTIZED = "torch int8"  # our engine, Translator.load(..., quantize="int8")
# name -> export (quantization, with a vocabulary map); None: our engine, from the checkpoint
ENGINES = {"torch": None, QUANTIZED: None, "ct2 float32": ("float32", False),
           "ct2 float32 + vmap": ("float32", True), "ct2 int8": ("int8", False),
           MAPPED: ("int8", True)}
MODES = ("", " sampling", " + alignment")
# row -> (engine, mode)
ROWS = {name: (name, "") for name in ENGINES}
ROWS |= {f"{name}{mode}": (name, mode) for name in ("torch", "ct2 float32")
         for mode in MODES if mode}


def mode_options(mode: str) -> dict:
    """`translate` options of a mode: beam 5, or sampling (imported here: a baseline package
    may lack them, or keep them in other modules)."""
    try:
        from transformer.decoding.request import AlignmentOptions, Sampling
    except ImportError:
        from transformer.decoding.alignment import AlignmentOptions
        from transformer.decoding.search import Sampling
    if mode == " sampling":
        return {"sampling": Sampling(topk=10, seed=1)}
    if mode == " + alignment":
        return {"beam_size": 5, "alignment": AlignmentOptions()}
    return {"beam_size": 5}
INT8 = ("ct2 int8", MAPPED)
FLOAT32 = ("ct2 float32", "ct2 float32 + vmap")
# our row -> the CTranslate2 row it is held to: ours at least MIN_RATIO x its sentences/s at
# every thread count, and (float32) the same output on at least MIN_IDENTICAL of the inputs
COMPARED = {"torch": "ct2 float32", QUANTIZED: "ct2 int8"}
MIN_RATIO, MIN_IDENTICAL = 0.8, 0.99
INT8_MAX_BLEU_DROP, INT8_MAX_SIZE = 0.5, 0.30
FLOAT32_MAX_BLEU_DIFF = 0.2


# `--isa`: the environment variables that hold each library's kernels (PyTorch's own,
# oneDNN's, MKL's, FBGEMM's, CTranslate2's) to an instruction set, so that a machine with more
# runs the kernels a CPU with less would, with its own clock and caches. "AVX512": AVX-512
# without VNNI (a Skylake-class Xeon's int8 kernels).
ISA_LIMITS = {
    "AVX2": {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2",
             "MKL_ENABLE_INSTRUCTIONS": "AVX2", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX2",
             "CT2_FORCE_CPU_ISA": "AVX2"},
    "AVX512": {"ATEN_CPU_CAPABILITY": "avx512", "ONEDNN_MAX_CPU_ISA": "AVX512_CORE",
               "MKL_ENABLE_INSTRUCTIONS": "AVX512", "FBGEMM_ENABLE_INSTRUCTIONS": "AVX512",
               "CT2_FORCE_CPU_ISA": "AVX512"},
}
ISA_VARIABLES = tuple(ISA_LIMITS["AVX2"])  # every instruction set sets the same ones


def add_isa_argument(parser: argparse.ArgumentParser) -> None:
    """`--isa AVX2|AVX512`: run on the kernels of a CPU with only that instruction set."""
    parser.add_argument("--isa", choices=list(ISA_LIMITS),
                        help="hold every library's kernels to this instruction set (AVX512: "
                             "without VNNI), as a CPU with only it would run them")


def hold_to_isa(isa: str | None) -> None:
    """Start this script over with `ISA_LIMITS[isa]` in its environment (the libraries read
    them when they load, which has happened by now); nothing when `isa` is None or the
    environment holds them already."""
    if isa is None:
        return
    limits = ISA_LIMITS[isa]
    if any(os.environ.get(key) != value for key, value in limits.items()):
        sys.stdout.flush()
        os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, **limits})


# /proc/cpuinfo's flags that choose PyTorch's, oneDNN's, FBGEMM's and CTranslate2's kernels
KERNEL_FLAGS = ("avx2", "avx512f", "avx512_vnni", "avx512_bf16", "amx_tile")


def cpu_description() -> str:
    """The CPU's name (/proc/cpuinfo's "model name", else `platform.processor()`), its
    family, model and the instruction sets of `KERNEL_FLAGS` it has, and what PyTorch's CPU
    kernels use on it: its capability (e.g. AVX512) and native bf16
    (`runtime.cpu_has_native_bf16`, the probe `precision: auto` decides by), and the
    libraries our engine multiplies with there (`ops.FLOAT32_LIBRARY`, `ops.INT8_ONEDNN`)."""
    # imported here: a baseline row's process imports this file with an older package
    from transformer.model.layers import FLOAT32_LIBRARY, INT8_ONEDNN, cpu_has_amx, cpu_info

    name = cpu_info("model name") or platform.processor() or "unknown CPU"
    if cpu_info("cpu family") is not None:  # a VM's generic name ("AMD EPYC") says little
        flags = set((cpu_info("flags") or "").split())
        isa = " ".join(flag for flag in KERNEL_FLAGS if flag in flags) or "no AVX2"
        name += f" (family {cpu_info('cpu family')}, model {cpu_info('model')}; {isa})"
    limits = [f"{key}={os.environ[key]}" for key in ISA_VARIABLES if key in os.environ]
    int8 = "FBGEMM" if not INT8_ONEDNN else "oneDNN (AMX)" if cpu_has_amx() else "oneDNN"
    return (f"CPU: {name}; torch CPU capability {torch.backends.cpu.get_cpu_capability()}, "
            f"native bf16 (AVX512-BF16 or AMX) {cpu_has_native_bf16()}; our float32 products "
            f"through {'oneDNN' if FLOAT32_LIBRARY == 'onednn' else 'BLAS'}, int8 wide layers "
            f"through {int8}"
            + (f"; instruction sets limited by {' '.join(limits)}" if limits else ""))


def test_lines(root: str, lang: str) -> list[str]:
    download_multi30k(root, ("en", "de"))
    return read_lines(Path(root).expanduser() / f"test_2016_flickr.{lang}.gz")


def add_input_arguments(parser: argparse.ArgumentParser) -> None:
    """The model and the inputs a decoding benchmark runs on (read back by `inputs`)."""
    parser.add_argument("--checkpoint", default=DEFAULT_CHECKPOINT,
                        help=f"a trained model (default {DEFAULT_CHECKPOINT})")
    parser.add_argument("--data-root", default=DEFAULT_ROOT,
                        help="folder of the Multi30k files (default: the download cache)")
    parser.add_argument("--sentences", type=int, default=1000)
    parser.add_argument("--join", type=int, default=1, metavar="N",
                        help="translate every N consecutive test lines as one input")
    add_isa_argument(parser)


def inputs(args: argparse.Namespace, lang: str) -> list[str]:
    """The first --sentences lines of test_2016_flickr in `lang`, each --join consecutive
    lines made one input (long inputs: --join 4 gives ~50-piece sources)."""
    lines = test_lines(args.data_root, lang)[:args.sentences]
    n = args.join
    return [" ".join(lines[i:i + n]) for i in range(0, len(lines) - n + 1, n)]


def max_tokens(args: argparse.Namespace) -> int:
    """--max-tokens, or else the default of the package this process imported (in a
    baseline row's process: the baseline's own)."""
    return args.max_tokens or DEFAULT_MAX_TOKENS


def child(args: argparse.Namespace) -> None:
    """One row at one thread count: time it, report speed, memory and the output."""
    threads = args.threads[0]
    torch.set_num_threads(threads)
    name, mode = ROWS.get(args.child, ("torch", ""))  # the baseline: our beam search
    engine = "torch" if ENGINES[name] is None else "ctranslate2"
    # only where asked: a baseline package's load_translator may not take it
    quantized = {"quantize": "int8"} if name == QUANTIZED else {}
    translator = load_translator(args.model, engine, device="cpu", threads=threads,
                                 **quantized)
    if engine == "ctranslate2" and args.ct2_once:  # the second search left out
        translator._search_again_at_own_limit = lambda results, limits, translate: None
    lines = inputs(args, "en")
    options = {"max_tokens": max_tokens(args), **mode_options(mode)}
    translator.translate(lines[:8], **options)  # warm-up
    reset_peak_rss()
    seconds = []
    for _ in range(args.repeats):
        start = time.perf_counter()
        hyps = translator.translate(lines, **options)
        seconds.append(time.perf_counter() - start)
    tokens = sum(len(ids) + 1 for ids in translator.tokenizers.tgt.encode_batch(hyps))
    print(json.dumps({"seconds": min(seconds), "first_seconds": seconds[0],
                      "tokens": tokens, "hyps": hyps,
                      "peak_rss_mib": status_mib("VmHWM")}))


def run(name: str, model: str, threads: int, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--model", model, "--threads",
           str(threads), "--data-root", args.data_root, "--sentences", str(args.sentences),
           "--join", str(args.join), "--repeats", str(args.repeats),
           *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else []),
           *(["--ct2-once"] if args.ct2_once else [])]
    env = dict(os.environ)
    if name == BASELINE:  # that package first on the path, ahead of the installed one
        env["PYTHONPATH"] = os.pathsep.join([str(Path(args.baseline_src) / "src"),
                                             env.get("PYTHONPATH", "")])
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def print_comparisons(results: dict[tuple[int, str], dict], speed: dict[tuple[int, str], float],
                      seconds: dict[tuple[int, str], list[float]], rows: list[str],
                      threads: list[int]) -> None:
    """Ours against CTranslate2 (`COMPARED`) at every thread count: the ratio of sentences/s
    and how many inputs get the same output, each with PASS/FAIL against its target; and
    the ratio within each round, smallest first (`seconds`: each round's best run per row):
    its two processes ran one after the other, where the best runs of all may come from
    different rounds; on a machine whose speed drifts, the rounds' spread says how far the
    ratio can be trusted."""
    for ours, theirs in COMPARED.items():
        if ours not in rows or theirs not in rows:
            continue
        for n in threads:
            ratio = speed[n, ours] / speed[n, theirs]
            mine, other = results[n, ours]["hyps"], results[n, theirs]["hyps"]
            same = sum(a == b for a, b in zip(mine, other, strict=True)) / len(mine)
            rounds = sorted(t / o for o, t in zip(seconds[n, ours], seconds[n, theirs],
                                                  strict=True))
            print(f"{'PASS' if ratio >= MIN_RATIO else 'FAIL'}  {ours} >= {MIN_RATIO:g}x "
                  f"{theirs} at {n} thread(s): {ratio:.2f}x; the same output on {same:.1%} "
                  "of the inputs" + (f" ({'PASS' if same >= MIN_IDENTICAL else 'FAIL'}: "
                                     f">= {MIN_IDENTICAL:.0%})" if ours == "torch" else "")
                  + f"; per round {' '.join(f'{r:.2f}x' for r in rounds)}"
                  f" (median {statistics.median(rounds):.2f}x)")


def load_average() -> float:
    """The 1-minute load average: other processes' demand for the cores."""
    with open("/proc/loadavg") as f:
        return float(f.read().split()[0])


def profile(checkpoint: str, lines: list[str], threads: int, max_tokens: int) -> None:
    """Where our engine's beam search spends its time, by operator; how many decoding steps
    it ran over how many rows; and the fixed cost of a step (one input decoded alone, whose
    few rows make the step's work negligible beside its Python and per-operator costs)."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    torch.set_num_threads(threads)
    translator = Translator.load(checkpoint, device="cpu")
    translator.translate(lines[:8], beam_size=5)
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        start = time.perf_counter()
        translator.translate(lines, beam_size=5, max_tokens=max_tokens)
        wall = time.perf_counter() - start
    events = prof.key_averages()
    total = sum(e.self_cpu_time_total for e in events)
    print(f"\nour engine, {len(lines)} sentences, beam 5, {threads} thread(s): {wall:.1f}s wall "
          f"(profiled); operators by self CPU time:")
    for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:15]:
        print(f"  {e.key:<32}{e.self_cpu_time_total / 1e6:>8.2f}s"
              f"{100 * e.self_cpu_time_total / total:>7.1f}%{e.count:>9} calls")
    print(f"  (operator self time {total / 1e6:.2f}s; the rest of the wall time is Python)")
    steps = decoding_steps(prof, translator.model)
    print(f"decoding steps: {len(steps)}, {sum(steps):,} rows in all (sentences x beam), "
          f"{sum(steps) / max(len(steps), 1):.0f} rows per step on average")
    alone = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        translator.translate(lines[:1], beam_size=5)
        alone = min(alone, time.perf_counter() - start)
    with torch_profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        translator.translate(lines[:1], beam_size=5)
    alone_steps = decoding_steps(prof, translator.model)
    print(f"one input alone: {1000 * alone / max(len(alone_steps), 1):.2f} ms per step "
          f"({len(alone_steps)} steps of {max(alone_steps, default=0)} rows or fewer)")


def decoding_steps(prof: torch.profiler.profile, model: Transformer) -> list[int]:
    """The rows of each decoding step a profile saw: one call of the output projection
    (its input's rows against the (vocabulary, d) weight; through oneDNN, or `F.linear`
    where `ops.linear` does not take oneDNN) per step, for a float32 model."""
    weight = list(model.output_projection.weight.shape)
    rows = []
    for event in prof.events():
        shapes = event.input_shapes
        if (event.name in ("mkldnn::_linear_pointwise", "aten::linear") and len(shapes) > 1
                and shapes[1] == weight):
            rows.append(math.prod(shapes[0][:-1]))
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_input_arguments(parser)
    parser.add_argument("--threads", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--repeats", type=int, default=3,
                        help="timed runs per process; the best counts")
    parser.add_argument("--rounds", type=int, default=2,
                        help="passes over all engines, one process each; the best counts")
    parser.add_argument("--max-tokens", type=int,
                        help="source tokens per batch (default: each package's own)")
    parser.add_argument("--profile", action="store_true")
    parser.add_argument("--baseline-src", metavar="DIR",
                        help="also time our beam search as the package in DIR/src decodes")
    parser.add_argument("--rows", nargs="+", choices=[*ROWS, BASELINE], metavar="ROW",
                        help=f"rows to run (default: all): {', '.join(ROWS)}")
    parser.add_argument("--ct2-once", action="store_true",
                        help="CTranslate2 rows search each batch once, as CTranslate2 itself "
                             "does, without the engine's second search of sentences past "
                             "their own length limit")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    args = parser.parse_args()
    hold_to_isa(args.isa)
    if args.child:
        child(args)
        return

    refs = inputs(args, "de")
    load_before = load_average()
    translator = Translator.load(args.checkpoint, device="cpu")
    print(f"torch {torch.__version__}; checkpoint {args.checkpoint} "
          f"({translator.model.num_parameters():,} parameters); {len(refs)} inputs of "
          f"{args.join} line(s) of test_2016_flickr, beam 5, alpha {translator.decoding.alpha:g}")
    print(cpu_description())
    rows = args.rows or [*ROWS, *([BASELINE] if args.baseline_src else [])]
    if BASELINE in rows and not args.baseline_src:
        parser.error(f"the row {BASELINE!r} needs --baseline-src")
    rows = ["torch", *(row for row in rows if row != "torch")]  # the reference, always
    engine_of = {row: ROWS.get(row, ("torch", ""))[0] for row in rows}
    with tempfile.TemporaryDirectory() as tmp:
        models = {"torch": args.checkpoint, QUANTIZED: args.checkpoint}
        root = Path(args.data_root).expanduser()
        vocab_map = build_vocab_map(translator.tokenizers, root / "train.en.gz",
                                    root / "train.de.gz")
        for name, export in ENGINES.items():
            if export and name in engine_of.values():
                quantization, mapped = export
                models[name] = str(Path(tmp) / f"{quantization}{'-vmap' * mapped}")
                export_ctranslate2(translator, models[name], quantization=quantization,
                                   vocab_map=vocab_map if mapped else None)
        sizes = {row: Path(models[name] if ENGINES[name] is None else
                           Path(models[name]) / "model.bin").stat().st_size
                 for row, name in engine_of.items()}
        map_size = (Path(models[MAPPED]) / VOCAB_MAP).stat().st_size if MAPPED in rows else 0
        results: dict[tuple[int, str], dict] = {}
        seconds: dict[tuple[int, str], list[float]] = {}  # every round's best, in order
        for _ in range(args.rounds):
            for threads in args.threads:
                for row in rows:
                    r = run(row, models[engine_of[row]], threads, args)
                    seconds.setdefault((threads, row), []).append(r["seconds"])
                    best = results.get((threads, row))
                    if best is None or r["seconds"] < best["seconds"]:
                        results[threads, row] = r
    bleu = {key: sacrebleu.corpus_bleu(r["hyps"], [refs]).score for key, r in results.items()}
    print(f"{'row':<24}{'threads':>8}{'sent/s':>9}{'1st':>8}{'tok/s':>9}{'vs ours':>9}"
          f"{'peak RSS MiB':>14}{'size MiB':>10}{'BLEU':>7}")
    speed = {key: len(refs) / r["seconds"] for key, r in results.items()}
    for (threads, name), r in results.items():
        print(f"{name:<24}{threads:>8}{speed[threads, name]:>9.1f}"
              f"{len(refs) / r['first_seconds']:>8.1f}{r['tokens'] / r['seconds']:>9.0f}"
              f"{speed[threads, name] / speed[threads, 'torch']:>9.2f}"
              f"{r['peak_rss_mib']:>14.0f}{sizes[name] / 2**20:>10.1f}{bleu[threads, name]:>7.2f}")
    print("size: our checkpoint file (weights + optimizer state; torch int8 quantizes it when "
          "loaded), CTranslate2's model.bin; "
          f"the vocabulary map (vmap.txt, {map_size / 2**20:.2f} MiB beside model.bin): "
          f"{len(vocab_map.candidates):,} source pieces, <= {DEFAULT_PER_SOURCE} candidates "
          f"each + {len(vocab_map.always)} always, from {vocab_map.pairs:,} training pairs")
    top = max(args.threads)
    print_comparisons(results, speed, seconds, rows, args.threads)
    if BASELINE in rows:
        same = results[top, "torch"]["hyps"] == results[top, BASELINE]["hyps"]
        print(f"ours / {BASELINE} ({args.baseline_src}, {top} thread(s)): "
              f"{speed[top, 'torch'] / speed[top, BASELINE]:.2f}x; outputs "
              f"{'identical' if same else 'DIFFERENT'}")
    loads = (load_before, load_average())
    print(f"load average before/after: {loads[0]:.1f}/{loads[1]:.1f}"
          + ("  -- other processes were using the CPU: rerun on a quiet machine (a thread "
             "that loses its core stalls every operation, above all with 2 threads)"
             if max(loads) > 1.5 else ""))
    for name in (n for n in FLOAT32 if n in rows):  # beam search within 0.2 BLEU of ours
        delta = bleu[top, name] - bleu[top, "torch"]
        print(f"{'PASS' if abs(delta) <= FLOAT32_MAX_BLEU_DIFF else 'FAIL'}  {name} BLEU "
              f"within {FLOAT32_MAX_BLEU_DIFF} of ours: {delta:+.2f}")
    if QUANTIZED in rows:
        drop = bleu[top, "torch"] - bleu[top, QUANTIZED]
        print(f"{'PASS' if drop <= INT8_MAX_BLEU_DROP else 'FAIL'}  {QUANTIZED} BLEU within "
              f"{INT8_MAX_BLEU_DROP} of ours: {-drop:+.2f}")
    for name in (n for n in INT8 if n in rows):
        drop = bleu[top, "torch"] - bleu[top, name]
        print(f"{'PASS' if drop <= INT8_MAX_BLEU_DROP else 'FAIL'}  {name} BLEU within "
              f"{INT8_MAX_BLEU_DROP} of ours: {-drop:+.2f}")
        for reference, what in (("torch", "the float32 checkpoint file (with optimizer state)"),
                                ("ct2 float32", "the float32 weights alone (float32 model.bin)")):
            if reference not in rows:
                continue
            share = sizes[name] / sizes[reference]
            print(f"{'PASS' if share <= INT8_MAX_SIZE else 'FAIL'}  {name} model.bin <= "
                  f"{INT8_MAX_SIZE:.0%} of {what}: {share:.1%}")
    if args.profile:
        profile(args.checkpoint, inputs(args, "en"),
                min(args.threads), max_tokens(args))


if __name__ == "__main__":
    main()
