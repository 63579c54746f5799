"""What does the recipe reach at a budget of target tokens, with its schedule and settings
fitted to the budget, against the schedule cut by it and other settings?

    python bench/budget.py --root ../shared/data/multi30k --out runs/budget \\
        --tokens 5500000 --arms recipe wu_settings

Every arm trains the Multi30k recipe (`transformer train`) for the same budget of target
tokens (`trainer.max_target_tokens`: the same amount of training on every machine), then
translates test_2016_flickr (beam 5, alpha 1.0) with the average of its last 5 numbered
checkpoints (every epoch in the last 10% of the budget is validated and numbered, in every
arm) and with its last checkpoint; cased sacreBLEU, chrF and the paper protocol (Wu et al.'s
scoring: lowercased, Moses-tokenized, `--tokenize none` against the dataset's tok reference).

Arms (`--arms`, one training at a time):
- `recipe`: the recipe as it is: its batch size, dropout, lr and warmup chosen by the budget
  (`schedule.budget_settings`), the cooldown over the last 20% of the budget;
- `wu_settings`: the recipe with Wu et al.'s settings at any budget (batches of 8,192
  tokens, dropout 0.3, lr 0.005, 2,000 warmup updates, then inverse sqrt), the cooldown;
- `cut`: those settings and the schedule as it was before it knew its budget (no cooldown:
  `optim.warmup_fraction=null optim.cooldown=0`), cut where the budget ends;
- `short_warmup`: `wu_settings` with the warmup cut to a quarter of the planned updates
  (`optim.warmup_fraction=0.25`);
- `linear`: `wu_settings` with warmup, then linear decay to zero over the whole budget
  (`optim.schedule=constant optim.cooldown=1.0`);
- `recipe_4k`: `wu_settings` with batches of 4,096 tokens and dropout 0.1 (twice the updates);
- `small_2k`, `small_1k`: more, smaller updates for a small budget: batches of 2,048 / 1,024
  tokens (4x / 8x the updates), dropout 0.1, the peak lr lowered with the batch (0.002 /
  0.0014) and the warmup a share of the planned updates (15% / 10%);
- `mid_4k`: between those and the recipe, for a middle budget (20M target tokens): batches
  of 4,096 tokens, dropout 0.2, lr 0.003, the warmup 15% of the planned updates;
- `tok`: the recipe on Wu et al.'s data (`data=multi30k_tok`: the dataset's lowercased,
  Moses-tokenized files, 10,000 joint BPE pieces), translating tok/test_2016_flickr.lc.norm.
  tok.en and scored as they scored: `--tokenize none` against the tokenized reference (its
  "BLEU" and "paper" columns are the same number; chrF on the same text).

A finished arm is scored again without training. Results: OUT/results.json and a table;
`transformer plot-curves OUT/cut OUT/recipe -o curves.png` draws their validation curves.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import sacrebleu
from corpora import average, read_gz, read_results, run, save_results, test_source, translate
from timing import timed

HERE = Path(__file__).resolve().parent
WU = ["model=tiny", "data.max_tokens=8192", "model.dropout=0.3",
      "optim.lr=0.005"]  # Wu et al.'s settings
ARMS = {
    "recipe": [],
    "cut": [*WU, "optim.warmup_fraction=null", "optim.cooldown=0"],
    "wu_settings": WU,
    "short_warmup": [*WU, "optim.warmup_fraction=0.25"],
    "linear": [*WU, "optim.schedule=constant", "optim.cooldown=1.0"],
    "recipe_4k": ["model=tiny", "data.max_tokens=4096", "model.dropout=0.1", "optim.lr=0.005"],
    "small_2k": ["model=tiny", "data.max_tokens=2048", "model.dropout=0.1", "optim.lr=0.002",
                 "optim.warmup_fraction=0.15"],
    "small_1k": ["model=tiny", "data.max_tokens=1024", "model.dropout=0.1", "optim.lr=0.0014",
                 "optim.warmup_fraction=0.1"],
    "mid_4k": ["model=tiny", "data.max_tokens=4096", "model.dropout=0.2", "optim.lr=0.003",
               "optim.warmup_fraction=0.15"],
    "tok": ["data=multi30k_tok"],
}
TOKENIZED = {"tok"}  # arms that train on (and translate into) the tokenized lowercased text


def budget(tokens: int, validate_every: int) -> list[str]:
    """The overrides every arm shares: the token budget alone, validations through it
    (a curve) and at every epoch of its last 10% (the checkpoints averaged)."""
    return [f"trainer.max_target_tokens={tokens}", "trainer.max_updates=null",
            "trainer.max_time=null", f"trainer.validate_every_updates={validate_every}",
            "trainer.validate_after_updates=0", "trainer.validate_after_budget=0.9"]


def stopped(run_dir: Path) -> str | None:
    """The train.log line of a finished run ("stopped (max_target_tokens) ..."), or None."""
    log = run_dir / "train.log"
    lines = log.read_text().splitlines() if log.is_file() else []
    return next((line for line in reversed(lines) if "stopped (max_target_tokens)" in line),
                None)


def train(arm: str, run_dir: Path, root: Path, limits: list[str], out: Path) -> None:
    """Train one arm (the budget's `limits`, then the arm's overrides) into `run_dir`, its
    output in OUT/ARM.log."""
    seconds, _ = timed(lambda: run(["transformer", "train", f"hydra.run.dir={run_dir}",
                                    f"data.root={root}", *limits, *ARMS[arm]],
                                   out / f"{arm}.log"))
    print(f"{arm}: trained in {seconds:.0f} s", flush=True)


def score(run_dir: Path, root: Path, tokenized: bool = False) -> dict:
    """Test BLEU (cased, paper protocol) and chrF of the last-5 average and the last
    checkpoint; a `tokenized` model's on the tokenized files, BLEU with `--tokenize none`."""
    from transformer.cli.reports import paper_protocol

    tok_refs = (root / "tok/test_2016_flickr.lc.norm.tok.de").read_text(
        encoding="utf-8").split("\n")[:-1]
    if tokenized:
        source = run_dir / "test.en"
        source.write_text((root / "tok/test_2016_flickr.lc.norm.tok.en").read_text(
            encoding="utf-8"), encoding="utf-8")
        refs = tok_refs
    else:
        source = test_source(root, run_dir)
        refs = read_gz(root / "test_2016_flickr.de.gz")
    out = {}
    for name, checkpoint in (("avg5", average(run_dir)),
                             ("last", run_dir / "checkpoints/checkpoint_last.pt")):
        hyps = translate(checkpoint, source, run_dir / f"test.{name}.de", "--beam-size", "5")
        paper = sacrebleu.corpus_bleu(hyps if tokenized else paper_protocol(hyps, "de"),
                                      [tok_refs], tokenize="none", force=True)
        bleu = sacrebleu.corpus_bleu(hyps, [refs], tokenize="none" if tokenized else "13a",
                                     force=tokenized)
        out[name] = {"bleu": round(bleu.score, 2),
                     "chrf": round(sacrebleu.corpus_chrf(hyps, [refs]).score, 2),
                     "paper": round(paper.score, 2)}
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=HERE.parent.parent / "shared/data/multi30k")
    parser.add_argument("--out", type=Path, default=Path("runs/budget"))
    parser.add_argument("--tokens", type=int, default=5_500_000,
                        help="the budget in target tokens (20M and 61M: the recipe's 30 and "
                             "90 minutes on a CPU with native bf16)")
    parser.add_argument("--validate-every", type=int, default=100)
    parser.add_argument("--arms", nargs="+", default=["recipe", "wu_settings"], choices=list(ARMS))
    args = parser.parse_args()
    root, out = args.root.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = read_results(out)
    for arm in args.arms:
        run_dir = out / arm
        if stopped(run_dir) is None:
            train(arm, run_dir, root, budget(args.tokens, args.validate_every), out)
        results[arm] = {"tokens": args.tokens, "overrides": ARMS[arm],
                        "stopped": stopped(run_dir),
                        "test": score(run_dir, root, tokenized=arm in TOKENIZED)}
        save_results(out, results)
        print(arm, json.dumps(results[arm]["test"]), flush=True)
    print("\narm         checkpoint   BLEU  paper   chrF")
    for arm, result in results.items():
        for name, r in result["test"].items():
            print(f"{arm:<11} {name:<10} {r['bleu']:>6.2f} {r['paper']:>6.2f} {r['chrf']:>6.2f}")


if __name__ == "__main__":
    main()
