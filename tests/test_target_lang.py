"""Choosing the target language at translation time: a multilingual model (trained into de
and fr, each source tagged `<2de>`/`<2fr>`) reads the tag in front of every source it is
given, by every path (search, sampling, prefixes, alignments, scoring, the server's pages);
it refuses a call without a language or into one it was not trained for, through the Python
API, `transformer translate` and the server; the exports refuse it; a bilingual model takes
its own language or none, and exports as before, a corpus tag (`<bt>`) among its pieces or
not; a tag the model writes never reaches the text."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from conftest import MULTI30K_SLICE, assert_reported, run_command  # tests/conftest.py
from fastapi.testclient import TestClient

from transformer.data.store import ParallelCorpus
from transformer.data.tokenizer import Tokenizer, TokenizerPair
from transformer.decoding import translator as translator_module
from transformer.decoding.request import AlignmentOptions, RequestError, Sampling, option_name
from transformer.decoding.translator import Translator
from transformer.deploy.engines import load_translator
from transformer.deploy.export import check_exportable, export_ctranslate2
from transformer.deploy.hf import export_hf
from transformer.deploy.serve import create_app
from transformer.errors import ExportError
from transformer.model.loss import sentence_log_probs
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run.checkpoint import inference_checkpoint, save_checkpoint
from transformer.run.config import TrainConfig
from transformer.run.data_config import CorpusConfig, DataConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

TAGS = ["<2de>", "<2fr>", "<bt>"]
LINES = ["A man rides a bike.", "", "Two dogs play in the snow."]
FAST = dict(beam_size=2, max_len_b=3)  # short outputs: the tests look at the sources
FAST_ARGS = ["--beam-size", "2", "--max-len-b", "3", "--device", "cpu"]


def corpus(name: str, **fields) -> CorpusConfig:
    return CorpusConfig(name=name, src=str(MULTI30K_SLICE / "train.en.gz"),
                        tgt=str(MULTI30K_SLICE / "train.de.gz"), **fields)


MULTILINGUAL = TrainConfig(data=DataConfig(corpora=[corpus("to-de", tgt_lang="de"),
                                                    corpus("to-fr", tgt_lang="fr")]))
# one target language (data.tgt_lang: de); the back-translated corpus's sources say <bt>
BILINGUAL = TrainConfig(data=DataConfig(corpora=[corpus("clean"), corpus("bt", tag="<bt>")]))


@pytest.fixture(scope="module")
def tokenizer(multi30k_lines) -> Tokenizer:
    texts = multi30k_lines("train.en.gz")[:1000] + multi30k_lines("train.de.gz")[:1000]
    return Tokenizer.train(texts, vocab_size=500, tags=TAGS)


def tiny_model(vocab: int, **config) -> Transformer:
    torch.manual_seed(0)
    return Transformer(ModelConfig(src_vocab_size=vocab, tgt_vocab_size=vocab, num_hiddens=32,
                                   ffn_num_hiddens=64, num_heads=4, num_encoder_layers=2,
                                   num_decoder_layers=2, max_positions=64, **config)).eval()


def save(tokenizer: Tokenizer, config: TrainConfig, path: Path) -> Path:
    model = tiny_model(tokenizer.vocab_size)
    save_checkpoint(inference_checkpoint(model, TokenizerPair(tokenizer, tokenizer),
                                         training_config=config), path)
    return path


@pytest.fixture(scope="module")
def checkpoint(tokenizer, tmp_path_factory) -> Path:
    return save(tokenizer, MULTILINGUAL, tmp_path_factory.mktemp("multi") / "multi.pt")


@pytest.fixture(scope="module")
def bilingual_checkpoint(tokenizer, tmp_path_factory) -> Path:
    return save(tokenizer, BILINGUAL, tmp_path_factory.mktemp("bi") / "bi.pt")


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return Translator.load(checkpoint, device="cpu")


@pytest.fixture(scope="module")
def bilingual(bilingual_checkpoint) -> Translator:
    return Translator.load(bilingual_checkpoint, device="cpu")


@pytest.fixture
def searched(monkeypatch) -> list[list[list[int]]]:
    """The source ids of every `search_corpus` call, recorded on the way to the real one."""
    calls, search = [], translator_module.search_corpus

    def recording(model, sources, request, **options):
        calls.append([list(ids) for ids in sources])
        return search(model, sources, request, **options)

    monkeypatch.setattr(translator_module, "search_corpus", recording)
    return calls


def tagged(tokenizer: Tokenizer, lang: str | None, line: str) -> list[int]:
    """What the model must read for `line`: the language's tag (none for None), the
    pieces, EOS; nothing for a blank line."""
    tags = [] if lang is None else [tokenizer.tags[f"<2{lang}>"]]
    return tags + tokenizer.encode(line) + [tokenizer.specials.eos] if line.strip() else []


# ---- the sources a multilingual model reads -------------------------------------------------

def test_every_source_starts_with_the_chosen_languages_tag(translator, tokenizer, searched):
    translator.translate(LINES, target_lang="de", **FAST)
    translator.translations(LINES, target_lang="fr", sampling=Sampling(topk=5, seed=1),
                            max_len_b=3)
    translator.translations(LINES, prefixes=["Ein", "", "Zwei"], target_lang="fr", **FAST)
    assert searched == [[tagged(tokenizer, lang, line) for line in LINES]
                        for lang in ("de", "fr", "fr")]
    assert tokenizer.tags["<2de>"] != tokenizer.tags["<2fr>"]


def test_a_tag_typed_in_the_text_does_not_choose_the_language(translator, tokenizer,
                                                              searched):
    """Only target_lang chooses: `<2fr>` in a line's text is dropped, not read as the tag."""
    translator.translate(["<2fr> " + LINES[0]], target_lang="de", **FAST)
    (source,), = searched
    assert source[0] == tokenizer.tags["<2de>"]
    assert tokenizer.tags["<2fr>"] not in source
    typed = tokenizer.encode("<2fr> " + LINES[0])
    assert tokenizer.tags["<2fr>"] in typed  # SentencePiece reads it as the tag ...
    assert source[1:] == [i for i in typed if i != tokenizer.tags["<2fr>"]] + [
        tokenizer.specials.eos]  # ... the translator drops it


def test_the_tag_counts_against_the_position_limit(translator, tokenizer, searched):
    assert translator.max_source_tokens == 64 - 2  # EOS and the tag
    long_line = " ".join(["dog"] * 100)
    translator.translate([long_line], target_lang="de", **FAST)
    (source,), = searched
    assert len(source) == translator.model_config.max_positions
    assert source[0] == tokenizer.tags["<2de>"] and source[-1] == tokenizer.specials.eos


def test_alignments_count_the_texts_words_not_the_tag(translator, tokenizer, monkeypatch):
    """Every output piece attends only to the source's last text piece (the column before
    EOS): each aligns to the line's last word, as if there were no tag."""
    given = []

    def last_piece(model, sources, outputs, options, max_tokens):
        given.extend(sources)
        weights = [torch.zeros(len(out), len(src))
                   for src, out in zip(sources, outputs, strict=True)]
        for w in weights:
            w[:, -2] = 1.0
        return weights

    monkeypatch.setattr(translator_module, "attention_weights", last_piece)
    found = translator.translations(LINES, prefixes=["Ein Mann", "", "Zwei"], target_lang="fr",
                                    alignment=AlignmentOptions(), **FAST)
    assert given == [tagged(tokenizer, "fr", line) for line in LINES if line]
    for line, (best,) in zip(LINES, found, strict=True):
        if line:
            assert best.alignment and {i for i, _ in best.alignment} == {len(line.split()) - 1}
        else:
            assert best.alignment == []


def test_scores_read_the_tag(translator, tokenizer):
    sources = ["A man rides a bike.", "", "Two dogs."]
    targets = ["Ein Mann fährt Rad.", "Hallo", ""]
    scores = {}
    for lang in ("de", "fr"):
        hyps = translator.score(sources, targets, target_lang=lang, max_tokens=16)
        tag = tokenizer.tags[f"<2{lang}>"]
        for source, target, hyp in zip(sources, targets, hyps, strict=True):
            pairs = ParallelCorpus.from_ids([[tag, *tokenizer.encode(source)]],
                                            [tokenizer.encode(target)], tokenizer.specials,
                                            tokenizer.vocab_size)
            expected = sentence_log_probs(translator.model, pairs.collate([0])).item()
            assert hyp.log_prob == pytest.approx(expected, rel=1e-5, abs=1e-4)
        scores[lang] = [hyp.log_prob for hyp in hyps]
    assert all(abs(de - fr) > 1e-3 for de, fr in zip(scores["de"], scores["fr"], strict=True))


def test_a_tag_the_model_writes_never_reaches_the_text(tokenizer, monkeypatch):
    """A model whose output bias makes it write nothing but <2fr>: its translation is empty
    text; and decoding drops tag ids wherever they are."""
    tag, dog = tokenizer.tags["<2fr>"], tokenizer.encode("Hund")
    model = tiny_model(tokenizer.vocab_size, output_bias=True)
    translator = Translator(model, TokenizerPair(tokenizer, tokenizer), "cpu",
                            training_config=MULTILINGUAL)
    written = []
    search = translator_module.search_corpus

    def steered(model, sources, request, **options):
        hyps = search(model, sources, request, **options)
        written.extend(h.tokens for sentence in hyps for h in sentence)
        return hyps

    monkeypatch.setattr(translator_module, "search_corpus", steered)
    with torch.no_grad():
        model.output_projection.bias[tag] = 60.0
    out = translator.translate(["A dog."], target_lang="de", beam_size=1, max_len_a=0,
                               max_len_b=2)
    assert written == [[tag, tag]] and out == [""]
    assert tokenizer.decode([tag, *dog, tokenizer.tags["<2de>"]]) == "Hund"


# ---- refusals -------------------------------------------------------------------------------

@pytest.mark.parametrize("options, message", [
    (dict(), "this model translates into de, fr: choose one with {}"),
    (dict(target_lang="es"), "this model was not trained to translate into 'es' (it "
                             "translates into de, fr): choose one of them with {}"),
    (dict(target_lang="d e"), "{} must be a language such as de (letters, digits, '_', '-', "
                              "'.'), got 'd e'"),
    (dict(target_lang="{0}"), "{} must be a language such as de (letters, digits, '_', '-', "
                              "'.'), got '{{0}}'"),
])
def test_the_api_refuses_no_language_and_a_language_not_trained(translator, options, message):
    """Translating and scoring alike; the message names the field, or the option."""
    for call in (lambda: translator.translate(LINES, **options),
                 lambda: translator.score(["A dog."], ["Ein Hund."], **options)):
        with pytest.raises(RequestError) as info:
            call()
        assert info.value.field == "target_lang"
        assert str(info.value) == message.format("target_lang")
        assert info.value.message(option_name) == message.format("--target-lang")


def test_translate_chooses_the_language_and_refuses_in_one_line(checkpoint, translator,
                                                                 tmp_path):
    src, ref, out = tmp_path / "src.txt", tmp_path / "ref.txt", tmp_path / "out.txt"
    src.write_text("\n".join(LINES) + "\n")
    ref.write_text("Ein Mann fährt Rad.\n\nZwei Hunde spielen.\n")
    base = ["translate", "--checkpoint", str(checkpoint), "--input", str(src), "--output",
            str(out), *FAST_ARGS]
    for extra, words in (([], "error: this model translates into de, fr: choose one with "
                              "--target-lang"),
                         (["--target-lang", "es"], "error: this model was not trained to "
                                                   "translate into 'es'"),
                         (["--score", "--reference", str(ref)], "choose one with "
                                                                "--target-lang")):
        status, err = run_command(base + extra)
        assert_reported(status, err)
        assert status == 1 and words in err.splitlines()[-1] and not out.exists()
    status, err = run_command(base + ["--target-lang", "fr"])
    assert status == 0, err
    assert out.read_text().split("\n")[:-1] == translator.translate(LINES, target_lang="fr",
                                                                     **FAST)
    status, err = run_command(base + ["--target-lang", "de", "--score", "--reference",
                                      str(ref)])
    assert status == 0, err
    expected = translator.score(LINES, ref.read_text().split("\n")[:-1], target_lang="de")
    got = [float(row.split("\t")[0]) for row in out.read_text().splitlines()]
    assert got == pytest.approx([hyp.log_prob for hyp in expected], abs=1e-5)


# ---- the server ----------------------------------------------------------------------------

def test_the_server_lists_the_languages_and_answers_422_naming_the_field(translator):
    with TestClient(create_app(translator)) as client:
        info = client.get("/info").json()
        assert info["target_languages"] == ["de", "fr"]
        assert info["languages"] == {"source": "en", "target": None}
        for path, text in (("/translate", ["A dog."]), ("/attention", "A dog.")):
            for extra in ({}, {"target_lang": "es"}, {"target_lang": "d e"},
                          {"target_lang": 5}):
                response = client.post(path, json={"text": text, **extra})
                assert response.status_code == 422, response.text
                assert response.json()["field"] == "target_lang"
                assert "\n" not in response.json()["error"]
        answer = client.post("/translate", json={"text": LINES, "target_lang": "fr", **FAST})
        assert answer.json() == {"translations": translator.translate(LINES, target_lang="fr",
                                                                      **FAST)}
        report = client.post("/attention", json={"text": "A dog.", "target_lang": "fr"}).json()
        assert report["labels"]["enc-dec"]["keys"][0] == "<2fr>"
        assert report["translation"] == translator.translate(["A dog."], target_lang="fr")[0]


# ---- exports -------------------------------------------------------------------------------

def test_both_exports_refuse_a_multilingual_model_in_one_line(checkpoint, translator,
                                                             tmp_path):
    for fmt, name in (("ctranslate2", "CTranslate2"), ("hf", "Hugging Face")):
        output = tmp_path / fmt
        status, err = run_command(["export", "--checkpoint", str(checkpoint), "--output",
                                   str(output), "--format", fmt])
        assert_reported(status, err)
        assert status == 1 and err.splitlines()[-1].startswith(
            f"error: {checkpoint} is a multilingual model (target-language tags <2de>, "
            f"<2fr>); exporting it to {name} is not supported: ")
    for export in (export_ctranslate2, export_hf):
        with pytest.raises(ExportError, match="is a multilingual model"):
            export(translator, tmp_path / "library")
    assert list(tmp_path.iterdir()) == []  # no directory, not even a half-built one


def test_a_bilingual_model_takes_its_own_language_and_exports(bilingual, bilingual_checkpoint,
                                                              tokenizer, tmp_path, searched):
    """Trained into de with a <bt> corpus: untagged sources, de or no language, and both
    exports; the CTranslate2 engine checks the language as ours does."""
    assert (bilingual.target_languages, bilingual.multilingual) == (("de",), False)
    assert bilingual.translate(LINES, target_lang="de", **FAST) == bilingual.translate(LINES,
                                                                                       **FAST)
    assert searched[0] == searched[1] == [tagged(tokenizer, None, line) for line in LINES]
    check_exportable(bilingual)
    export_hf(bilingual, tmp_path / "hf")
    export_ctranslate2(bilingual, tmp_path / "ct2")
    ct2 = load_translator(tmp_path / "ct2", "ctranslate2", device="cpu", threads=1)
    for engine in (bilingual, ct2):
        with pytest.raises(RequestError) as info:
            engine.translate(LINES, target_lang="fr")
        assert info.value.field == "target_lang" and str(info.value) == (
            "this model was not trained to translate into 'fr' (it translates into de): "
            "leave target_lang out or give de")
    assert ct2.translate(LINES, target_lang="de", **FAST) == ct2.translate(LINES, **FAST)


def test_translate_with_a_bilingual_model(bilingual_checkpoint, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("\n".join(LINES) + "\n")
    outputs = []
    for extra in ([], ["--target-lang", "de"]):
        out = tmp_path / f"out{len(outputs)}.txt"
        status, err = run_command(["translate", "--checkpoint", str(bilingual_checkpoint),
                                   "--input", str(src), "--output", str(out), *FAST_ARGS,
                                   *extra])
        assert status == 0, err
        outputs.append(out.read_text())
    assert outputs[0] == outputs[1] and outputs[0].count("\n") == len(LINES)
    status, err = run_command(["translate", "--checkpoint", str(bilingual_checkpoint),
                               "--input", str(src), "--target-lang", "fr", *FAST_ARGS])
    assert_reported(status, err)
    assert status == 1 and err.splitlines()[-1] == (
        "error: this model was not trained to translate into 'fr' (it translates into de): "
        "leave --target-lang out or give de")


def test_tune_decoding_scores_each_validation_set_into_its_language(tokenizer, tmp_path):
    """A run with two named validation sets: each is translated into its own language
    and scored by sacreBLEU; the trial's BLEU is their mean (what the choice compares)."""
    import sacrebleu

    from transformer.run.data_config import EvalSetConfig
    from transformer.tools.evaluation import evaluation_sets, tune_decoding

    valid = [EvalSetConfig(name=f"en-{lang}", src=str(MULTI30K_SLICE / "val.en.gz"),
                           tgt=str(MULTI30K_SLICE / "val.de.gz"), tgt_lang=lang)
             for lang in ("de", "fr")]
    config = TrainConfig(data=DataConfig(corpora=MULTILINGUAL.data.corpora, valid_sets=valid))
    path = save(tokenizer, config, tmp_path / "multi.pt")
    sets = evaluation_sets(config, data="valid", max_sentences=12)
    assert [(one.name, one.target_lang, len(one.text)) for one in sets] == [
        ("en-de", "de", 12), ("en-fr", "fr", 12)]
    assert [one.name for one in evaluation_sets(config, name="en-fr")] == ["en-fr"]
    (trial,) = tune_decoding([path], sets, lasts=[1], alphas=[1.0], beam_size=2, device="cpu")
    model = Translator.load(path, device="cpu")
    expected = {one.name: sacrebleu.corpus_bleu(
        model.translate(one.text.src, beam_size=2, alpha=1.0, target_lang=one.target_lang),
        [one.text.tgt]).score for one in sets}
    assert trial.per_set == pytest.approx(expected)
    assert trial.bleu == pytest.approx(sum(expected.values()) / 2)
