"""How fast does our engine translate, in float32 and int8, against CTranslate2's exports of
the same model, and with the same output?

    python bench/engines.py [--checkpoint RUN_OR_PT] [--data-root DIR] [--threads 1 2]
                            [--sentences 1000] [--join 1] [--repeats 3] [--rounds 2]
                            [--profile] [--baseline-src DIR] [--rows "torch" "ct2 float32" ...]
                            [--ct2-once] [--isa AVX2|AVX512]
    python bench/engines.py --lines 1 10 100 1000 [--threads 1 2] [--rows torch "ct2 float32"
                            "torch int8" "ct2 int8"]

Our PyTorch engine (float32, and int8: `quantize="int8"`) against CTranslate2 float32 and
int8 exports of the same model, each also with a vocabulary map (counted in Multi30k's
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
exports are made here from --checkpoint with `transformer export`'s code. Both engines decode
with the same settings (beam 5, the checkpoint's alpha, max length 1.5 * source + 10, batches
of --max-tokens source tokens, by default the package's own: a baseline row decodes with its
package's); see transformer/deploy/engines.py for how the searches are matched (a CTranslate2
row's time includes its second search of sentences that ran past their own length limit;
with `--ct2-once` it searches each batch once, as CTranslate2 by itself does).

Rows: each engine's beam search ("torch int8": ours with its linear layers in PyTorch's
dynamic int8, `Translator.load(..., quantize="int8")`, compared with "ct2 int8"; "torch
workers" and "torch int8 workers": the same with as many search processes as threads,
`Translator.load(..., workers=threads)`, compared with the same CTranslate2 rows and, for their
outputs, with ours in one process); "sampling"
(top-k 10, seed 1: back-translation's setting) and "+ alignment" (beam search, each output
also word-aligned) for ours and CTranslate2 float32; with `--baseline-src DIR`, "torch
baseline": our engine as the package in DIR/src decodes (e.g. a `git worktree` of an
earlier commit, of either layout of the package: `timing.package_name`), for speed-ups
measured in the same run. `--rows` picks rows by name.

`--join 4` translates every 4 consecutive test lines as one input (long inputs; the
references joined alike). Below the table, at every thread count: ours float32 against
CTranslate2 float32 and ours int8 against CTranslate2 int8, as the ratio of sentences/s
(target: at least 0.8x) and the share of inputs with the same output (float32: at least 99%);
beside it the same ratio within each round (the two rows' processes run one after the other),
whose spread shows how far the machine's drift moves the ratio.

Above the table: the CPU's name and what PyTorch's kernels use on it (its CPU capability,
e.g. AVX512, and whether it computes bf16 natively, AVX512-BF16). `--isa AVX2` (or AVX512,
without VNNI) holds every library to that instruction set (`timing.ISA_LIMITS`), as a CPU with
only it would run: this machine's clock and caches, another CPU's kernels.
`--profile` also prints where our engine's time goes (torch.profiler, operators by self CPU
time, at the smallest thread count: the least disturbed by other processes), how many
decoding steps ran over how many rows, and the fixed cost of a step (one input alone).

`--lines 1 10 100 1000`: translation at every size instead, as requests of N lines arrive
(a sentence typed into the server's page, a paragraph, a document): the test set's lines cut
into consecutive requests of N lines, each translated by its own `translate` call, in a
fresh process per size, thread count and row, after a warm-up (at most `SIZE_LINES` lines a
pass below that size, so one line is ~200 calls; the best of --repeats passes). Reported per
size: sentences/s over the pass, and the median and 95th percentile of a call's latency;
below the table, ours against CTranslate2 at each size and thread count, against the
targets of `SIZE_TARGETS` (float32) and `INT8_SIZE_TARGETS`; with the row "torch baseline",
ours against it at each size, and whether the outputs are identical.
Needs `ctranslate2` (pip install -e '.[export]').
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import sacrebleu
import torch
from timing import (
    add_isa_argument,
    cpu_description,
    hold_to_isa,
    load_average,
    operator_table,
    package_name,
    peak_rss_mib,
    percentile,
    profiled,
    ratio_summary,
    reset_peak_rss,
    timed,
    timed_passes,
)

# What a baseline row's process reads too, with another checkout's package, perhaps of its
# earlier layout (`timing.package_name`); what only this process reads is imported where it
# is used.
DEFAULT_ROOT = package_name("data.multi30k", "DEFAULT_ROOT")
download_multi30k = package_name("data.multi30k", "download_multi30k")
read_lines = package_name("data.text", "read_lines")
DEFAULT_MAX_TOKENS = package_name("decoding.corpus", "DEFAULT_MAX_TOKENS")
Translator = package_name("decoding.translator", "Translator")
load_translator = package_name("deploy.engines", "load_translator")

# a trained model beside the repository (../runs/ref: the recipe run for 10 minutes)
DEFAULT_CHECKPOINT = str(Path(__file__).resolve().parents[2]
                         / "runs/ref/checkpoints/checkpoint_best.pt")
MAPPED = "ct2 int8 + vmap"
BASELINE = "torch baseline"
QUANTIZED = "torch int8"  # our engine, Translator.load(..., quantize="int8")
# our engine with search processes, one a thread: Translator.load(..., workers=threads)
WORKERS = {"torch workers": "torch", "torch int8 workers": QUANTIZED}
# name -> export (quantization, with a vocabulary map); None: our engine, from the checkpoint
ENGINES = {"torch": None, QUANTIZED: None, **dict.fromkeys(WORKERS),
           "ct2 float32": ("float32", False),
           "ct2 float32 + vmap": ("float32", True), "ct2 int8": ("int8", False),
           MAPPED: ("int8", True)}
MODES = ("", " sampling", " + alignment")
# row -> (engine, mode)
ROWS = {name: (name, "") for name in ENGINES}
ROWS |= {f"{name}{mode}": (name, mode) for name in ("torch", "ct2 float32")
         for mode in MODES if mode}
INT8 = ("ct2 int8", MAPPED)
FLOAT32 = ("ct2 float32", "ct2 float32 + vmap")
# our row -> the CTranslate2 row it is held to: ours at least MIN_RATIO x its sentences/s at
# every thread count, and (float32) the same output on at least MIN_IDENTICAL of the inputs
COMPARED = {"torch": "ct2 float32", QUANTIZED: "ct2 int8"}
COMPARED |= {row: COMPARED[ours] for row, ours in WORKERS.items()}  # as our one-process row
MIN_RATIO, MIN_IDENTICAL = 0.8, 0.99
# --lines: a pass translates at most this many lines in requests of N (one request of N where
# N is larger); ours against CTranslate2's sentences/s at each request size, at least:
SIZE_LINES = 200
SIZE_TARGETS = {1: 0.5, 10: 0.7, 100: 0.85}  # and 0.85 above 100 lines
INT8_SIZE_TARGETS = {1: 0.7, 10: 0.7, 100: 0.85}
INT8_MAX_BLEU_DROP, INT8_MAX_SIZE = 0.5, 0.30
FLOAT32_MAX_BLEU_DIFF = 0.2


def engine_of(row: str) -> str:
    """The engine (a name of `ENGINES`) a row runs; the baseline row: ours."""
    return ROWS.get(row, ("torch", ""))[0]


def mode_options(mode: str) -> dict:
    """`translate` options of a mode: beam 5, or sampling, or beam 5 with alignments (their
    options read only where asked: a baseline row, beam 5, may predate them)."""
    if mode == " sampling":
        return {"sampling": package_name("decoding.request", "Sampling")(topk=10, seed=1)}
    if mode == " + alignment":
        return {"beam_size": 5,
                "alignment": package_name("decoding.request", "AlignmentOptions")()}
    return {"beam_size": 5}


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
    quantized = {"quantize": "int8"} if QUANTIZED in (name, WORKERS.get(name)) else {}
    workers = {"workers": threads} if name in WORKERS else {}
    translator = load_translator(args.model, engine, device="cpu", threads=threads,
                                 **quantized, **workers)
    if engine == "ctranslate2" and args.ct2_once:  # the second search left out
        translator._search_again_at_own_limit = lambda results, limits, translate: None
    lines = inputs(args, "en")
    options = {"max_tokens": max_tokens(args), **mode_options(mode)}
    translator.translate(lines[:8], **options)  # warm-up
    if args.size:
        print(json.dumps(requests_timed(translator, lines, args.size, options, args.repeats)))
        return
    reset_peak_rss()
    seconds, hyps = timed_passes(lambda: translator.translate(lines, **options), args.repeats)
    tokens = sum(len(ids) + 1 for ids in translator.tokenizers.tgt.encode_batch(hyps))
    print(json.dumps({"seconds": min(seconds), "first_seconds": seconds[0],
                      "tokens": tokens, "hyps": hyps, "peak_rss_mib": peak_rss_mib()}))


def requests_timed(translator, lines: list[str], size: int, options: dict,
                   repeats: int) -> dict:
    """`lines` cut into consecutive requests of `size` lines (at most `SIZE_LINES` lines, or
    one request), each translated by one call, `repeats` passes -> the best pass's seconds,
    its lines, and each of its calls' seconds."""
    requests = [lines[i * size:(i + 1) * size] for i in range(max(1, SIZE_LINES // size))]
    best: list[float] | None = None
    for _ in range(repeats):
        timings = [timed(lambda r=r: translator.translate(r, **options)) for r in requests]
        calls = [seconds for seconds, _ in timings]
        if best is None or sum(calls) < sum(best):
            best = calls
    return {"seconds": sum(best), "lines": size * len(requests), "calls": best,
            "hyps": [hyp for _, hyps in timings for hyp in hyps]}


def run(name: str, model: str, threads: int, args: argparse.Namespace) -> dict:
    """One row at one thread count in a fresh process (`child`) -> its report."""
    cmd = [sys.executable, __file__, "--child", name, "--model", model, "--threads",
           str(threads), "--data-root", args.data_root, "--sentences", str(args.sentences),
           "--join", str(args.join), "--repeats", str(args.repeats),
           *(["--max-tokens", str(args.max_tokens)] if args.max_tokens else []),
           *(["--ct2-once"] if args.ct2_once else []),
           *(["--size", str(args.size)] if args.size else [])]
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
    the ratio within each round (`seconds`: each round's best run per row): its two
    processes ran one after the other, where the best runs of all may come from different
    rounds; on a machine whose speed drifts, the rounds' spread says how far the ratio can
    be trusted."""
    for ours, theirs in COMPARED.items():
        if ours not in rows or theirs not in rows:
            continue
        for n in threads:
            ratio = speed[n, ours] / speed[n, theirs]
            mine, other = results[n, ours]["hyps"], results[n, theirs]["hyps"]
            same = sum(a == b for a, b in zip(mine, other, strict=True)) / len(mine)
            print(f"{'PASS' if ratio >= MIN_RATIO else 'FAIL'}  {ours} >= {MIN_RATIO:g}x "
                  f"{theirs} at {n} thread(s): {ratio:.2f}x; the same output on {same:.1%} "
                  "of the inputs" + (f" ({'PASS' if same >= MIN_IDENTICAL else 'FAIL'}: "
                                     f">= {MIN_IDENTICAL:.0%})" if ours == "torch" else "")
                  + f"; per round {ratio_summary(seconds[n, ours], seconds[n, theirs])}")


def profile(checkpoint: str, lines: list[str], threads: int, max_tokens: int) -> None:
    """Where our engine's beam search spends its time, by operator; how many decoding steps
    it ran over how many rows; and the fixed cost of a step (one input decoded alone, whose
    few rows make the step's work negligible beside its Python and per-operator costs)."""
    torch.set_num_threads(threads)
    translator = Translator.load(checkpoint, device="cpu")
    translator.translate(lines[:8], beam_size=5)
    wall, prof = profiled(lambda: translator.translate(lines, beam_size=5, max_tokens=max_tokens),
                          record_shapes=True)
    print(f"\nour engine, {len(lines)} sentences, beam 5, {threads} thread(s): {wall:.1f}s wall "
          f"(profiled); operators by self CPU time:")
    print("\n".join(operator_table(prof, 15, width=32)))
    steps = decoding_steps(prof, translator.model)
    print(f"decoding steps: {len(steps)}, {sum(steps):,} rows in all (sentences x beam), "
          f"{sum(steps) / max(len(steps), 1):.0f} rows per step on average")
    alone = min(timed_passes(lambda: translator.translate(lines[:1], beam_size=5), 5)[0])
    _, prof = profiled(lambda: translator.translate(lines[:1], beam_size=5), record_shapes=True)
    alone_steps = decoding_steps(prof, translator.model)
    print(f"one input alone: {1000 * alone / max(len(alone_steps), 1):.2f} ms per step "
          f"({len(alone_steps)} steps of {max(alone_steps, default=0)} rows or fewer)")


def decoding_steps(prof: torch.profiler.profile, model: torch.nn.Module) -> list[int]:
    """The rows of each decoding step a profile saw: one call of the output projection
    (its input's rows against the (vocabulary, d) weight; through oneDNN, or `F.linear`
    where `layers.linear` does not take oneDNN) per step, for a float32 model."""
    weight = list(model.output_projection.weight.shape)
    rows = []
    for event in prof.events():
        shapes = event.input_shapes
        if (event.name in ("mkldnn::_linear_pointwise", "aten::linear") and len(shapes) > 1
                and shapes[1] == weight):
            rows.append(math.prod(shapes[0][:-1]))
    return rows


def parse_args() -> tuple[argparse.ArgumentParser, argparse.Namespace]:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
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
    parser.add_argument("--lines", type=int, nargs="+", metavar="N",
                        help="translation at every size: requests of N lines (e.g. 1 10 100 "
                             "1000), ours against CTranslate2, with each call's latency")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--model", help=argparse.SUPPRESS)
    parser.add_argument("--size", type=int, help=argparse.SUPPRESS)
    return parser, parser.parse_args()


def export_rows(checkpoint: str, translator: Translator, rows: list[str], root: Path,
                folder: Path) -> tuple[dict[str, str], str]:
    """The model of every engine the rows run (`checkpoint`, or a CTranslate2 export of
    `translator` made into `folder`, the mapped ones with a vocabulary map counted in
    Multi30k's training pairs) -> ({engine: path}, a line on the vocabulary map)."""
    from transformer.decoding.vocab_map import DEFAULT_PER_SOURCE, build_vocab_map
    from transformer.deploy.export import VOCAB_MAP, export_ctranslate2

    engines = {engine_of(row) for row in rows}
    models = {"torch": checkpoint, QUANTIZED: checkpoint,
              **dict.fromkeys(WORKERS, checkpoint)}
    vocab_map = build_vocab_map(translator.tokenizers, root / "train.en.gz", root / "train.de.gz")
    for name, export in ENGINES.items():
        if export and name in engines:
            quantization, mapped = export
            models[name] = str(folder / f"{quantization}{'-vmap' * mapped}")
            export_ctranslate2(translator, models[name], quantization=quantization,
                               vocab_map=vocab_map if mapped else None)
    size = (Path(models[MAPPED]) / VOCAB_MAP).stat().st_size if MAPPED in models else 0
    return models, (f"the vocabulary map ({VOCAB_MAP}, {size / 2**20:.2f} MiB beside "
                    f"model.bin): {len(vocab_map.candidates):,} source pieces, <= "
                    f"{DEFAULT_PER_SOURCE} candidates each + {len(vocab_map.always)} always, "
                    f"from {vocab_map.pairs:,} training pairs")


def run_rounds(rows: list[str], models: dict[str, str], args: argparse.Namespace
               ) -> tuple[dict[tuple[int, str], dict], dict[tuple[int, str], list[float]]]:
    """Every row at every thread count, --rounds times over, row after row -> each row's
    fastest run, and every round's best seconds in order."""
    results: dict[tuple[int, str], dict] = {}
    seconds: dict[tuple[int, str], list[float]] = {}
    for _ in range(args.rounds):
        for threads in args.threads:
            for row in rows:
                r = run(row, models[engine_of(row)], threads, args)
                seconds.setdefault((threads, row), []).append(r["seconds"])
                best = results.get((threads, row))
                if best is None or r["seconds"] < best["seconds"]:
                    results[threads, row] = r
    return results, seconds


def model_size(models: dict[str, str], row: str) -> int:
    """Bytes on disk of a row's model: our checkpoint file, or CTranslate2's model.bin."""
    name = engine_of(row)
    path = Path(models[name])
    return (path if ENGINES[name] is None else path / "model.bin").stat().st_size


def print_table(results: dict, bleu: dict, sizes: dict[str, int], count: int) -> dict:
    """The table of every row at every thread count -> sentences/s by (threads, row)."""
    print(f"{'row':<24}{'threads':>8}{'sent/s':>9}{'1st':>8}{'tok/s':>9}{'vs ours':>9}"
          f"{'peak RSS MiB':>14}{'size MiB':>10}{'BLEU':>7}")
    speed = {key: count / r["seconds"] for key, r in results.items()}
    for (threads, name), r in results.items():
        print(f"{name:<24}{threads:>8}{speed[threads, name]:>9.1f}"
              f"{count / r['first_seconds']:>8.1f}{r['tokens'] / r['seconds']:>9.0f}"
              f"{speed[threads, name] / speed[threads, 'torch']:>9.2f}"
              f"{r['peak_rss_mib']:>14.0f}{sizes[name] / 2**20:>10.1f}{bleu[threads, name]:>7.2f}")
    return speed


def print_quality_checks(bleu: dict, sizes: dict[str, int], rows: list[str], top: int) -> None:
    """BLEU against ours at the most threads (CTranslate2 float32 within
    `FLOAT32_MAX_BLEU_DIFF`, int8 within `INT8_MAX_BLEU_DROP`) and int8's size on disk."""
    for name in (n for n in FLOAT32 if n in rows):
        delta = bleu[top, name] - bleu[top, "torch"]
        print(f"{'PASS' if abs(delta) <= FLOAT32_MAX_BLEU_DIFF else 'FAIL'}  {name} BLEU "
              f"within {FLOAT32_MAX_BLEU_DIFF} of ours: {delta:+.2f}")
    for name in (n for n in (QUANTIZED, *INT8) if n in rows):
        drop = bleu[top, "torch"] - bleu[top, name]
        print(f"{'PASS' if drop <= INT8_MAX_BLEU_DROP else 'FAIL'}  {name} BLEU within "
              f"{INT8_MAX_BLEU_DROP} of ours: {-drop:+.2f}")
        if name == QUANTIZED:
            continue
        for reference, what in (("torch", "the float32 checkpoint file (with optimizer state)"),
                                ("ct2 float32", "the float32 weights alone (float32 model.bin)")):
            if reference not in rows:
                continue
            share = sizes[name] / sizes[reference]
            print(f"{'PASS' if share <= INT8_MAX_SIZE else 'FAIL'}  {name} model.bin <= "
                  f"{INT8_MAX_SIZE:.0%} of {what}: {share:.1%}")


def sizes_main(args: argparse.Namespace, rows: list[str], models: dict[str, str]) -> None:
    """`--lines`: every row at every request size and thread count, --rounds times over,
    each in a fresh process -> the table of sentences/s and call latencies, and ours
    against CTranslate2 at each size (`SIZE_TARGETS`, `INT8_SIZE_TARGETS`)."""
    best: dict[tuple[int, int, str], dict] = {}
    for _ in range(args.rounds):
        for size in args.lines:
            for threads in args.threads:
                for row in rows:
                    r = run(row, models[engine_of(row)], threads,
                            argparse.Namespace(**{**vars(args), "size": size}))
                    key = (size, threads, row)
                    if key not in best or r["seconds"] < best[key]["seconds"]:
                        best[key] = r
    print(f"{'lines':>6}{'threads':>8}  {'row':<14}{'sent/s':>9}{'median ms':>11}"
          f"{'p95 ms':>9}{'calls':>7}")
    speed = {}
    for (size, threads, row), r in best.items():
        calls = r["calls"]
        speed[size, threads, row] = r["lines"] / r["seconds"]
        print(f"{size:>6}{threads:>8}  {row:<14}{speed[size, threads, row]:>9.1f}"
              f"{1000 * percentile(calls, 50):>11.1f}{1000 * percentile(calls, 95):>9.1f}"
              f"{len(calls):>7}")
    for size, threads, row in best:
        if row in WORKERS and (size, threads, WORKERS[row]) in best:
            same = best[size, threads, row]["hyps"] == best[size, threads, WORKERS[row]]["hyps"]
            print(f"{row} / {WORKERS[row]}, requests of {size} line(s), {threads} thread(s): "
                  f"{speed[size, threads, row] / speed[size, threads, WORKERS[row]]:.2f}x; "
                  f"outputs {'identical' if same else 'DIFFERENT'}")
        if row == BASELINE:
            same = best[size, threads, row]["hyps"] == best[size, threads, "torch"]["hyps"]
            print(f"ours / {BASELINE}, requests of {size} line(s), {threads} thread(s): "
                  f"{speed[size, threads, 'torch'] / speed[size, threads, row]:.2f}x; outputs "
                  f"{'identical' if same else 'DIFFERENT'}")
    for ours, theirs in COMPARED.items():
        targets = INT8_SIZE_TARGETS if QUANTIZED in ours else SIZE_TARGETS
        for size in args.lines:
            for threads in args.threads:
                if (size, threads, ours) not in speed or (size, threads, theirs) not in speed:
                    continue
                ratio = speed[size, threads, ours] / speed[size, threads, theirs]
                target = targets.get(size, targets[max(targets)])
                print(f"{'PASS' if ratio >= target else 'FAIL'}  {ours} >= {target:g}x "
                      f"{theirs}, requests of {size} line(s), {threads} thread(s): "
                      f"{ratio:.2f}x")


def main() -> None:
    parser, args = parse_args()
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
    rows = args.rows or (["torch", "ct2 float32"] if args.lines else
                         [*ROWS, *([BASELINE] if args.baseline_src else [])])
    if BASELINE in rows and not args.baseline_src:
        parser.error(f"the row {BASELINE!r} needs --baseline-src")
    rows = ["torch", *(row for row in rows if row != "torch")]  # the reference, always
    with tempfile.TemporaryDirectory() as tmp:
        models, map_note = export_rows(args.checkpoint, translator, rows,
                                       Path(args.data_root).expanduser(), Path(tmp))
        if args.lines:
            sizes_main(args, rows, models)
            return
        sizes = {row: model_size(models, row) for row in rows}
        results, seconds = run_rounds(rows, models, args)
    bleu = {key: sacrebleu.corpus_bleu(r["hyps"], [refs]).score for key, r in results.items()}
    speed = print_table(results, bleu, sizes, len(refs))
    print("size: our checkpoint file (weights + optimizer state; torch int8 quantizes it when "
          f"loaded), CTranslate2's model.bin; {map_note}")
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
    print_quality_checks(bleu, sizes, rows, top)
    if args.profile:
        profile(args.checkpoint, inputs(args, "en"), min(args.threads), max_tokens(args))


if __name__ == "__main__":
    main()
