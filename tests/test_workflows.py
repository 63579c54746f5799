"""`transformer backtranslate` and `transformer distill`: the synthetic corpus line for line
as `transformer translate` writes it, an interrupted back-translation resumed to the same
file, its corpus entry a valid config, the distilled line the n-best entry with the highest
sentence chrF, and bad input refused in one line. All on the random small model of
conftest.py (no training)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from conftest import assert_reported, run_command
from sacrebleu import sentence_chrf

from transformer import cli
from transformer.decoding.translator import Translator
from transformer.run.checkpoint import inference_checkpoint, save_checkpoint
from transformer.run.compose import CONFIG_DIR, compose_config
from transformer.run.config import TrainConfig
from transformer.tools.workflows import chunk_seed, keep_mask, work_files

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def read_lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").removesuffix("\n").split("\n")


@pytest.fixture
def mono(multi30k_lines, tmp_path) -> Path:
    """23 German lines, one of them empty: 5 chunks of 5 lines (the last of 3)."""
    lines = multi30k_lines("val.de.gz")[:22]
    return write_lines(tmp_path / "mono.de", lines[:4] + [""] + lines[4:])


@pytest.fixture(scope="module")
def en_de_random(random_checkpoint, tmp_path_factory) -> Path:
    """The random model with a training config that records its languages: en -> de."""
    translator = Translator.load(random_checkpoint, device="cpu")
    path = tmp_path_factory.mktemp("en_de_random") / "model.pt"
    save_checkpoint(inference_checkpoint(translator.model, translator.tokenizers,
                                         training_config=TrainConfig()), path)
    return path


def command(argv: list[str], capsys) -> tuple[int, str, str]:
    """`transformer ARGV` in this process: (exit status, stdout, stderr)."""
    status = cli.main([str(arg) for arg in argv])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def backtranslate(checkpoint: Path, mono: Path, out: Path, *options: str) -> list[str]:
    return ["backtranslate", "--checkpoint", checkpoint, "--input", mono, "--output", out,
            "--device", "cpu", "--chunk-lines", "5", *options]


# ---- back-translation -----------------------------------------------------------------------


def test_backtranslation_is_translate_line_for_line_and_prints_its_corpus_entry(
        random_checkpoint, mono, tmp_path, capsys):
    out, translated = tmp_path / "bt.en", tmp_path / "translate.en"
    status, fragment, err = command(
        backtranslate(random_checkpoint, mono, out, "--beam-size", "1"), capsys)
    assert status == 0, err
    assert f"wrote 23 lines to {out} in" in err and "sentences/s" in err
    assert command(["translate", "--checkpoint", random_checkpoint, "--input", mono,
                    "--output", translated, "--beam-size", "1", "--chunk-lines", "5",
                    "--device", "cpu"], capsys)[0] == 0
    assert len(read_lines(out)) == 23 and read_lines(out)[4] == ""
    assert out.read_bytes() == translated.read_bytes()
    assert not any(path.exists() for path in work_files(out))
    assert json.dumps(str(out.resolve())) in fragment
    assert json.dumps(str(mono.resolve())) in fragment and '"<bt>"' in fragment


def test_an_interrupted_backtranslation_resumes_to_the_same_file(random_checkpoint, mono,
                                                                 tmp_path, monkeypatch,
                                                                 capsys):
    """Sampling (top-k 10, seed 1 by default): interrupted after 2 chunks of 5 lines, the
    run goes on after line 10 and writes what an uninterrupted run writes; other settings
    are refused in one line."""
    straight, resumed = tmp_path / "straight.en", tmp_path / "resumed.en"
    assert command(backtranslate(random_checkpoint, mono, straight), capsys)[0] == 0
    greedy = tmp_path / "greedy.en"
    assert command(backtranslate(random_checkpoint, mono, greedy, "--beam-size", "1"),
                   capsys)[0] == 0
    assert straight.read_bytes() != greedy.read_bytes()  # it samples
    assert chunk_seed(1, 0) != chunk_seed(1, 1)

    translated: list[int] = []  # lines per call
    original = Translator.translations

    def interrupted(self, lines, *args, **kwargs):
        if len(translated) == 2:
            raise KeyboardInterrupt
        translated.append(len(lines))
        return original(self, lines, *args, **kwargs)

    monkeypatch.setattr(Translator, "translations", interrupted)
    assert command(backtranslate(random_checkpoint, mono, resumed), capsys)[0] == 130
    partial, record = work_files(resumed)
    assert not resumed.exists() and json.loads(record.read_text())["lines"] == 10
    assert len(read_lines(partial)) == 10
    with open(partial, "ab") as f:
        f.write(b"half a chunk")  # what a crash during the next chunk's write leaves

    status, _, err = command(backtranslate(random_checkpoint, mono, resumed, "--seed", "2"),
                             capsys)
    assert_reported(status, err)
    assert status == 1 and str(record) in err and "seed (1 then, 2 now)" in err

    translated.clear()
    monkeypatch.setattr(Translator, "translations", lambda self, lines, *args, **kwargs: (
        translated.append(len(lines)) or original(self, lines, *args, **kwargs)))
    status, _, err = command(backtranslate(random_checkpoint, mono, resumed), capsys)
    assert status == 0, err
    assert translated == [5, 5, 3] and "resuming after line 10" in err
    assert resumed.read_bytes() == straight.read_bytes()
    assert not partial.exists() and not record.exists()


def test_the_corpus_entry_is_a_valid_preset(en_de_random, mono, tmp_path, capsys):
    """Written by --config-fragment, with the languages given (and checked against the
    model's: it reads en and writes de), it composes as an experiment preset into a run's
    config with the tagged corpus; tags reaching batches is tests/test_corpora.py's."""
    out, fragment = tmp_path / "bt.de", tmp_path / "bt.yaml"
    status, stdout, err = command(backtranslate(
        en_de_random, mono, out, "--beam-size", "1", "--src-lang", "de", "--tgt-lang", "en",
        "--weight", "0.5", "--config-fragment", fragment), capsys)
    assert status == 0 and stdout == "", err
    configs = shutil.copytree(CONFIG_DIR, tmp_path / "configs")
    shutil.copy(fragment, configs / "experiment" / "bt.yaml")
    data = compose_config(["experiment=bt"], config_dir=configs).data
    [corpus] = data.corpora
    assert (corpus.name, corpus.tag, corpus.weight) == ("bt", "<bt>", 0.5)
    assert Path(corpus.src) == out.resolve() and Path(corpus.tgt) == mono.resolve()
    assert (corpus.src_lang, corpus.tgt_lang) == ("de", "en")
    assert data.reserved_tags() == ["<bt>"]


@pytest.mark.parametrize("options, message", [
    (["--tgt-lang", "de"], "the model translates from en, not from --tgt-lang de"),
    (["--src-lang", "en"], "the model translates into de, not into --src-lang en"),
    (["--src-lang", "de", "--target-lang", "fr"], "--target-lang fr is not --src-lang de"),
    (["--tag", "bt"], "data.corpora[bt].tag must look like <name>"),
    (["--beam-size", "2", "--seed", "3"], "--seed seeds sampling"),
])
def test_backtranslation_refuses_bad_options_in_one_line(en_de_random, mono, tmp_path,
                                                         options, message):
    out = tmp_path / "bt.en"
    status, err = run_command([str(a) for a in backtranslate(en_de_random, mono, out,
                                                             *options)])
    assert_reported(status, err)
    assert status == 1 and message in err and not out.exists()


def test_backtranslation_refuses_an_empty_input(random_checkpoint, tmp_path):
    empty = write_lines(tmp_path / "mono.de", [])
    status, err = run_command([str(a) for a in backtranslate(random_checkpoint, empty,
                                                             tmp_path / "bt.en")])
    assert_reported(status, err)
    assert status == 1 and f"{empty} is empty" in err


# ---- distillation ---------------------------------------------------------------------------


@pytest.fixture
def parallel(multi30k_lines, tmp_path) -> tuple[Path, Path]:
    return (write_lines(tmp_path / "train.en", multi30k_lines("val.en.gz")[:12]),
            write_lines(tmp_path / "train.de", multi30k_lines("val.de.gz")[:12]))


def distill(checkpoint: Path, source: Path, reference: Path, out: Path,
            *options: str) -> list[str]:
    return [str(a) for a in ["distill", "--checkpoint", checkpoint, "--source", source,
                             "--reference", reference, "--output", out, "--nbest", "4",
                             "--device", "cpu", *options]]


def test_distill_keeps_the_nbest_entry_with_the_highest_chrf(random_checkpoint, parallel,
                                                             tmp_path, capsys):
    source, reference = parallel
    sources, references = read_lines(source), read_lines(reference)
    nbest = Translator.load(random_checkpoint, device="cpu").translations(
        sources, beam_size=4, nbest=4)
    scores = [[sentence_chrf(h.text, [ref]).score for h in hyps]
              for hyps, ref in zip(nbest, references, strict=True)]
    best = [max(range(4), key=line.__getitem__) for line in scores]
    chosen = [hyps[i].text for hyps, i in zip(nbest, best, strict=True)]
    assert chosen != [hyps[0].text for hyps in nbest]  # not just the teacher's 1-best

    out = tmp_path / "distilled.de"
    status, _, err = command(distill(random_checkpoint, source, reference, out), capsys)
    assert status == 0, err
    assert read_lines(out) == chosen
    mean = sum(line[i] for line, i in zip(scores, best, strict=True)) / 12
    assert f"chosen {mean:.1f}, the teacher's 1-best" in err

    kept_src, kept_out = tmp_path / "kept.en", tmp_path / "kept.de"
    status, _, err = command(distill(random_checkpoint, source, reference, kept_out,
                                     "--drop-worst", "0.5", "--output-source", kept_src),
                             capsys)
    assert status == 0, err
    worst = sorted(range(12), key=lambda i: scores[i][best[i]])[:6]
    kept = [i for i in range(12) if i not in worst]
    assert read_lines(kept_out) == [chosen[i] for i in kept]
    assert read_lines(kept_src) == [sources[i] for i in kept]
    assert f"wrote 6 lines to {kept_out}" in err


def test_keep_mask_drops_the_lowest_share():
    assert keep_mask([3.0, 1.0, 2.0, 1.0], 0.5).tolist() == [True, False, True, False]
    assert keep_mask([3.0, 1.0, 2.0], 0.0).all()


@pytest.mark.parametrize("case, message", [
    ("empty", "is empty"),
    ("mismatched", "has 12 lines but"),
    ("--drop-worst 1.0", "--drop-worst must be in [0, 1), got 1.0"),
    ("--drop-worst -0.1", "--drop-worst must be in [0, 1), got -0.1"),
    ("--drop-worst 0.5", "give --output-source FILE"),
    ("same file", "--output-source and --source name the same file"),
])
def test_distill_refuses_bad_input_in_one_line(random_checkpoint, parallel, tmp_path, case,
                                               message):
    source, reference = parallel
    options = case.split() if case.startswith("--") else []
    if case == "empty":
        source, reference = (write_lines(tmp_path / name, []) for name in ("e.en", "e.de"))
    if case == "same file":
        options = ["--output-source", str(source)]
    if case == "mismatched":
        reference = write_lines(tmp_path / "short.de", read_lines(reference)[:11])
        message = f"{source} has 12 lines but {reference} has 11 lines"
    out = tmp_path / "out.de"
    status, err = run_command(distill(random_checkpoint, source, reference, out, *options))
    assert_reported(status, err)
    assert status == 1 and message in err and not out.exists()

