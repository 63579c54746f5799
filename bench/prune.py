"""What does pruning attention heads cost in BLEU, and gain in beam-5 decoding speed, as a
growing fraction of the heads is pruned (transformer.tools.heads; Michel, Levy & Neubig, 2019)?

    python bench/prune.py --checkpoint RUN_DIR_OR_PT [--fractions 0 0.2 0.4 0.6]
        [--data-root DIR] [--max-sentences 1000] [--output-dir DIR]
        [--beam-size 5] [--threads 1] [--device cpu] [--repeats 1]

Head importance (the gradient criterion of scripts/prune_heads.py, scores normalized per
layer) is measured once, on the first --max-sentences validation sentences; each fraction
then prunes the full model in one shot, keeping at least one head per layer. Speed and BLEU
(sacreBLEU, detokenized, against the raw references) are measured on the first
--max-sentences sentences of --data (default: test_2016_flickr), so the heads are not
chosen on the sentences that score them. Speed is the best of --repeats runs after a short
warm-up, sentences per second, translating with the usual batching (Translator).

Prints a table and writes prune.csv and prune.png (BLEU and sentences/s vs fraction).
"""

from __future__ import annotations

import argparse
import copy
import csv
import sys
from pathlib import Path

import sacrebleu
import torch
from matplotlib.figure import Figure  # saved with the Agg canvas; no pyplot, no display
from timing import timed_passes

from transformer.decoding.translator import Translator
from transformer.tools.evaluation import evaluation_text
from transformer.tools.heads import gradient_importance, heads_to_prune, teacher_forced_batches


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--checkpoint", required=True, metavar="RUN_DIR_OR_PT")
    p.add_argument("--fractions", type=float, nargs="+", default=[0.0, 0.2, 0.4, 0.6])
    p.add_argument("--data", choices=("valid", "test"), default="test",
                   help="the split scored (importance always comes from valid)")
    p.add_argument("--data-root", help="folder of the Multi30k files (default: the run's "
                                       "data.root, else the download cache)")
    p.add_argument("--max-sentences", type=int, default=1000)
    p.add_argument("--output-dir", type=Path, default=Path("bench-prune"))
    p.add_argument("--beam-size", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    p.add_argument("--repeats", type=int, default=1, help="timed runs per fraction (best kept)")
    return p


def measure(translator: Translator, sources: list[str], references: list[str],
            beam_size: int, repeats: int) -> tuple[float, float]:
    """(BLEU, sentences per second) of beam search over `sources`."""
    translator.translate(sources[:8], beam_size=beam_size)  # warm-up
    seconds, hypotheses = timed_passes(lambda: translator.translate(sources, beam_size=beam_size),
                                       repeats)
    return sacrebleu.corpus_bleu(hypotheses, [references]).score, len(sources) / min(seconds)


def plot(rows: list[dict], path: Path) -> None:
    figure = Figure(figsize=(5.5, 3.5), layout="constrained")
    ax = figure.subplots()
    fractions = [r["fraction"] for r in rows]
    ax.plot(fractions, [r["bleu"] for r in rows], "o-", color="tab:blue")
    ax.set_xlabel("fraction of heads pruned")
    ax.set_ylabel("BLEU", color="tab:blue")
    speed = ax.twinx()
    speed.plot(fractions, [r["sentences_per_s"] for r in rows], "s--", color="tab:red")
    speed.set_ylabel("sentences / s (beam search)", color="tab:red")
    ax.set_ylim(bottom=0)
    speed.set_ylim(bottom=0)
    ax.set_title("head pruning: quality and decoding speed", fontsize=9)
    figure.savefig(path, dpi=150)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    base = Translator.load(args.checkpoint, args.device)
    valid = evaluation_text(base.training_config, data="valid", data_root=args.data_root,
                            max_sentences=args.max_sentences)
    scored = evaluation_text(base.training_config, data=args.data, data_root=args.data_root,
                             max_sentences=args.max_sentences)
    sources, references = scored.src, scored.tgt
    batches = teacher_forced_batches(base.tokenizers, valid.src, valid.tgt, base.device)
    importance = gradient_importance(base.model, batches).importance
    total_heads = sum(len(v) for v in importance.values())
    print(f"torch {torch.__version__}, {args.threads} thread(s), {base.device}; importance on "
          f"{len(valid)} valid sentences; scoring {len(sources)} {args.data} sentences, "
          f"beam {args.beam_size}")
    rows = []
    for fraction in args.fractions:
        model = copy.deepcopy(base.model)
        model.prune_heads(heads_to_prune(model, importance, fraction))
        translator = Translator(model, base.tokenizers, base.device)
        bleu, speed = measure(translator, sources, references, args.beam_size, args.repeats)
        rows.append({"fraction": fraction,
                     "heads": sum(len(v) for v in model.config.pruned_heads.values()),
                     "parameters": model.num_parameters(), "bleu": round(bleu, 2),
                     "sentences_per_s": round(speed, 2)})
    print(f"{'fraction':>8} {'pruned':>9} {'parameters':>10} {'BLEU':>6} {'sent/s':>7} "
          f"{'speedup':>7}")
    for r in rows:
        print(f"{r['fraction']:8.2f} {r['heads']:>4}/{total_heads:<4} {r['parameters']:10,} "
              f"{r['bleu']:6.2f} {r['sentences_per_s']:7.1f} "
              f"{r['sentences_per_s'] / rows[0]['sentences_per_s']:6.2f}x")
    args.output_dir.mkdir(parents=True, exist_ok=True)
    with open(args.output_dir / "prune.csv", "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    plot(rows, args.output_dir / "prune.png")
    print(f"wrote {args.output_dir / 'prune.csv'} and {args.output_dir / 'prune.png'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
