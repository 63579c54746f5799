"""Translator API and `transformer translate`: loading, line alignment, n-best, BLEU, errors;
choosing checkpoints and alpha on validation data (`transformer tune-decoding`).

Two checkpoints are built per test run: a random small model with a SentencePiece model
trained on Multi30k (for averaging, long lines, scores), and a tiny model trained here on
the copy task (its translations must equal its inputs, which makes alignment visible).
"""

from __future__ import annotations

import io
import logging
import random
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch
from conftest import copy_sentence
from outputs import scored

from transformer.cli import translate as translate_command
from transformer.cli import tune_decoding as tune_decoding_command
from transformer.cli.reports import bleu_report, paper_protocol, translate_lines
from transformer.data.store import ParallelCorpus
from transformer.data.text import ParallelText
from transformer.data.tokenizer import EOS_ID, PAD_ID, Tokenizer, TokenizerPair
from transformer.decoding.alignment import format_alignment, word_alignment
from transformer.decoding.request import AlignmentOptions, DecodingRequest
from transformer.decoding.search import beam_search, length_penalty, sample_search
from transformer.decoding.translator import Translator
from transformer.errors import CheckpointError
from transformer.model import layers
from transformer.model.layers import Linear
from transformer.model.loss import teacher_forced_loss
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run.checkpoint import inference_checkpoint, save_checkpoint, stored_decoding
from transformer.run.config import DecodingSettings
from transformer.tools.evaluation import (
    EvaluationSet,
    best_trial,
    checkpoints_within,
    tune_decoding,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "translate.py"




def save(model: Transformer, tokenizer: Tokenizer, path: Path) -> Path:
    save_checkpoint(inference_checkpoint(model, TokenizerPair(tokenizer, tokenizer),
                                         training_config=None), path)
    return path


# ---- fixtures -------------------------------------------------------------------------------



@pytest.fixture(scope="module")
def multi30k_small_tokenizer(multi30k_small_tokenizer_path) -> Tokenizer:
    return Tokenizer.load(multi30k_small_tokenizer_path)


def random_model(vocab: int, seed: int) -> Transformer:
    torch.manual_seed(seed)
    return Transformer(ModelConfig(
        src_vocab_size=vocab, tgt_vocab_size=vocab, num_hiddens=32, ffn_num_hiddens=64,
        num_heads=4, num_encoder_layers=2, num_decoder_layers=2, max_positions=64))


@pytest.fixture(scope="module")
def random_runs(multi30k_small_tokenizer, tmp_path_factory) -> list[Path]:
    """Two run directories with random models of the same shape (different weights)."""
    runs = []
    for seed in (0, 1):
        run = tmp_path_factory.mktemp(f"run{seed}")
        model = random_model(multi30k_small_tokenizer.vocab_size, seed)
        save(model, multi30k_small_tokenizer, run / "checkpoints" / "checkpoint_best.pt")
        runs.append(run)
    return runs


@pytest.fixture(scope="module")
def copy_translator(copy_checkpoint) -> Translator:
    return Translator.load(copy_checkpoint, device="cpu")


@pytest.fixture(scope="module")
def copy_inputs() -> list[str]:
    rng = random.Random(123)
    return [copy_sentence(rng) for _ in range(30)]


# ---- the Python API -------------------------------------------------------------------------

def test_copy_model_translates_its_inputs_exactly_with_beam_4(copy_translator, copy_inputs):
    assert copy_translator.translate(copy_inputs, beam_size=4) == copy_inputs


def test_copy_model_beam_1_is_greedy(copy_translator, copy_inputs):
    pieces = [copy_translator.tokenizers.src.encode(line) + [EOS_ID] for line in copy_inputs]
    longest = max(map(len, pieces))
    src = torch.tensor([p + [PAD_ID] * (longest - len(p)) for p in pieces])
    lens = torch.tensor([len(p) for p in pieces])
    greedy = [h.tokens for h in sample_search(copy_translator.model, src, lens)]
    beam = beam_search(copy_translator.model, src, lens, DecodingRequest(beam_size=1))
    assert [h[0].tokens for h in beam] == greedy
    assert greedy == [p[:-1] for p in pieces]


def test_translate_returns_strings_and_translations_scores_and_nbest(random_runs):
    translator = Translator.load(random_runs[0], device="cpu")
    lines = ["A man rides a bike.", "", "Zwei Hunde spielen im Schnee.", "   "]
    out = translator.translate(lines, beam_size=3, max_len_b=3)
    assert len(out) == 4 and all(isinstance(s, str) for s in out)
    assert out[1] == "" and out[3] == ""
    best = scored(translator.translations(lines, beam_size=3, max_len_b=3))
    assert [s[0][0] for s in best] == out and all(len(s) == 1 for s in best)
    nbest = scored(translator.translations(lines, beam_size=3, nbest=3, max_len_b=3,
                                           max_tokens=8))
    assert [len(s) for s in nbest] == [3, 3, 3, 3]
    for s in nbest:
        assert [score for _, score in s] == sorted((score for _, score in s), reverse=True)
    # the 1-best does not depend on nbest (nor on batching)
    for s, t in zip(nbest, best, strict=True):
        assert s[0][0] == t[0][0] and s[0][1] == pytest.approx(t[0][1], abs=1e-4)
    assert nbest[1] == [("", 0.0)] * 3


@pytest.mark.parametrize("ensemble", [False, True], ids=["one model", "ensemble"])
def test_loaded_weights_are_stored_transposed_for_mkl_with_the_same_translations(
        en_de_checkpoint, multi30k_lines, tuning, ensemble):
    """Where the tuning table says MKL multiplies (in, out) weights faster, `Translator.load`
    stores its models' linear weights so (`layers.transpose_linear_weights`); the trained
    model translates as it does from the usual layout: the same texts one line at a time and
    in a batch, the same scores within float32 rounding."""
    lines = multi30k_lines("val.en.gz")[:12]
    checkpoints = [en_de_checkpoint] * (2 if ensemble else 1)
    results, layouts = {}, {}
    for transposed in (False, True):
        tuning(float32_library="blas", transposed_weights=transposed)
        translator = Translator.load(checkpoints, device="cpu", ensemble=ensemble)
        linears = [m for m in translator.model.modules() if type(m) is Linear]
        layouts[transposed] = {m.weight.is_contiguous() for m in linears}
        results[transposed] = (
            [translator.translate([line])[0] for line in lines],
            [(t.text, t.score) for line in translator.translations(lines, nbest=2)
             for t in line])
    assert layouts == {False: {True}, True: {False}}
    assert results[True][0] == results[False][0]
    assert [text for text, _ in results[True][1]] == [text for text, _ in results[False][1]]
    assert [score for _, score in results[True][1]] == pytest.approx(
        [score for _, score in results[False][1]], abs=1e-5)


def test_a_loaded_translator_decodes_frozen_with_its_output_projection_packed(
        en_de_checkpoint, multi30k_lines, tuning):
    """`Translator.load` freezes its model (no gradients, the same parameter count), so
    where oneDNN multiplies float32 it reads the output projection from a packed copy
    (`layers._packed_for_onednn`); the model translates as it does unfrozen, through the
    plain weight: the same texts, the same scores within float32 rounding."""
    tuning(float32_library="onednn", transposed_weights=False)
    lines = multi30k_lines("val.en.gz")[:12]
    translator = Translator.load(en_de_checkpoint, device="cpu")
    model = translator.model
    tuning(float32_onednn_min_outputs=model.output_projection.weight.shape[0])
    assert not any(p.requires_grad for p in model.parameters())
    assert translator.num_parameters == model.num_parameters() > 0
    results = {}
    for frozen in (True, False):
        model.requires_grad_(not frozen)
        results[frozen] = [(t.text, t.score) for line in translator.translations(lines, nbest=2)
                           for t in line]
        assert (model.output_projection.weight in layers._PACKED) == frozen
        layers._PACKED.clear()
    assert [text for text, _ in results[True]] == [text for text, _ in results[False]]
    assert [score for _, score in results[True]] == pytest.approx(
        [score for _, score in results[False]], abs=1e-5)


def test_checkpoint_decoding_settings_are_the_defaults(random_runs, tmp_path, capsys):
    """A checkpoint that stores decoding settings (tune_decoding.py's chosen.pt) translates
    with them unless the caller passes others; translate.py says which it used."""
    state = torch.load(random_runs[0] / "checkpoints" / "checkpoint_best.pt", weights_only=True)
    chosen = tmp_path / "chosen.pt"
    save_checkpoint({**state, "decoding": {"alpha": 2.5, "beam_size": 3, "valid_bleu": 12.0}},
                    chosen)
    translator = Translator.load(chosen, device="cpu")
    assert translator.decoding == DecodingSettings(beam_size=3, alpha=2.5)
    lines = ["A man rides a bike.", "Zwei Hunde spielen im Schnee.", "A red car."]
    stored = scored(translator.translations(lines, max_len_b=5))
    plain = Translator.load(random_runs[0], device="cpu")
    assert plain.decoding == DecodingSettings()
    assert stored == scored(plain.translations(lines, beam_size=3, alpha=2.5, max_len_b=5))
    default_scores = [s[0][1] for s in scored(plain.translations(lines, max_len_b=5))]
    assert default_scores != [s[0][1] for s in stored]  # alpha 1 vs 2.5: other scores

    src = write_lines(tmp_path / "in.txt", lines)
    args = ["--checkpoint", str(chosen), "--input", str(src), "--output",
            str(tmp_path / "out.txt"), "--max-len-b", "5", "--device", "cpu"]
    assert translate_command.main(args) == 0
    assert "decoding: beam 3 (from the checkpoint), alpha 2.5 (from the checkpoint), " \
           "max length 1.5 * source + 5" in capsys.readouterr().err
    written = lambda: (tmp_path / "out.txt").read_text().split("\n")[:-1]
    assert written() == [s[0][0] for s in stored]
    assert translate_command.main(args + ["--alpha", "1", "--beam-size", "5"]) == 0
    assert "decoding: beam 5, alpha 1, max length" in capsys.readouterr().err
    assert written() == plain.translate(lines, max_len_b=5)
    save_checkpoint({**state, "decoding": {"alpha": -1.0}}, tmp_path / "bad.pt")
    with pytest.raises(CheckpointError, match="invalid decoding settings"):
        Translator.load(tmp_path / "bad.pt")


def test_averaging_two_checkpoints_gives_the_mean(random_runs):
    a, b = (Translator.load(run, device="cpu").model.state_dict() for run in random_runs)
    avg = Translator.load(random_runs, device="cpu").model.state_dict()
    for name, value in avg.items():
        torch.testing.assert_close(value, (a[name] + b[name]) / 2)


def test_run_dir_falls_back_to_last_checkpoint(random_runs, tmp_path, caplog):
    (tmp_path / "checkpoints").mkdir()
    best = random_runs[0] / "checkpoints" / "checkpoint_best.pt"
    (tmp_path / "checkpoints" / "checkpoint_last.pt").write_bytes(best.read_bytes())
    with caplog.at_level(logging.WARNING):
        Translator.load(tmp_path, device="cpu")
    assert "no checkpoint_best.pt" in caplog.text
    (tmp_path / "empty").mkdir()
    with pytest.raises(CheckpointError, match="no checkpoint_best.pt or checkpoint_last.pt"):
        Translator.load(tmp_path / "empty", device="cpu")


def test_long_line_is_truncated_with_a_warning(random_runs, caplog):
    translator = Translator.load(random_runs[0], device="cpu")
    long_line = " ".join(["Ein Mann fährt Fahrrad."] * 30)  # far beyond 63 source tokens
    with caplog.at_level(logging.WARNING):
        out = translator.translate(["Hallo.", long_line], beam_size=2, line_offset=10)
    assert len(out) == 2
    assert "line 12 has" in caplog.text and "limit of 63" in caplog.text


def test_bleu_report_matches_the_sacrebleu_cli(tmp_path):
    hyps = ["A man rides a bike .", "Two dogs play in snow.", "", "a cat"]
    refs = ["A man is riding a bike.", "Two dogs are playing in the snow.", "Hi", "a cat"]
    (tmp_path / "hyp.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(tmp_path / "ref.txt"), "-i",
         str(tmp_path / "hyp.txt"), "-m", "bleu", "chrf", "--format", "text"],
        capture_output=True, text=True, check=True)
    assert bleu_report(hyps, refs) == cli.stdout.splitlines()


@pytest.mark.parametrize("lang", ["de", "en", "fr"])
def test_paper_protocol_reproduces_the_datasets_tokenized_references(full_multi30k,
                                                                     full_multi30k_lines, lang):
    """Our lowercase + sacremoses pipeline against the dataset's own Perl-made files."""
    for split in ("test_2016_flickr", "val"):
        raw = full_multi30k_lines(f"{split}.{lang}.gz")
        tok = (full_multi30k / "tok" / f"{split}.lc.norm.tok.{lang}").read_text(
            encoding="utf-8").split("\n")[:-1]
        ours = paper_protocol(raw, lang)
        same = sum(a == b.strip() for a, b in zip(ours, tok, strict=True))
        assert len(ours) == len(tok) and same >= len(tok) - 2, f"{split}.{lang}: {same} same"
    assert paper_protocol(['Ein "Mann" fährt.'], "de") == ["ein &quot; mann &quot; fährt ."]


def test_paper_protocol_bleu_matches_the_sacrebleu_cli_tokenize_none(tmp_path):
    hyps = paper_protocol(["A man's bike, red.", "Two dogs play."], "en")
    refs = ["a man &apos;s red bike .", "two dogs are playing ."]
    (tmp_path / "hyp.txt").write_text("".join(h + "\n" for h in hyps), encoding="utf-8")
    (tmp_path / "ref.txt").write_text("".join(r + "\n" for r in refs), encoding="utf-8")
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(tmp_path / "ref.txt"), "-i",
         str(tmp_path / "hyp.txt"), "-m", "bleu", "--tokenize", "none", "--format", "text"],
        capture_output=True, text=True, check=True)
    report = bleu_report(hyps, refs, tokenize="none", chrf=False)
    assert report == cli.stdout.splitlines() and "tok:none" in report[0]


def test_translate_lines_in_chunks_keeps_order(copy_translator, copy_inputs):
    lines = copy_inputs[:11]
    out = io.StringIO()
    kept = translate_lines(copy_translator, iter(lines), out,
                           copy_translator.request(beam_size=2), chunk_lines=4, keep=True,
                           max_tokens=10)
    assert out.getvalue().splitlines() == lines == kept


# ---- transformer translate --------------------------------------------------------------------

def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_script_keeps_line_alignment_with_empty_lines(copy_checkpoint, copy_inputs, tmp_path,
                                                      capsys):
    lines = copy_inputs[:12]
    for i in (0, 3, 4, 9):
        lines.insert(i, "")
    lines.append("  ")
    src = write_lines(tmp_path / "in.txt", lines)
    args = ["--checkpoint", str(copy_checkpoint), "--input", str(src), "--output",
            str(tmp_path / "out.txt"), "--beam-size", "4", "--chunk-lines", "5",
            "--max-tokens", "12", "--device", "cpu"]
    assert translate_command.main(args) == 0
    out = (tmp_path / "out.txt").read_text(encoding="utf-8").split("\n")
    assert out[-1] == "" and out[:-1] == [line.strip() for line in lines]
    assert f"{len(lines)}/{len(lines)}" in capsys.readouterr().err  # the progress bar


def test_script_invalid_utf8_input(copy_checkpoint, tmp_path, capsys):
    (tmp_path / "in.txt").write_bytes(b"abc\nde \xff f\n")
    assert translate_command.main(["--checkpoint", str(copy_checkpoint), "--input",
                                  str(tmp_path / "in.txt"), "--output",
                                  str(tmp_path / "out.txt")]) == 1
    assert "line 2: invalid UTF-8" in capsys.readouterr().err


def test_script_stdin_to_stdout_with_reference(copy_checkpoint, copy_inputs, tmp_path,
                                               monkeypatch, capsys):
    lines = copy_inputs[:8] + [""]
    refs = [line.replace("a", "b") for line in lines]
    ref = write_lines(tmp_path / "ref.txt", refs)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(
        "".join(line + "\n" for line in lines).encode())))
    assert translate_command.main(["--checkpoint", str(copy_checkpoint), "--reference",
                                  str(ref), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == lines
    hyp = write_lines(tmp_path / "hyp.txt", lines)
    cli = subprocess.run(
        [sys.executable, "-m", "sacrebleu", str(ref), "-i", str(hyp), "-m", "bleu", "chrf",
         "--format", "text"], capture_output=True, text=True, check=True)
    report = cli.stdout.splitlines()
    assert report[0].lstrip().startswith("BLEU|nrefs:1|") and len(report) == 2
    assert all(line in captured.err.splitlines() for line in report)


def test_script_paper_protocol(copy_checkpoint, copy_inputs, tmp_path, capsys):
    src = write_lines(tmp_path / "in.txt", copy_inputs[:8])
    ref = write_lines(tmp_path / "ref.tok.en", paper_protocol(copy_inputs[:8], "en"))
    args = ["--checkpoint", str(copy_checkpoint), "--input", str(src), "--output",
            str(tmp_path / "out.txt"), "--device", "cpu", "--paper-protocol", str(ref)]
    assert translate_command.main(args) == 0
    err = capsys.readouterr().err.splitlines()
    i = err.index("paper protocol (lowercased, punctuation-normalized, Moses-tokenized, en):")
    assert err[i + 1].startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:none|")
    assert err[i + 1].split(" = ")[1].startswith("100.0 ")
    bad = write_lines(tmp_path / "ref.tok", paper_protocol(copy_inputs[:8], "en"))
    assert translate_command.main(args[:-1] + [str(bad)]) == 1
    assert "give --paper-lang" in capsys.readouterr().err
    assert translate_command.main(args[:-1] + [str(bad), "--paper-lang", "en"]) == 0


def test_script_interactive(copy_checkpoint, copy_inputs, monkeypatch, capsys):
    stdin = io.TextIOWrapper(io.BytesIO("".join(s + "\n" for s in copy_inputs[:3]).encode()))
    stdin.isatty = lambda: True
    monkeypatch.setattr(sys, "stdin", stdin)
    assert translate_command.main(["--checkpoint", str(copy_checkpoint), "--device", "cpu"]) == 0
    captured = capsys.readouterr()
    assert captured.out.splitlines() == copy_inputs[:3]
    assert "sent" not in captured.err  # no progress bar


def test_script_nbest(copy_checkpoint, copy_inputs, tmp_path):
    lines = copy_inputs[:5] + [""]
    src = write_lines(tmp_path / "in.txt", lines)
    assert translate_command.main(["--checkpoint", str(copy_checkpoint), "--input", str(src),
                                  "--output", str(tmp_path / "out.txt"), "--beam-size", "4",
                                  "--nbest", "3", "--device", "cpu"]) == 0
    rows = [r.split("\t") for r in (tmp_path / "out.txt").read_text().splitlines()]
    assert len(rows) == 3 * len(lines)
    for i, line in enumerate(lines):
        group = rows[3 * i: 3 * i + 3]
        assert [int(n) for n, _, _ in group] == [i + 1] * 3
        scores = [float(s) for _, s, _ in group]
        assert scores == sorted(scores, reverse=True)
        assert group[0][2] == line  # the copy model's best is its input
        if line:
            assert len({text for _, _, text in group}) == 3


def test_script_reference_line_count_mismatch(copy_checkpoint, copy_inputs, tmp_path, capsys):
    src = write_lines(tmp_path / "in.txt", copy_inputs[:5])
    ref = write_lines(tmp_path / "ref.txt", copy_inputs[:4])
    assert translate_command.main(["--checkpoint", str(copy_checkpoint), "--input", str(src),
                                  "--reference", str(ref), "--device", "cpu"]) == 1
    err = capsys.readouterr().err.strip()
    assert "\n" not in err and "4 lines" in err and "has 5" in err


# ---- scoring, alignments, prefixes and sampling from the command line ------------------------

def test_score_is_loss_py_teacher_forced_log_prob(random_runs):
    translator = Translator.load(random_runs[0], device="cpu")
    sources = ["A man rides a bike.", "Zwei Hunde.", "", "A dog runs through the snow."]
    targets = ["Ein Mann fährt Rad.", "Two dogs.", "Hallo", ""]
    scored = translator.score(sources, targets, alpha=1.5, max_tokens=12)  # several batches
    tokenizers, model = translator.tokenizers, translator.model
    for source, target, hyp in zip(sources, targets, scored, strict=True):
        pairs = ParallelCorpus.from_ids([tokenizers.src.encode(source)],
                                        [tokenizers.tgt.encode(target)],
                                        tokenizers.tgt.specials, tokenizers.tgt.vocab_size)
        with torch.no_grad():
            nll = teacher_forced_loss(model.eval(), pairs.collate([0])).nll.item()
        assert hyp.tokens == tokenizers.tgt.encode(target)
        assert hyp.log_prob == pytest.approx(-nll, rel=1e-5, abs=1e-4)
        assert hyp.score == pytest.approx(hyp.log_prob / length_penalty(len(hyp.tokens) + 1,
                                                                        1.5))


def test_score_of_the_search_output_is_its_search_score(copy_translator, copy_inputs):
    """Forced decoding of the beam's own output gives the beam's log-prob (the search
    masks PAD and BOS, which a trained model gives almost no probability)."""
    found = copy_translator.translations(copy_inputs[:10], beam_size=4)
    scored = copy_translator.score(copy_inputs[:10], [h[0].text for h in found])
    for hyps, hyp in zip(found, scored, strict=True):
        assert hyp.tokens == copy_translator.tokenizers.tgt.encode(hyps[0].text)
        assert hyp.log_prob == pytest.approx(hyps[0].log_prob, abs=1e-3)
        assert hyp.score == pytest.approx(hyps[0].score, abs=1e-3)


def test_word_alignment_merges_pieces_into_words():
    src = ["▁A", "▁man", "▁rid", "es", "▁."]  # words: A man rides .
    out = ["▁Ein", "▁Mann", "▁fähr", "t", "▁."]
    weights = torch.zeros(5, 6)  # (output pieces, source pieces + EOS)
    for j, s in enumerate([0, 1, 3, 2, 5]):  # the last attends to EOS most, then "."
        weights[j, s] = 1.0
    weights[4, 4] = 0.5
    assert word_alignment(weights, src, out) == [(0, 0), (1, 1), (2, 2), (3, 3)]
    assert format_alignment([(0, 0), (2, 1)]) == "0-0 2-1"
    assert word_alignment(weights, src, []) == []


def test_copy_model_aligns_each_word_to_its_source(copy_translator, copy_inputs):
    results = copy_translator.translations(copy_inputs, beam_size=4,
                                           alignment=AlignmentOptions())
    for line, hyps in zip(copy_inputs, results, strict=True):
        assert hyps[0].text == line
        assert hyps[0].alignment == [(i, i) for i in range(len(line.split()))], line


def test_script_alignment_prefix_and_sampling(copy_checkpoint, copy_inputs, tmp_path):
    lines = copy_inputs[:6] + [""]
    src = write_lines(tmp_path / "in.txt", lines)
    base = ["--checkpoint", str(copy_checkpoint), "--input", str(src), "--device", "cpu"]
    out = tmp_path / "aligned.txt"
    assert translate_command.main(base + ["--output", str(out), "--alignment"]) == 0
    rows = out.read_text().splitlines()
    assert len(rows) == len(lines)  # one line per output: TEXT <tab> ALIGNMENT
    for line, row in zip(lines, rows, strict=True):
        text, alignment = row.split("\t")
        assert text == line
        pairs = [tuple(map(int, p.split("-"))) for p in alignment.split()]
        assert all(0 <= i < len(line.split()) and 0 <= j < len(text.split())
                   for i, j in pairs)
    prefixes = write_lines(tmp_path / "prefix.txt", ["fed"] * 3 + [""] * 4)
    assert translate_command.main(base + ["--output", str(out), "--prefix",
                                          str(prefixes)]) == 0
    for line, row in zip(lines, out.read_text().splitlines(), strict=True):
        assert row.startswith("fed") if lines.index(line) < 3 and line else row == line
    runs = []
    for _ in range(2):
        assert translate_command.main(base + ["--output", str(out), "--sampling-topk", "0",
                                              "--temperature", "3", "--seed", "4"]) == 0
        runs.append(out.read_text())
    assert runs[0] == runs[1] and runs[0].count("\n") == len(lines)


def test_script_score(copy_checkpoint, copy_inputs, tmp_path):
    lines = copy_inputs[:5]
    src = write_lines(tmp_path / "in.txt", lines)
    ref = write_lines(tmp_path / "ref.txt", lines[::-1])
    out = tmp_path / "scores.txt"
    assert translate_command.main(["--checkpoint", str(copy_checkpoint), "--input", str(src),
                                   "--reference", str(ref), "--score", "--alpha", "1",
                                   "--output", str(out), "--device", "cpu"]) == 0
    rows = [tuple(map(float, r.split("\t"))) for r in out.read_text().splitlines()]
    expected = Translator.load(copy_checkpoint, device="cpu").score(lines, lines[::-1],
                                                                      alpha=1.0)
    assert rows == [(pytest.approx(h.log_prob, abs=1e-5), pytest.approx(h.score, abs=1e-5))
                    for h in expected]
    assert rows[2][0] > max(rows[0][0], rows[1][0])  # line 3 is scored against itself


@pytest.mark.parametrize("options, named, status", [
    (["--sampling-topk", "5", "--temperature", "0"], "--temperature must be > 0", 1),
    (["--sampling-topk", "5", "--beam-size", "4"], "it excludes --beam-size 4", 1),
    (["--sampling-topp", "1.5"], "--sampling-topp must be in (0, 1]", 1),
    (["--temperature", "2", "--nbest", "2"], "it excludes --nbest 2", 1),
    (["--seed", "3"], "--seed seeds sampling", 1),
    (["--alignment-head", "1"], "--alignment-layer and --alignment-head need --alignment", 1),
    (["--nbest", "9"], "--nbest 9 must be at most the beam size 5", 1),
    (["--alpha", "-1"], "--alpha must be >= 0", 1),
    (["--threads", "0"], "--threads must be in [1, 2147483647], got 0", 1),
    (["--chunk-lines", "0"], "--chunk-lines must be in [1, 2147483647], got 0", 1),
    (["--score"], "--score needs --input and --reference", 1),
    (["--score", "--reference", "REF", "--alignment"], "it excludes --alignment", 1),
    (["--beam-size", "x"], "invalid int value", 2),
])
def test_script_bad_mode_options_name_the_option(copy_checkpoint, copy_inputs, tmp_path, capsys,
                                                 options, named, status):
    """Decoding options are checked together, as one request, once the model is loaded (exit
    1, one line naming the option, nothing written); argparse's own checks exit 2."""
    src = write_lines(tmp_path / "in.txt", copy_inputs[:3])
    out = tmp_path / "out.txt"
    options = [str(src) if o == "REF" else o for o in options]
    argv = ["--checkpoint", str(copy_checkpoint), "--input", str(src), "--output", str(out),
            *options]
    if status == 2:
        with pytest.raises(SystemExit) as exit_info:
            translate_command.main(argv)
        assert exit_info.value.code == 2
        err = capsys.readouterr().err.strip().splitlines()[-1]
    else:
        assert translate_command.main(argv) == 1
        err = capsys.readouterr().err
        assert err.startswith("error: ") and err.count("\n") == 1, err
    assert named in err
    assert not out.exists()


def test_script_prefix_line_count_and_alignment_layer_errors(copy_checkpoint, copy_inputs,
                                                             tmp_path, capsys):
    src = write_lines(tmp_path / "in.txt", copy_inputs[:5])
    prefixes = write_lines(tmp_path / "prefix.txt", ["a"] * 4)
    base = ["--checkpoint", str(copy_checkpoint), "--input", str(src), "--device", "cpu"]
    assert translate_command.main(base + ["--prefix", str(prefixes)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--prefix" in err and "4 lines" in err and "has 5" in err
    assert translate_command.main(base + ["--alignment", "--alignment-layer", "2"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--alignment-layer" in err
    assert translate_command.main(base + ["--alignment", "--alignment-head", "4"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--alignment-head 4" in err


def test_script_bad_checkpoints_exit_1_with_one_line(random_runs, tmp_path, capsys):
    state = torch.load(random_runs[0] / "checkpoints" / "checkpoint_best.pt", weights_only=True)
    del state["tokenizer"]
    save_checkpoint(state, tmp_path / "no_tokenizer.pt")
    save_checkpoint({**state, "tokenizer": {"src": b"junk", "tgt": b"junk"}},
                    tmp_path / "bad_tokenizer.pt")
    for path, message in ((tmp_path / "no_tokenizer.pt", "no tokenizer"),
                          (tmp_path / "bad_tokenizer.pt", "unreadable tokenizer"),
                          (tmp_path / "missing.pt", "not found"),
                          (tmp_path, "no checkpoint_best.pt")):
        assert translate_command.main(["--checkpoint", str(path), "--input", "/dev/null"]) == 1
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and message in err and err.startswith("error: ")


def test_script_corrupt_checkpoint_exits_1(tmp_path):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"this is not a checkpoint" * 10)
    result = subprocess.run([sys.executable, str(SCRIPT), "--checkpoint", str(bad)],
                            input="Hallo\n", capture_output=True, text=True)
    assert result.returncode == 1
    assert result.stdout == ""
    assert result.stderr.count("\n") == 1 and str(bad) in result.stderr


# ---- choosing checkpoints and length penalty on validation data (transformer tune-decoding) ----


@pytest.fixture(scope="module")
def copy_run(copy_checkpoint, tmp_path_factory) -> Path:
    """A run whose checkpoints, saved after 100, 200 and 300 s of training, hold a random
    model, the copy model, and another random model of the same shape."""
    copy = torch.load(copy_checkpoint, weights_only=True)
    config = ModelConfig.from_dict(copy["model_config"])
    folder = tmp_path_factory.mktemp("copy_run") / "checkpoints"
    for updates, seed in ((10, 1), (20, None), (30, 2)):
        if seed is None:
            model = copy["model"]
        else:
            torch.manual_seed(seed)
            model = Transformer(config).state_dict()
        save_checkpoint({**copy, "model": model, "train_state": {"train_time": 10.0 * updates}},
                        folder / f"checkpoint_{updates}.pt")
    return folder.parent


def test_checkpoints_within_keeps_those_saved_in_time(copy_run):
    folder = copy_run / "checkpoints"
    assert [p.name for p in checkpoints_within(folder)] == [
        "checkpoint_10.pt", "checkpoint_20.pt", "checkpoint_30.pt"]
    assert [p.name for p in checkpoints_within(folder, 250)] == [
        "checkpoint_10.pt", "checkpoint_20.pt"]
    with pytest.raises(CheckpointError, match="within the first 50 s"):
        checkpoints_within(folder, 50)


def test_tune_decoding_scores_every_average_and_alpha(copy_run, copy_inputs):
    checkpoints = checkpoints_within(copy_run / "checkpoints", 250)
    copies = [EvaluationSet("copy", ParallelText(copy_inputs, copy_inputs,
                                                 list(range(len(copy_inputs)))))]
    trials = tune_decoding(checkpoints, copies, lasts=[1, 2, 5],
                           alphas=[0.5, 2.0], beam_size=2, device="cpu")
    assert [(len(t.checkpoints), t.alpha) for t in trials] == [(1, 0.5), (1, 2.0),
                                                                (2, 0.5), (2, 2.0)]
    assert trials[0].checkpoints == (checkpoints[1],)
    assert trials[0].bleu == pytest.approx(100.0) and trials[1].bleu == pytest.approx(100.0)
    # the average with a random model is another model, and its BLEU is sacrebleu's
    averaged = Translator.load(checkpoints, device="cpu").translate(copy_inputs, beam_size=2,
                                                                     alpha=2.0)
    expected = sacrebleu.corpus_bleu(averaged, [copy_inputs])
    assert trials[3].bleu == pytest.approx(expected.score) and expected.score < 50
    assert trials[3].brevity_penalty == pytest.approx(expected.bp)
    assert best_trial(trials) is trials[0]  # ties go to fewer checkpoints, then the first alpha
    with pytest.raises(CheckpointError, match="fewer than any"):
        tune_decoding(checkpoints, copies, lasts=[3], alphas=[1.0])


def test_tune_decoding_script_writes_the_chosen_average(copy_run, copy_inputs, copy_checkpoint,
                                                        tmp_path, capsys):
    script = tune_decoding_command
    src = write_lines(tmp_path / "valid.src", copy_inputs)
    out = tmp_path / "chosen.pt"
    args = [str(copy_run), "-o", str(out), "--src", str(src), "--ref", str(src),
            "--last", "1", "2", "--alpha", "1.0", "--beam-size", "2", "--device", "cpu"]
    assert script.main(args) == 0  # all checkpoints: the newest ones are random
    chosen = torch.load(out, weights_only=True)
    assert chosen["averaged_from"][-1] == str(copy_run / "checkpoints" / "checkpoint_30.pt")
    assert chosen["valid_bleu"] < 50
    assert script.main(args + ["--within", "250"]) == 0  # newest in time: the copy model
    chosen = torch.load(out, weights_only=True)
    assert chosen["averaged_from"] == [str(copy_run / "checkpoints" / "checkpoint_20.pt")]
    assert chosen["valid_bleu"] == pytest.approx(100)
    assert stored_decoding(chosen) == DecodingSettings(alpha=1.0, beam_size=2)
    assert "optimizer" not in chosen  # for translation: no training state
    copy = torch.load(copy_checkpoint, weights_only=True)["model"]
    assert all(torch.equal(chosen["model"][k], v) for k, v in copy.items())
    assert "alpha 1: validation BLEU 100.00" in capsys.readouterr().out
    assert script.main([str(copy_run), "-o", str(out), "--within", "1"]) == 1
    assert "within the first 1 s" in capsys.readouterr().err
