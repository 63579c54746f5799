"""Does a small student learn Multi30k en->de better from a teacher's translations
(sequence-level knowledge distillation) than from the references?

    python bench/distill.py --root ../shared/data/multi30k --out runs/distill \\
        --updates 4000 [--teacher runs/backtranslation/baseline/avg5.pt] \\
        --arms teacher student_ref student_kd

A student of at most a quarter of the teacher's parameters trains on the teacher's
translations of the training sources; the same student trains on the references beside it.
The teacher is the recipe model (Transformer-Tiny: d 128, FFN 256, 4+4 layers, 4 heads, 8,000
joint pieces, ~2.35M parameters): `--teacher CHECKPOINT` (e.g. bench/backtranslation.py's
baseline arm's avg5.pt), or the `teacher` arm trained here. `transformer distill` translates
Multi30k's training sources with it (beam 8) and keeps, of each line's 8 best, the one of
highest sentence chrF against the reference: OUT/distilled.de (its chrF line and
sentences/s are recorded). Every model trains the recipe for the same number of updates of
the same size (bench/corpora.py's `recipe`; `--settings budget`, the default: the settings
the recipe chooses for that many updates) and validates on Multi30k's val.

Arms (`--arms`, run one after another in this order, never two trainings at once; default
all three):
- `teacher`: the recipe, en->de (not trained when `--teacher` is given; scored either way);
- `student_ref`: the student on Multi30k's references (`data=multi30k`);
- `student_kd`: the student on (train.en, OUT/distilled.de) (`data.corpora`, `filters:
  none`).
The student (`STUDENT`): d 64, FFN 256, 3+2 layers, 2 heads, 4,000 joint pieces, ~0.54M
parameters (23% of the teacher). Both counts are read from the checkpoints; before a student
trains, the planned count is checked against the teacher's: over 25% stops the script.

Scores on test_2016_flickr: the average of the last 5 numbered checkpoints (a given teacher
as given), beam 5 and greedy, cased sacreBLEU and chrF; the gain of `student_kd` over
`student_ref`, and each model's beam-vs-greedy gap (a distilled student is expected to lose
less by decoding greedily: Kim and Rush 2016). Speed: each model's CTranslate2 int8 export
(OUT/ARM/ct2-int8; a given teacher's in OUT/given_teacher) translates the 1,000 test
sentences in this process, `--threads` 2, beam 5 and greedy, the best of 3 after a warm-up
(BLEU of those outputs too); skipped with a note when the ctranslate2 module does not
import.

A finished arm (train.log's last line: stopped after `--updates` updates, with
checkpoints/checkpoint_last.pt) is scored again without training; a finished distillation
(OUT/distilled.de present) is not redone. Results go to OUT/results.json (parameters, test
scores, speeds, training seconds, the distillation's report) and are printed as a table.
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from backtranslation import command_report, export_int8, has_ctranslate2, times
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
)
from timing import timed, timed_passes

HERE = Path(__file__).resolve().parent
ARMS = ("teacher", "student_ref", "student_kd")
STUDENT = ["model.num_hiddens=64", "model.ffn_num_hiddens=256", "model.num_encoder_layers=3",
           "model.num_decoder_layers=2", "model.num_heads=2", "data.vocab_size=4000"]
MAX_SHARE = 0.25  # the student's parameters / the teacher's
NBEST = 8
BEAMS = {"beam5": 5, "greedy": 1}
REPEATS = 3


def parameters(checkpoint: Path) -> int:
    """The parameters of the model in `checkpoint` (a file or a run directory)."""
    from transformer.run.checkpoint import (
        load_checkpoint,
        model_from_checkpoint,
        resolve_checkpoint,
    )

    path = resolve_checkpoint(checkpoint)
    return model_from_checkpoint(load_checkpoint(path), path).num_parameters()


def planned_parameters(overrides: list[str]) -> int:
    """The parameters of the model `transformer train` builds with `overrides`, its
    vocabulary of `data.vocab_size` pieces."""
    from transformer.model.transformer import Transformer
    from transformer.run.compose import compose_config

    config = compose_config(overrides)
    size = config.data.vocab_size
    return Transformer(config.model.to_model_config(size, size, config.data.joint_vocab)
                       ).num_parameters()


def check_student(teacher: Path | None, updates: int) -> None:
    """Stop before training a student of more than `MAX_SHARE` of the teacher's parameters
    (the teacher's from its checkpoint, else the recipe's plan)."""
    planned = planned_parameters(recipe(updates) + STUDENT)
    of = parameters(teacher) if teacher else planned_parameters(recipe(updates))
    print(f"student: {planned:,} parameters planned, {planned / of:.1%} of the teacher's "
          f"{of:,}", flush=True)
    if planned > MAX_SHARE * of:
        raise SystemExit(f"the student has more than {MAX_SHARE:.0%} of the teacher's "
                         f"parameters: change STUDENT")


def distill(out: Path, root: Path, teacher: Path, threads: int) -> dict | None:
    """OUT/distilled.de: the teacher's best of `NBEST` by chrF for every training source ->
    its report, or None when it was there already."""
    output = out / "distilled.de"
    if output.is_file():
        return None
    log = out / "distill.log"
    seconds, _ = timed(lambda: run(
        ["transformer", "distill", "--checkpoint", str(teacher), "--source",
         str(root / "train.en.gz"), "--reference", str(root / "train.de.gz"), "--output",
         str(output), "--nbest", str(NBEST), "--threads", str(threads)], log))
    report = command_report(log)
    chrf = re.search(r"chosen ([\d.]+), the teacher's 1-best ([\d.]+)", report["report"])
    return {"teacher": str(teacher), "wall_s": round(seconds), **report,
            "chrf_chosen": float(chrf[1]), "chrf_teacher_1best": float(chrf[2])}


def score(checkpoint: Path, folder: Path, root: Path) -> dict:
    """Test BLEU and chrF of `checkpoint`, beam 5 and greedy."""
    source = test_source(root, folder)
    refs = read_gz(root / "test_2016_flickr.de.gz")
    return {name: bleu_chrf(translate(checkpoint, source, folder / f"test.{name}.de",
                                      "--beam-size", str(beam)), refs)
            for name, beam in BEAMS.items()}


def speed(checkpoint: Path, folder: Path, root: Path, threads: int) -> dict:
    """Sentences/s (and BLEU) of the int8 export of `checkpoint` on the test set, per
    search, the best of `REPEATS` runs after a warm-up."""
    from transformer.deploy.engines import load_translator

    export = export_int8(checkpoint, folder / "ct2-int8")
    translator = load_translator(export, "ctranslate2", device="cpu", threads=threads)
    sources = read_gz(root / "test_2016_flickr.en.gz")
    refs = read_gz(root / "test_2016_flickr.de.gz")
    translator.translate(sources[:8])
    out = {}
    for name, beam in BEAMS.items():
        seconds, hyps = timed_passes(
            lambda beam=beam: translator.translate(sources, beam_size=beam), REPEATS)
        out[name] = {"sentences_per_s": round(len(sources) / min(seconds), 1),
                     **bleu_chrf(hyps, refs)}
    return out


def teacher_checkpoint(given: Path | None, out: Path, updates: int) -> Path | None:
    """The teacher's checkpoint: `--teacher`, or the teacher arm's average once finished."""
    if given is not None:
        return given.resolve()
    return average(out / "teacher") if finished(out / "teacher", updates) else None


def summary(results: dict) -> dict:
    """Shares of the teacher's parameters, the distillation's gain, the greedy gaps."""
    models = {arm: results[arm] for arm in ARMS if arm in results}
    out = {f"{arm}_gap": round(r["test"]["beam5"]["bleu"] - r["test"]["greedy"]["bleu"], 2)
           for arm, r in models.items()}
    if "teacher" in models:
        out.update({f"{arm}_share": round(r["parameters"] / models["teacher"]["parameters"], 4)
                    for arm, r in models.items() if arm != "teacher"})
    if "student_ref" in models and "student_kd" in models:
        out.update({f"kd_gain_{name}": round(models["student_kd"]["test"][name]["bleu"]
                                             - models["student_ref"]["test"][name]["bleu"], 2)
                    for name in BEAMS})
    return out


def print_table(results: dict) -> None:
    print(f"\n{'model':<12} {'parameters':>10} {'beam5 BLEU':>12} {'chrF':>5} "
          f"{'greedy BLEU':>13} {'chrF':>5} {'gap':>6} {'int8 sent/s beam5':>17} "
          f"{'greedy':>6} {'train s':>9}")
    for arm in ARMS:
        if arm not in results:
            continue
        r = results[arm]
        beam, greedy, fast = r["test"]["beam5"], r["test"]["greedy"], r.get("speed")
        speeds = (f"{fast['beam5']['sentences_per_s']:>17.1f} "
                  f"{fast['greedy']['sentences_per_s']:>6.1f}" if fast else f"{'-':>17} {'-':>6}")
        print(f"{arm:<12} {r['parameters']:>10,} {beam['bleu']:>12.2f} {beam['chrf']:>5.2f} "
              f"{greedy['bleu']:>13.2f} {greedy['chrf']:>5.2f} "
              f"{beam['bleu'] - greedy['bleu']:>6.2f} {speeds} {r.get('train_s') or '-':>9}")
    s = results.get("summary", {})
    if "student_kd_share" in s:
        share = s["student_kd_share"]
        over = f", over the {MAX_SHARE:.0%} it should be at most" if share > MAX_SHARE else ""
        print(f"student parameters / teacher's: {share:.1%}{over}")
    if "kd_gain_beam5" in s:
        print(f"student_kd - student_ref: {s['kd_gain_beam5']:+.2f} BLEU beam 5, "
              f"{s['kd_gain_greedy']:+.2f} greedy")
    if "distillation" in results:
        d = results["distillation"]
        print(f"distillation: {d['lines']:,} lines, {d['sentences_per_s']:.1f} sentences/s; "
              f"mean sentence chrF: chosen {d['chrf_chosen']}, the teacher's 1-best "
              f"{d['chrf_teacher_1best']}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, default=HERE.parent.parent / "shared/data/multi30k")
    parser.add_argument("--out", type=Path, default=Path("runs/distill"))
    parser.add_argument("--updates", type=int, default=4000)
    parser.add_argument("--arms", nargs="+", default=list(ARMS), choices=ARMS)
    add_settings_option(parser, "budget")
    parser.add_argument("--teacher", type=Path, metavar="CHECKPOINT",
                        help="an en->de recipe model (a checkpoint or run directory) to distill "
                             "instead of training the teacher arm")
    parser.add_argument("--threads", type=int, default=2,
                        help="threads of the distillation and of the speed measurement "
                             "(default 2)")
    args = parser.parse_args()
    root, out = args.root.resolve(), args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    results = read_results(out)
    fast = has_ctranslate2()
    if not fast:
        print("note: ctranslate2 does not import: no int8 speeds (pip install "
              "'ctranslate2>=4')", flush=True)
    if any(arm.startswith("student") for arm in args.arms):
        check_student(teacher_checkpoint(args.teacher, out, args.updates), args.updates)
    for arm in sorted(set(args.arms), key=ARMS.index):  # the teacher first
        seconds = None
        if arm == "teacher" and args.teacher is not None:
            folder = out / "given_teacher"  # its outputs and export
            folder.mkdir(exist_ok=True)
        else:
            folder = out / arm
            overrides = STUDENT if arm.startswith("student") else []
            if arm == "student_kd":
                teacher = teacher_checkpoint(args.teacher, out, args.updates)
                if teacher is None and not finished(folder, args.updates):
                    raise SystemExit("student_kd needs the teacher: --teacher CHECKPOINT, or "
                                     "run --arms teacher first")
                report = None if finished(folder, args.updates) else distill(
                    out, root, teacher, args.threads)
                if report is not None:
                    results["distillation"] = report
                    save_results(out, results)
                entry = corpus_entry("distilled", root / "train.en.gz", out / "distilled.de",
                                     filters="none")
                overrides = [*overrides, f"data.corpora=[{entry}]"]
            seconds = train(folder, root, args.updates, overrides, out / f"{arm}.log",
                            args.settings)
        checkpoint = teacher_checkpoint(args.teacher, out, args.updates) if arm == "teacher" \
            else average(folder)
        results[arm] = {
            "updates": args.updates, "settings": args.settings, "checkpoint": str(checkpoint),
            "parameters": parameters(checkpoint), **times(folder, seconds, results.get(arm, {})),
            "test": score(checkpoint, folder, root),
            "speed": speed(checkpoint, folder, root, args.threads) if fast else None}
        results["summary"] = summary(results)
        save_results(out, results)
        print(arm, json.dumps(results[arm]["test"]), flush=True)
    print_table(results)


if __name__ == "__main__":
    main()
