"""Does back-translated monolingual text make a better Multi30k model than the parallel data
alone, translating into English, out of German, or with little parallel data?

    python bench/backtranslation.py --root ../shared/data/multi30k \\
        --mono ../shared/data/multi30k-task2 --out runs/bt-de-en --pair de-en --updates 4000 \\
        --arms reverse baseline bt_tagged
    python bench/backtranslation.py --root ../shared/data/multi30k --out runs/bt-eighth \\
        --parallel-share 0.125 --updates 4000 --arms reverse baseline bt_tagged

Three experiments, one protocol:
- `--pair en-de` (the default): Multi30k en->de, the German descriptions of Multi30k task 2
  back-translated. test_2016_flickr's English is the original and its German a translation
  (source-original in this direction), where back-translation helps least.
- `--pair de-en`: Multi30k de->en, task 2's English captions back-translated; the test set's
  English is now the target and the original, where it helps most (Edunov et al. 2020).
- `--parallel-share F` (with either pair): the first F of Multi30k's 29,000 training pairs
  are the parallel corpus (`data.max_train_pairs`: lines 1 to round(29,000 F)) and the
  target side of the rest the monolingual text, the usual simulation of a language pair
  with little parallel data. Every arm then trains one vocabulary size, the one the package
  chooses for that parallel share (`vocab_size_for` its words), and validates every
  `--updates` / 40 updates instead of every epoch (an epoch is a few dozen updates).

The monolingual text (OUT/mono.TGT, made once) is back-translated into synthetic pairs by
the reverse model (`transformer backtranslate`). Task 2's files hold every English training
sentence of task 1 (29,000 of its lines) and a few sentences of its validation and test
sets: a line equal to a sentence of Multi30k's train, val or test split in that language is
dropped (a test reference among the target-side text would leak it). Every model trains the
recipe for the same number of updates of the same size (bench/corpora.py's `recipe`;
`--settings budget`, the default: the batch size, dropout and lr the recipe chooses for that
many updates and its corpus, 2,048-token batches at 4,000; `--settings budget_2048`: those it
chooses for `--updates` x 2,048 target tokens, the 4,000 updates' batches in a longer run,
where `budget` takes batches of 4,096 tokens from 5,000 updates), then translates
test_2016_flickr (beam 5) with the average of its last 5 numbered checkpoints and with its
last checkpoint, scored with cased sacreBLEU (with its brevity penalty and length ratio) and
chrF. Which checkpoint is reported is fixed in advance (the average); nothing is chosen on
the test set.

Arms (`--arms`, run one after another in this order, never two trainings at once):
- `reverse`: the back-translator, the other direction on the same parallel data, scored in
  that direction (`--reverse-checkpoint FILE` uses a trained model instead, scored the same
  way: e.g. the README's 30-minute en->de run for `--pair de-en`);
- `baseline`: the parallel data alone (`--reuse-clean DIR` scores a finished run of
  bench/corpora.py's `clean` arm instead of training one, en->de);
- `bt_tagged`: the parallel data (`filters: none`) plus the synthetic corpus
  (OUT/bt_sampled.SRC, OUT/mono.TGT; `filters: basic`) tagged `<bt>`, sampled real /
  synthetic by `--bt-weight` (default 0.5 / 0.5 of every epoch);
- `bt_untagged`: the same without the tag;
- `bt_beam`: tagged, from a beam-5 back-translation (OUT/bt_beam.SRC) instead of sampling;
- `bt_finetune`: the two stages of mozilla/translations' teachers (and of Calixto et al.
  2017 on this corpus): `bt_tagged`'s mixture for the first (1 - `--finetune-share`) of the
  updates (OUT/bt_pretrain), then, from the average of its last 5 checkpoints
  (`init_from`: its weights and tokenizers, a new optimizer and schedule), the parallel
  data alone for the rest. Both stages take the batch size, dropout and lr the recipe
  chooses for the whole `--updates`, so the arm makes as many updates of the same size as
  `baseline`; `--finetune-bt beam` gives its mixture the beam-5 back-translation instead.
The default is `reverse baseline bt_tagged`. An epoch of the mixed arms has as many pairs as
both corpora, so they validate, and number a checkpoint, every `--updates` / 40 updates
(100 of 2,048 tokens at 4,000): their last 5 checkpoints come from the cooldown, as the
baseline's epoch checkpoints do. Validation: Multi30k's val.

The back-translation: OUT/mono.TGT (with `--mono-sentences` only the lines written as a
sentence, a capital first letter and a final . ! or ?, as 99.1% of Multi30k's German side
is and 76.8% of task 2's) by the reverse model (its averaged checkpoint), sampled top-k 10
(the command's default) or beam 5 (`bt_beam`); with `--engine ctranslate2` (the default when
the ctranslate2 module imports) by its int8 export (`transformer export --quantization
int8`, OUT/reverse/ct2-int8), 2 threads. Its sentences/s come from the command's last line
on stderr.

`--seed N` gives every trained arm `seed=N` and `data.seed=N` (initialisation, dropout, data
order and the mixture's sampling), for a second measurement of the same arms in another
`--out`. `--reverse-updates N` trains the reverse model for N updates instead (its settings the
recipe's for N), so that one reverse model serves arms of a larger budget. At the recipe's
own budget (`--updates 8020`: 8,192-token batches, dropout 0.3, lr 0.005, a warmup of 2,000
updates, which each `bt_finetune` stage takes as the same share of its updates),
`--reuse-clean` can name a finished `transformer train` run of the recipe as the baseline.

A finished arm (train.log's last line: stopped after `--updates` updates, with
checkpoints/checkpoint_last.pt) is scored again without training; a finished
back-translation (OUT/bt_sampled.SRC or OUT/bt_beam.SRC present) is not redone, and an
interrupted one resumes where it stopped when the command is run again (with the same
`--engine`: another is refused). Results go to OUT/results.json (test scores, training
seconds, the cleaning table of each arm, the monolingual text's lines, the
back-translations' speed) and are printed as a table with each arm's gain over `baseline`.
"""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import dataclass
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
    recipe_budget,
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
from transformer.run.tokenizers import vocab_size_for
from transformer.training.schedule import budget_settings

HERE = Path(__file__).resolve().parent
ARMS = ("reverse", "baseline", "bt_tagged", "bt_untagged", "bt_beam", "bt_finetune")
PAIRS = ("en-de", "de-en")
MONO_FILES = 5  # train.1.TGT.gz ... train.5.TGT.gz of task 2
MULTI30K_PAIRS = 29_000  # the pairs of Multi30k's train split
MULTI30K_EPOCH_TOKENS = 471_603  # target tokens of Multi30k's train split (en->de, EOS included)
TAG = "'<bt>'"  # quoted for Hydra's override grammar


@dataclass(frozen=True)
class Setup:
    """One experiment: where its data are and which way its arms translate."""
    root: Path  # Multi30k's files (train/val/test_2016_flickr.LANG.gz)
    out: Path
    src: str  # the language the arms other than `reverse` translate from ...
    tgt: str  # ... and into: the monolingual text's language
    parallel_pairs: int | None  # the first N training pairs only; None: all of them
    seed: int | None = None  # every arm's `seed` and `data.seed`; None: the config's

    def languages(self, arm: str) -> tuple[str, str]:
        """(source, target) of an arm: `reverse` translates the other way."""
        return (self.tgt, self.src) if arm == "reverse" else (self.src, self.tgt)


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


def mono_lines(setup: Setup, mono: Path) -> tuple[list[str], int]:
    """The monolingual TGT text and how many lines were dropped: with a parallel share, the
    target side of Multi30k's training pairs after the first N; else task 2's
    train.{1..5}.TGT.gz one after another, less each line equal to a sentence of Multi30k's
    train, val or test split in TGT."""
    if setup.parallel_pairs:
        return read_gz(setup.root / f"train.{setup.tgt}.gz")[setup.parallel_pairs:], 0
    multi30k = {line.strip() for split in ("train", "val", "test_2016_flickr")
                for line in read_gz(setup.root / f"{split}.{setup.tgt}.gz")}
    lines = [line for k in range(1, MONO_FILES + 1)
             for line in read_gz(mono / f"train.{k}.{setup.tgt}.gz")]
    kept = [line for line in lines if line.strip() not in multi30k]
    return kept, len(lines) - len(kept)


def mono_text(setup: Setup, mono: Path, sentences_only: bool) -> tuple[Path, dict]:
    """OUT/mono.TGT, `mono_lines` as one plain file (made once); with `sentences_only`,
    only the lines written as a sentence (`SENTENCE`), the form of Multi30k's German side
    -> its path and its line counts."""
    path = setup.out / f"mono.{setup.tgt}"
    if not path.is_file():
        lines, dropped = mono_lines(setup, mono)
        kept = [line for line in lines
                if not sentences_only or SENTENCE.fullmatch(line.strip())]
        partial = setup.out / f"mono.{setup.tgt}.partial"
        partial.write_text("\n".join(kept) + "\n", encoding="utf-8")
        partial.replace(path)
        (setup.out / "mono.json").write_text(json.dumps(
            {"lines": len(kept), "equal_to_multi30k": dropped,
             "not_sentences": len(lines) - len(kept)}))
    return path, json.loads((setup.out / "mono.json").read_text())


def backtranslate(setup: Setup, reverse: Path, mono: Path, name: str, engine: str,
                  threads: int) -> dict | None:
    """OUT/NAME.SRC: the reverse model's translation of OUT/mono.TGT (`bt_sampled`:
    sampled, `bt_beam`: beam 5) -> its speed, or None when it was there already."""
    output = setup.out / f"{name}.{setup.src}"
    if output.is_file():
        return None
    model = (export_int8(reverse, setup.out / "reverse/ct2-int8")
             if engine == "ctranslate2" else reverse)
    command = ["transformer", "backtranslate", "--checkpoint", str(model), "--engine", engine,
               "--threads", str(threads), "--input", str(mono), "--output", str(output),
               "--src-lang", setup.src, "--tgt-lang", setup.tgt,
               "--config-fragment", str(setup.out / f"{name}.yaml")]
    if name == "bt_beam":
        command += ["--beam-size", "5"]
    log = setup.out / f"{name}.log"
    seconds, _ = timed(lambda: run(command, log))
    return {"engine": engine, "threads": threads, "wall_s": round(seconds),
            **command_report(log)}


def synthetic_name(arm: str, finetune_bt: str) -> str:
    """The back-translation an arm trains on: `bt_beam` or `bt_sampled`."""
    beam = arm == "bt_beam" or (arm == "bt_finetune" and finetune_bt == "beam")
    return "bt_beam" if beam else "bt_sampled"


def parallel_vocab_size(setup: Setup) -> int:
    """The vocabulary size the package chooses for the parallel share's words (both
    sides), which every arm of a parallel share trains."""
    words = sum(len(line.split()) for lang in (setup.src, setup.tgt)
                for line in read_gz(setup.root / f"train.{lang}.gz")[:setup.parallel_pairs])
    return vocab_size_for(words)


def arm_overrides(arm: str, setup: Setup, bt_weight: float, updates: int,
                  synthetic: str) -> list[str]:
    """The data overrides of one arm (after the recipe's); `synthetic` names the
    back-translation of the mixed arms (OUT/SYNTHETIC.SRC)."""
    src, tgt = setup.languages(arm)
    overrides = [f"data.src_lang={src}", f"data.tgt_lang={tgt}"]
    if setup.seed is not None:
        overrides += [f"seed={setup.seed}", f"data.seed={setup.seed}"]
    every = [f"trainer.validate_every_updates={max(1, updates // 40)}"]  # replaces recipe's
    if setup.parallel_pairs:
        overrides += [f"data.vocab_size={parallel_vocab_size(setup)}",
                      "trainer.validate_every_epoch=false", *every]
    if arm in ("reverse", "baseline"):
        if setup.parallel_pairs:
            overrides.append(f"data.max_train_pairs={setup.parallel_pairs}")
        return overrides
    share = {"max_pairs": str(setup.parallel_pairs)} if setup.parallel_pairs else {}
    root, out = setup.root, setup.out
    real = corpus_entry("real", root / f"train.{src}.gz", root / f"train.{tgt}.gz",
                        weight=f"{1 - bt_weight:g}", filters="none", **share)
    tag = {} if arm == "bt_untagged" else {"tag": TAG}
    bt = corpus_entry("bt", out / f"{synthetic}.{src}", out / f"mono.{tgt}", **tag,
                      weight=f"{bt_weight:g}", filters="basic")
    return [*overrides, f"data.corpora=[{real},{bt}]",
            *([] if setup.parallel_pairs else every)]


def whole_budget_settings(updates: int, settings: str) -> list[str]:
    """The batch size, dropout and lr (with its warmup share) of `recipe(updates, settings)`
    as explicit overrides, so that a stage of fewer updates keeps them."""
    if settings == "wu":
        return [o for o in recipe(updates, settings) if o.startswith(
            ("data.max_tokens=", "model.dropout=", "optim.lr=", "optim.warmup_fraction="))]
    row = budget_settings(recipe_budget(updates, settings), MULTI30K_EPOCH_TOKENS)
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
    """`bt_finetune`'s updates on the parallel data alone (the rest are the mixture's)."""
    return min(updates - 1, max(1, round(updates * share)))


def train_finetune(setup: Setup, updates: int, share: float, bt_weight: float,
                   settings: str, synthetic: str) -> float | None:
    """`bt_finetune`: OUT/bt_pretrain on the tagged mixture (with OUT/SYNTHETIC.SRC), then
    OUT/bt_finetune from its average on the parallel data alone -> the seconds both stages
    took (None when both were done)."""
    out, root = setup.out, setup.root
    fixed = whole_budget_settings(updates, settings)
    finetune = finetune_updates(updates, share)
    pretrain = updates - finetune
    seconds = train(out / "bt_pretrain", root, pretrain,
                    [*fixed, *arm_overrides("bt_tagged", setup, bt_weight, pretrain,
                                            synthetic)],
                    out / "bt_pretrain.log", settings)
    window = validation_window(update_tokens(updates, settings))  # at the whole budget's batches
    more = train(out / "bt_finetune", root, finetune,
                 [*fixed, *arm_overrides("baseline", setup, bt_weight, finetune, synthetic),
                  f"init_from={average(out / 'bt_pretrain')}",
                  f"trainer.validate_after_updates={max(0, finetune - window)}"],
                 out / "bt_finetune.log", settings)
    return None if seconds is None and more is None else (seconds or 0) + (more or 0)


def score_checkpoints(checkpoints: dict[str, Path], folder: Path, root: Path, src: str,
                      tgt: str) -> dict:
    """{name: test BLEU, chrF, brevity penalty and length ratio (beam 5)} of each checkpoint,
    its translations in FOLDER/test.NAME.TGT."""
    source = test_source(root, folder, src)
    refs = read_gz(root / f"test_2016_flickr.{tgt}.gz")
    return {name: bleu_chrf(translate(path, source, folder / f"test.{name}.{tgt}",
                                      "--beam-size", "5"), refs)
            for name, path in checkpoints.items()}


def tuned(run_dir: Path) -> tuple[Path, float]:
    """RUN/tuned.pt: the last-5 average with the length penalty (alpha) that scores best on
    the run's validation set (`transformer tune-decoding --last 5`, made once) -> its path
    and alpha."""
    path, log = run_dir / "tuned.pt", run_dir / "tune-decoding.log"
    if not path.is_file():
        log.unlink(missing_ok=True)
        run(["transformer", "tune-decoding", str(run_dir), "--last", "5", "-o", str(path)], log)
    alpha = re.findall(r"^chosen: .*alpha ([\d.]+)", log.read_text(), re.MULTILINE)[-1]
    return path, float(alpha)


def score(run_dir: Path, root: Path, src: str, tgt: str) -> dict:
    """`score_checkpoints` of the run's last-5 average (the fixed choice), its last
    checkpoint, and the average with the length penalty chosen on validation (`tuned`)."""
    path, alpha = tuned(run_dir)
    scores = score_checkpoints({"avg5": average(run_dir), "tuned": path,
                                "last": run_dir / "checkpoints/checkpoint_last.pt"},
                               run_dir, root, src, tgt)
    scores["tuned"]["alpha"] = alpha
    return scores


def gains(results: dict) -> dict:
    """{arm: its BLEU minus the baseline's} of the back-translated arms (the last-5
    averages)."""
    if "baseline" not in results:
        return {}
    base = results["baseline"]["test"]
    return {arm: {name: round(results[arm]["test"][name]["bleu"] - base[name]["bleu"], 2)
                  for name in ("avg5", "tuned") if name in base and name in results[arm]["test"]}
            for arm in ARMS[2:] if arm in results}


def print_table(results: dict) -> None:
    print("\narm          pair    BLEU   chrF     BP  ratio  last BLEU   gain  "
          "tuned BLEU (alpha)   gain  train s")
    for arm in ARMS:
        if arm not in results:
            continue
        r = results[arm]
        main = r["test"].get("avg5") or r["test"]["given"]
        last = r["test"].get("last", main)
        gain = results["gains"].get(arm, {})
        columns = [f"{arm:<12} {r['pair']:<6} {main['bleu']:>5.2f} {main['chrf']:>6.2f}",
                   f"{main.get('bp', float('nan')):>6.3f} {main.get('ratio', float('nan')):>6.3f}",
                   f"{last['bleu']:>10.2f}", _gain(gain.get("avg5"))]
        if "tuned" in r["test"]:
            t = r["test"]["tuned"]
            columns += [f"{t['bleu']:>10.2f} ({t['alpha']:g})".ljust(18), _gain(gain.get("tuned"))]
        else:
            columns += [" " * 18, _gain(None)]
        seconds = (r.get("train_s") or 0) + (r.get("pretrain", {}).get("train_s") or 0)
        print(" ".join(columns), f"{seconds or '-':>8}")  # bt_finetune: both stages
    if "mono" in results:
        m = results["mono"]
        print(f"monolingual text: {m['lines']:,} lines ({m['equal_to_multi30k']:,} equal to a "
              f"Multi30k sentence and {m['not_sentences']:,} not sentences left out)")
    for name in ("bt_sampled", "bt_beam"):
        if name in results.get("backtranslation", {}):
            b = results["backtranslation"][name]
            print(f"{name}: {b['lines']:,} lines, {b['sentences_per_s']:.1f} sentences/s "
                  f"({b['engine']}, {b['threads']} threads)")


def _gain(gain: float | None) -> str:
    return "      " if gain is None else f"{gain:+6.2f}"


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=HERE.parent.parent / "shared/data/multi30k")
    parser.add_argument("--mono", type=Path,
                        default=HERE.parent.parent / "shared/data/multi30k-task2",
                        help="Multi30k task 2's folder: train.{1..5}.TGT.gz")
    parser.add_argument("--out", type=Path, default=Path("runs/backtranslation"))
    parser.add_argument("--pair", choices=PAIRS, default="en-de",
                        help="the direction of the arms other than reverse (default en-de)")
    parser.add_argument("--parallel-share", type=float, metavar="F",
                        help="the first F of Multi30k's training pairs as the parallel data "
                             "and the target side of the rest as the monolingual text "
                             "(instead of --mono)")
    parser.add_argument("--updates", type=int, default=4000)
    parser.add_argument("--reverse-updates", type=int, metavar="N",
                        help="the reverse model's updates (default: --updates); its batch "
                             "size, dropout and lr are the ones the recipe chooses for N")
    parser.add_argument("--reverse-checkpoint", type=Path, metavar="FILE",
                        help="a trained model of the reverse direction to back-translate "
                             "with (scored as the reverse arm) instead of training one")
    parser.add_argument("--arms", nargs="+", default=["reverse", "baseline", "bt_tagged"],
                        choices=ARMS)
    add_settings_option(parser, "budget")
    parser.add_argument("--bt-weight", type=float, default=0.5,
                        help="the synthetic corpus's share of every epoch (data.corpora "
                             "weight); the real corpus gets the rest (default 0.5). A "
                             "finished arm keeps the weights it trained with")
    parser.add_argument("--finetune-share", type=float, default=0.4,
                        help="bt_finetune: the share of --updates spent on the parallel data "
                             "alone after the mixture (default 0.4)")
    parser.add_argument("--finetune-bt", choices=("sampled", "beam"), default="sampled",
                        help="bt_finetune's back-translation: sampled top-k 10 (default) "
                             "or beam 5 (OUT/bt_beam.SRC, as bt_beam's)")
    parser.add_argument("--mono-sentences", action="store_true",
                        help="back-translate only the lines written as a sentence (a "
                             "capital first letter, a final . ! or ?), as Multi30k's are; "
                             "OUT/mono.TGT keeps the choice it was made with")
    parser.add_argument("--engine", choices=("torch", "ctranslate2"),
                        default="ctranslate2" if has_ctranslate2() else "torch",
                        help="the back-translation's engine (default ctranslate2, an int8 "
                             "export, when the module imports; else torch)")
    parser.add_argument("--threads", type=int, default=2,
                        help="the back-translation's threads (default 2)")
    parser.add_argument("--seed", type=int, metavar="N",
                        help="every trained arm's seed and data.seed (default: the config's, 1)")
    parser.add_argument("--reuse-clean", type=Path, metavar="DIR",
                        help="a finished run of bench/corpora.py's clean arm (the same "
                             "--updates) to score as the baseline instead of training one")
    args = parser.parse_args()
    if not 0 < args.finetune_share < 1:
        parser.error(f"--finetune-share must be in (0, 1), got {args.finetune_share}")
    if not 0 < args.bt_weight < 1:
        parser.error(f"--bt-weight must be in (0, 1), got {args.bt_weight}")
    if args.parallel_share is not None and not 0 < args.parallel_share < 1:
        parser.error(f"--parallel-share must be in (0, 1), got {args.parallel_share}")
    if args.reverse_checkpoint is not None and not args.reverse_checkpoint.is_file():
        parser.error(f"--reverse-checkpoint {args.reverse_checkpoint}: no such file")
    return args


def prepare_synthetic(setup: Setup, args: argparse.Namespace, reverse: Path, name: str,
                      results: dict) -> None:
    """OUT/mono.TGT and its back-translation OUT/NAME.SRC by `reverse`, made unless there;
    their line counts and speed recorded in `results` (and OUT/results.json)."""
    mono, results["mono"] = mono_text(setup, args.mono.resolve(), args.mono_sentences)
    report = backtranslate(setup, reverse, mono, name, args.engine, args.threads)
    if report is not None:
        results.setdefault("backtranslation", {})[name] = report
    save_results(setup.out, results)


def main() -> None:
    args = parse_args()
    src, tgt = args.pair.split("-")
    pairs = round(MULTI30K_PAIRS * args.parallel_share) if args.parallel_share else None
    setup = Setup(args.root.resolve(), args.out.resolve(), src, tgt, pairs, args.seed)
    setup.out.mkdir(parents=True, exist_ok=True)
    results = read_results(setup.out)
    reverse_updates = args.reverse_updates or args.updates
    given = args.reverse_checkpoint.resolve() if args.reverse_checkpoint else None
    arms = sorted(set(args.arms) | ({"reverse"} if given else set()), key=ARMS.index)
    for arm in arms:  # the reverse model first
        run_dir = setup.out / arm
        updates = reverse_updates if arm == "reverse" else args.updates
        a_src, a_tgt = setup.languages(arm)
        if arm == "reverse" and given:
            results[arm] = {"pair": f"{a_src}-{a_tgt}", "checkpoint": str(given),
                            "test": score_checkpoints({"given": given}, setup.out, setup.root,
                                                      a_src, a_tgt)}
            save_results(setup.out, results)
            continue
        if arm == "baseline" and args.reuse_clean:
            run_dir = args.reuse_clean.resolve()
            if not finished(run_dir, args.updates):
                raise SystemExit(f"--reuse-clean {run_dir}: not a run finished after "
                                 f"{args.updates} updates")
        done = (finished(run_dir, finetune_updates(args.updates, args.finetune_share))
                if arm == "bt_finetune" else finished(run_dir, args.updates))
        synthetic = synthetic_name(arm, args.finetune_bt)
        if arm.startswith("bt_") and not done:
            if not given and not finished(setup.out / "reverse", reverse_updates):
                raise SystemExit(f"{arm} needs the reverse model trained for "
                                 f"{reverse_updates} updates: run --arms reverse first")
            prepare_synthetic(setup, args, given or average(setup.out / "reverse"), synthetic,
                              results)
        if arm == "bt_finetune":
            seconds = train_finetune(setup, updates, args.finetune_share, args.bt_weight,
                                     args.settings, synthetic)
        else:
            seconds = train(run_dir, setup.root, updates,
                            arm_overrides(arm, setup, args.bt_weight, updates, synthetic),
                            setup.out / f"{arm}.log", args.settings)
        cleaning = run_dir / "cleaning.txt"
        results[arm] = {
            "updates": updates, "settings": args.settings, "seed": args.seed,
            "pair": f"{a_src}-{a_tgt}",
            "parallel_pairs": pairs, "run_dir": str(run_dir),
            "weights": corpus_weights(run_dir), **times(run_dir, seconds, results.get(arm, {})),
            "test": score(run_dir, setup.root, a_src, a_tgt),
            "cleaning": cleaning.read_text() if cleaning.is_file() else None}
        if arm == "bt_finetune":
            stage = setup.out / "bt_pretrain"
            results[arm]["pretrain"] = {
                "updates": updates - finetune_updates(updates, args.finetune_share),
                "train_s": training_seconds(stage), "weights": corpus_weights(stage)}
        results["gains"] = gains(results)
        save_results(setup.out, results)
        print(arm, json.dumps(results[arm]["test"]), flush=True)
    print_table(results)


if __name__ == "__main__":
    main()
