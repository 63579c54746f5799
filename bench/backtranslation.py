"""Does back-translated in-domain German make a better Multi30k en->de model than Multi30k
alone?

    python bench/backtranslation.py --root ../shared/data/multi30k \\
        --mono ../shared/data/multi30k-task2 --out runs/backtranslation --updates 4000 \\
        --arms reverse baseline bt_tagged [--reuse-clean runs/corpora/clean]

The German descriptions of Multi30k task 2 (145,000 lines written independently of the
English: in-domain monolingual text, not translations) become synthetic pairs through a
de->en model (`transformer backtranslate`). Every model trains the recipe for the same
number of updates of the same size (bench/corpora.py's `recipe`; `--settings budget`, the
default: the batch size, dropout and lr the recipe chooses for that many updates, 2,048-token
batches at 4,000; `wu`: Wu et al.'s, the schedule of bench/corpora.py's arms), then
translates test_2016_flickr (beam 5) with the average of its last 5 numbered checkpoints and
with its last checkpoint, scored with cased sacreBLEU and chrF.

Arms (`--arms`, run one after another in this order, never two trainings at once):
- `reverse`: the de->en model (`data.src_lang=de data.tgt_lang=en`), scored de->en;
- `baseline`: Multi30k en->de alone, bench/corpora.py's `clean` arm (`--reuse-clean DIR`
  scores a finished run of it instead of training one);
- `bt_tagged`: Multi30k (`filters: none`) plus the synthetic corpus (OUT/bt_sampled.en,
  OUT/mono.de; `filters: basic`) tagged `<bt>`, sampled real / synthetic by `--bt-weight`
  (default 0.5 / 0.5 of every epoch);
- `bt_untagged`: the same without the tag;
- `bt_beam`: tagged, from a beam-5 back-translation (OUT/bt_beam.en) instead of sampling;
- `bt_finetune`: the two stages of mozilla/translations' teachers (and of Calixto et al.
  2017 on this corpus): `bt_tagged`'s mixture for the first (1 - `--finetune-share`) of the
  updates (OUT/bt_pretrain), then, from the average of its last 5 checkpoints
  (`init_from`: its weights and tokenizers, a new optimizer and schedule), Multi30k alone
  for the rest. Both stages take the batch size, dropout and lr the recipe chooses for the
  whole `--updates`, so the arm makes as many updates of the same size as `baseline`;
  `--finetune-bt beam` gives its mixture the beam-5 back-translation instead of the sampled.
The default is `reverse baseline bt_tagged`. An epoch of the mixed arms has as many pairs as
both corpora (174,000: six Multi30k epochs), so they also validate, and number a checkpoint,
every `--updates` / 40 updates (100 of 2,048 tokens: under half a Multi30k epoch): their
last 5 checkpoints come from the cooldown, as the baseline's epoch checkpoints do.
Validation: Multi30k's val.

The back-translation: OUT/mono.de (train.{1..5}.de.gz of `--mono` as one plain file; with
`--mono-sentences` only the descriptions written as a sentence, a capital first letter and a
final . ! or ?, as 99.1% of Multi30k's German side is and 76.8% of task 2's) by the
reverse model's averaged checkpoint, sampled top-k 10 (the command's default) or beam 5
(`bt_beam`); with `--engine ctranslate2` (the default when the ctranslate2 module imports) by
its int8 export (`transformer export --quantization int8`, OUT/reverse/ct2-int8), 2 threads.
Its sentences/s come from the command's last line on stderr.

`--reverse-updates N` trains the reverse model for N updates instead (its settings the
recipe's for N), so that one reverse model serves en->de arms of a larger budget. At the
recipe's own budget (`--updates 8020`: 8,192-token batches, dropout 0.3, lr 0.005, a warmup
of 2,000 updates, which each `bt_finetune` stage takes as the same share of its updates),
`--reuse-clean` can name a finished `transformer train` run of the recipe as the baseline.

A finished arm (train.log's last line: stopped after `--updates` updates, with
checkpoints/checkpoint_last.pt) is scored again without training; a finished
back-translation (OUT/bt_sampled.en or OUT/bt_beam.en present) is not redone, and an
interrupted one resumes where it stopped when the command is run again (with the same
`--engine`: another is refused). Results go to OUT/results.json (test scores, training
seconds, the cleaning table of each arm, the back-translations' speed) and are printed as a
table with each arm's gain over `baseline`.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import yaml
from corpora import (
    add_settings_option,
    average,
    bleu_chrf,
    corpus_entry,
    finished,
    read_gz,
    read_results,
    recipe,
    run,
    save_results,
    test_source,
    train,
    translate,
    update_tokens,
    validation_window,
)
from timing import timed

import transformer
from transformer.training.schedule import Budget, budget_settings

HERE = Path(__file__).resolve().parent
ARMS = ("reverse", "baseline", "bt_tagged", "bt_untagged", "bt_beam", "bt_finetune")
MONO_FILES = 5  # train.1.de.gz ... train.5.de.gz
MULTI30K_EPOCH_TOKENS = 471_603  # target tokens of Multi30k's train split (en->de, EOS included)
TAG = "'<bt>'"  # quoted for Hydra's override grammar


def has_ctranslate2() -> bool:
    try:
        import ctranslate2  # noqa: F401
    except ImportError:
        return False
    return True


def command_report(log: Path) -> dict:
    """The numbers of the last "wrote N lines ... in S s (X sentences/s)..." line that
    `transformer backtranslate` or `distill` wrote to `log`."""
    lines = log.read_text(encoding="utf-8", errors="replace").replace("\r", "\n").splitlines()
    line = next(line for line in reversed(lines)
                if line.startswith("wrote ") and "sentences/s" in line)
    found = re.search(r"wrote ([\d,]+) lines .* in ([\d.]+) s \(([\d.]+) sentences/s\)", line)
    return {"lines": int(found[1].replace(",", "")), "seconds": float(found[2]),
            "sentences_per_s": float(found[3]), "report": line}


def training_seconds(run_dir: Path) -> int | None:
    """The trainer's own clock at the end of a finished run (train.log's last line)."""
    log = run_dir / "train.log"
    found = re.findall(r"after \d+ updates \([\d,]+ target tokens\), (\d+) s",
                       log.read_text() if log.is_file() else "")
    return int(found[-1]) if found else None


def times(run_dir: Path, seconds: float | None, earlier: dict) -> dict:
    """An arm's training time: the trainer's clock (train.log) and the training command's
    wall clock (`seconds`, or as recorded `earlier` when this run did not train it)."""
    return {"train_s": training_seconds(run_dir),
            "wall_s": round(seconds) if seconds else earlier.get("wall_s")}


def corpus_weights(run_dir: Path) -> dict | None:
    """{corpus: weight} of the run's `data.corpora` (its config.yaml), None without."""
    config = yaml.safe_load((run_dir / "config.yaml").read_text())
    return {c["name"]: c["weight"] for c in config["data"].get("corpora") or []} or None


def export_int8(checkpoint: Path, directory: Path) -> Path:
    """DIRECTORY: the CTranslate2 int8 export of `checkpoint` (made once)."""
    if not (directory / "model.bin").is_file():
        run(["transformer", "export", "--checkpoint", str(checkpoint), "--output",
             str(directory), "--quantization", "int8"])
    return directory


# A description written as a sentence: a capital first letter, a final . ! or ? (closing
# quotes or brackets may follow).
SENTENCE = re.compile(r"[A-ZÄÖÜ].*[.!?][\"'\u201c\u201d)\]]*")


def mono_text(mono: Path, out: Path, sentences_only: bool) -> Path:
    """OUT/mono.de: the German descriptions of task 2, train.1.de.gz to train.5.de.gz one
    after another as one plain file (made once); with `sentences_only`, only those written
    as a sentence (`SENTENCE`), the form of Multi30k's German side."""
    path = out / "mono.de"
    if not path.is_file():
        lines = [line for k in range(1, MONO_FILES + 1)
                 for line in read_gz(mono / f"train.{k}.de.gz")
                 if not sentences_only or SENTENCE.fullmatch(line.strip())]
        partial = out / "mono.de.partial"
        partial.write_text("\n".join(lines) + "\n", encoding="utf-8")
        partial.replace(path)
    return path


def backtranslate(out: Path, mono: Path, name: str, engine: str, threads: int) -> dict | None:
    """OUT/NAME.en: the reverse model's translation of OUT/mono.de (`bt_sampled`: sampled,
    `bt_beam`: beam 5) -> its speed, or None when it was there already."""
    output = out / f"{name}.en"
    if output.is_file():
        return None
    reverse = average(out / "reverse")
    model = export_int8(reverse, out / "reverse/ct2-int8") if engine == "ctranslate2" else reverse
    command = ["transformer", "backtranslate", "--checkpoint", str(model), "--engine", engine,
               "--threads", str(threads), "--input", str(mono), "--output", str(output),
               "--src-lang", "en", "--tgt-lang", "de",
               "--config-fragment", str(out / f"{name}.yaml")]
    if name == "bt_beam":
        command += ["--beam-size", "5"]
    log = out / f"{name}.log"
    seconds, _ = timed(lambda: run(command, log))
    return {"engine": engine, "threads": threads, "wall_s": round(seconds),
            **command_report(log)}


def synthetic_name(arm: str, finetune_bt: str) -> str:
    """The back-translation an arm trains on: `bt_beam` or `bt_sampled`."""
    beam = arm == "bt_beam" or (arm == "bt_finetune" and finetune_bt == "beam")
    return "bt_beam" if beam else "bt_sampled"


def arm_overrides(arm: str, root: Path, out: Path, bt_weight: float, updates: int,
                  synthetic: str) -> list[str]:
    """The data overrides of one arm (after the recipe's); `synthetic` names the
    back-translation of the mixed arms (OUT/SYNTHETIC.en)."""
    if arm == "reverse":
        return ["data.src_lang=de", "data.tgt_lang=en"]
    if arm == "baseline":
        return []
    real = corpus_entry("real", root / "train.en.gz", root / "train.de.gz",
                        weight=f"{1 - bt_weight:g}", filters="none")
    synthetic = out / f"{synthetic}.en"
    tag = {} if arm == "bt_untagged" else {"tag": TAG}
    bt = corpus_entry("bt", synthetic, out / "mono.de", **tag, weight=f"{bt_weight:g}",
                      filters="basic")
    return [f"data.corpora=[{real},{bt}]",
            f"trainer.validate_every_updates={max(1, updates // 40)}"]  # replaces recipe's


def whole_budget_settings(updates: int, settings: str) -> list[str]:
    """The batch size, dropout and lr (with its warmup share) of `recipe(updates, settings)`
    as explicit overrides, so that a stage of fewer updates keeps them."""
    if settings == "wu":
        return [o for o in recipe(updates, settings) if o.startswith(
            ("data.max_tokens=", "model.dropout=", "optim.lr=", "optim.warmup_fraction="))]
    row = budget_settings(Budget(max_updates=updates), MULTI30K_EPOCH_TOKENS)
    fraction = row.warmup_fraction
    if fraction is None:  # a warmup in updates (Wu et al.'s 2,000): as a share, for a stage
        fraction = round(recipe_warmup_updates() / updates, 4)
    return [f"model={row.model}", f"data.max_tokens={row.update_tokens}",
            f"model.dropout={row.dropout}",
            f"optim.lr={row.lr}", f"optim.warmup_fraction={fraction}"]


def recipe_warmup_updates() -> int:
    """`optim.warmup_updates` of the recipe (the package's configs/experiment/multi30k.yaml),
    the warmup of a budget whose settings give no share of the updates."""
    preset = Path(transformer.__file__).parent / "configs/experiment/multi30k.yaml"
    return yaml.safe_load(preset.read_text())["optim"]["warmup_updates"]


def finetune_updates(updates: int, share: float) -> int:
    """`bt_finetune`'s updates on Multi30k alone (the rest are the mixture's)."""
    return min(updates - 1, max(1, round(updates * share)))


def train_finetune(out: Path, root: Path, updates: int, share: float, bt_weight: float,
                   settings: str, synthetic: str) -> float | None:
    """`bt_finetune`: OUT/bt_pretrain on the tagged mixture (with OUT/SYNTHETIC.en), then
    OUT/bt_finetune from its average on Multi30k alone -> the seconds both stages took (None
    when both were done)."""
    fixed = whole_budget_settings(updates, settings)
    finetune = finetune_updates(updates, share)
    pretrain = updates - finetune
    seconds = train(out / "bt_pretrain", root, pretrain,
                    [*fixed, *arm_overrides("bt_tagged", root, out, bt_weight, pretrain,
                                            synthetic)],
                    out / "bt_pretrain.log", settings)
    window = validation_window(update_tokens(updates, settings))  # at the whole budget's batches
    more = train(out / "bt_finetune", root, finetune,
                 [*fixed, f"init_from={average(out / 'bt_pretrain')}",
                  f"trainer.validate_after_updates={max(0, finetune - window)}"],
                 out / "bt_finetune.log", settings)
    return None if seconds is None and more is None else (seconds or 0) + (more or 0)


def score(run_dir: Path, root: Path, src: str, tgt: str) -> dict:
    """Test BLEU and chrF (beam 5) of the last-5 average and of the last checkpoint."""
    source = test_source(root, run_dir, src)
    refs = read_gz(root / f"test_2016_flickr.{tgt}.gz")
    checkpoints = {"avg5": average(run_dir), "last": run_dir / "checkpoints/checkpoint_last.pt"}
    return {name: bleu_chrf(translate(path, source, run_dir / f"test.{name}.{tgt}",
                                      "--beam-size", "5"), refs)
            for name, path in checkpoints.items()}


def gains(results: dict) -> dict:
    """{arm: its BLEU minus the baseline's} of the en->de arms (the last-5 averages)."""
    if "baseline" not in results:
        return {}
    base = results["baseline"]["test"]["avg5"]["bleu"]
    return {arm: round(results[arm]["test"]["avg5"]["bleu"] - base, 2)
            for arm in ARMS[2:] if arm in results}


def print_table(results: dict) -> None:
    print("\narm          pair    BLEU   chrF  last BLEU   gain  train s")
    for arm in ARMS:
        if arm not in results:
            continue
        r = results[arm]
        avg5, last = r["test"]["avg5"], r["test"]["last"]
        gain = results["gains"].get(arm)
        gain = "      " if gain is None else f"{gain:+6.2f}"
        print(f"{arm:<12} {r['pair']:<6} {avg5['bleu']:>5.2f} {avg5['chrf']:>6.2f} "
              f"{last['bleu']:>10.2f} {gain} {r.get('train_s') or '-':>8}")
    for name in ("bt_sampled", "bt_beam"):
        if name in results.get("backtranslation", {}):
            b = results["backtranslation"][name]
            print(f"{name}: {b['lines']:,} lines, {b['sentences_per_s']:.1f} sentences/s "
                  f"({b['engine']}, {b['threads']} threads)")
    base = results.get("baseline", {}).get("test", {}).get("avg5", {}).get("bleu")
    if base is not None and base < 35:
        print(f"note: the baseline reached {base:.2f} BLEU, under the 35 it should reach")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=HERE.parent.parent / "shared/data/multi30k")
    parser.add_argument("--mono", type=Path,
                        default=HERE.parent.parent / "shared/data/multi30k-task2",
                        help="Multi30k task 2's folder: train.{1..5}.de.gz")
    parser.add_argument("--out", type=Path, default=Path("runs/backtranslation"))
    parser.add_argument("--updates", type=int, default=4000)
    parser.add_argument("--reverse-updates", type=int, metavar="N",
                        help="the reverse model's updates (default: --updates); its batch "
                             "size, dropout and lr are the ones the recipe chooses for N")
    parser.add_argument("--arms", nargs="+", default=["reverse", "baseline", "bt_tagged"],
                        choices=ARMS)
    add_settings_option(parser, "budget")
    parser.add_argument("--bt-weight", type=float, default=0.5,
                        help="the synthetic corpus's share of every epoch (data.corpora "
                             "weight); the real corpus gets the rest (default 0.5). A "
                             "finished arm keeps the weights it trained with")
    parser.add_argument("--finetune-share", type=float, default=0.4,
                        help="bt_finetune: the share of --updates spent on Multi30k alone "
                             "after the mixture (default 0.4)")
    parser.add_argument("--finetune-bt", choices=("sampled", "beam"), default="sampled",
                        help="bt_finetune's back-translation: sampled top-k 10 (default) "
                             "or beam 5 (OUT/bt_beam.en, as bt_beam's)")
    parser.add_argument("--mono-sentences", action="store_true",
                        help="back-translate only the German descriptions written as a "
                             "sentence (a capital first letter, a final . ! or ?), as "
                             "Multi30k's German side is; OUT/mono.de keeps the choice it "
                             "was made with")
    parser.add_argument("--engine", choices=("torch", "ctranslate2"),
                        default="ctranslate2" if has_ctranslate2() else "torch",
                        help="the back-translation's engine (default ctranslate2, an int8 "
                             "export, when the module imports; else torch)")
    parser.add_argument("--threads", type=int, default=2,
                        help="the back-translation's threads (default 2)")
    parser.add_argument("--reuse-clean", type=Path, metavar="DIR",
                        help="a finished run of bench/corpora.py's clean arm (the same "
                             "--updates) to score as the baseline instead of training one")
    args = parser.parse_args()
    if not 0 < args.finetune_share < 1:
        parser.error(f"--finetune-share must be in (0, 1), got {args.finetune_share}")
    if not 0 < args.bt_weight < 1:
        parser.error(f"--bt-weight must be in (0, 1), got {args.bt_weight}")
    root, mono, out = args.root.resolve(), args.mono.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = read_results(out)
    reverse_updates = args.reverse_updates or args.updates
    for arm in sorted(set(args.arms), key=ARMS.index):  # the reverse model first
        run_dir = out / arm
        updates = reverse_updates if arm == "reverse" else args.updates
        if arm == "baseline" and args.reuse_clean:
            run_dir = args.reuse_clean.resolve()
            if not finished(run_dir, args.updates):
                raise SystemExit(f"--reuse-clean {run_dir}: not a run finished after "
                                 f"{args.updates} updates")
        done = (finished(run_dir, finetune_updates(args.updates, args.finetune_share))
                if arm == "bt_finetune" else finished(run_dir, args.updates))
        if arm.startswith("bt_") and not done:
            if not finished(out / "reverse", reverse_updates):
                raise SystemExit(f"{arm} needs the reverse model trained for "
                                 f"{reverse_updates} updates: run --arms reverse first")
            name = synthetic_name(arm, args.finetune_bt)
            report = backtranslate(out, mono_text(mono, out, args.mono_sentences), name,
                                   args.engine, args.threads)
            if report is not None:
                results.setdefault("backtranslation", {})[name] = report
                save_results(out, results)
        if arm == "bt_finetune":
            seconds = train_finetune(out, root, updates, args.finetune_share, args.bt_weight,
                                     args.settings, synthetic_name(arm, args.finetune_bt))
        else:
            seconds = train(run_dir, root, updates,
                            arm_overrides(arm, root, out, args.bt_weight, updates,
                                          synthetic_name(arm, args.finetune_bt)),
                            out / f"{arm}.log", args.settings)
        src, tgt = ("de", "en") if arm == "reverse" else ("en", "de")
        cleaning = run_dir / "cleaning.txt"
        results[arm] = {
            "updates": updates, "settings": args.settings, "pair": f"{src}-{tgt}",
            "run_dir": str(run_dir),
            "weights": corpus_weights(run_dir), **times(run_dir, seconds, results.get(arm, {})),
            "test": score(run_dir, root, src, tgt),
            "cleaning": cleaning.read_text() if cleaning.is_file() else None}
        if arm == "bt_finetune":
            stage = out / "bt_pretrain"
            results[arm]["pretrain"] = {
                "updates": updates - finetune_updates(updates, args.finetune_share),
                "train_s": training_seconds(stage), "weights": corpus_weights(stage)}
        results["gains"] = gains(results)
        save_results(out, results)
        print(arm, json.dumps(results[arm]["test"]), flush=True)
    print_table(results)


if __name__ == "__main__":
    main()
