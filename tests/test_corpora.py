"""Several training corpora: shares of an epoch, tags in the batches, several validation
sets, and a config's mistakes stopped before training with the corpus and key named."""

from __future__ import annotations

import gzip
from pathlib import Path

import numpy as np
import pytest
from conftest import assert_reported, run_command

from transformer.data.mixture import Mixture, shares
from transformer.data.store import ParallelCorpus
from transformer.data.tokenizer import EOS_ID, SpecialIds, Tokenizer
from transformer.errors import DataError
from transformer.run import checkpoint as ckpt
from transformer.run.compose import compose_config
from transformer.run.data import load_data
from transformer.run.data_config import DataConfig
from transformer.training.trainer import train


def lines(multi30k_dir: Path, name: str) -> list[str]:
    return gzip.decompress((multi30k_dir / name).read_bytes()).decode().split("\n")[:-1]


def in_memory(sizes: list[int], prefixes: list[tuple[int, ...]] = ()) -> list[ParallelCorpus]:
    """Corpora of `sizes` pairs whose source i is [corpus + 10, i % 50 + 10] (ids that say
    which corpus and which pair a row came from)."""
    out = []
    for c, n in enumerate(sizes):
        src = [[c + 10, i % 50 + 10] for i in range(n)]
        tgt = [[i % 50 + 10] * (1 + i % 3) for i in range(n)]
        corpus = ParallelCorpus.from_ids(src, tgt, SpecialIds(), 100)
        out.append(corpus.with_prefix(prefixes[c]) if prefixes else corpus)
    return out


# ---- shares and draws -------------------------------------------------------------------------


def test_an_epoch_draws_each_corpus_by_its_weight():
    """Weights 0.8 / 0.2 over corpora of 3,000 and 7,000 pairs: the draw matches the weights
    within 2%; the small corpus is repeated (every pair 2 or 3 times), the large one
    subsampled without repeats, a new subset each epoch; the same seed, the same draw."""
    corpora = in_memory([3000, 7000])
    mix = Mixture(["a", "b"], corpora, shares([0.8, 0.2], [3000, 7000]))
    draw = mix.draw(seed=1, epoch=1)
    counts = mix.counts(draw)
    assert len(draw) == 10_000 and sum(counts.values()) == 10_000
    assert abs(counts["a"] / 10_000 - 0.8) < 0.02 and abs(counts["b"] / 10_000 - 0.2) < 0.02
    repeats = np.bincount(draw[draw < 3000], minlength=3000)
    assert repeats.min() >= 2 and repeats.max() <= 3  # upsampled only beyond its size
    b = draw[draw >= 3000]
    assert len(np.unique(b)) == len(b)  # no pair of the large corpus twice
    assert np.array_equal(draw, mix.draw(seed=1, epoch=1))
    assert not np.array_equal(b, mix.draw(seed=1, epoch=2)[mix.draw(1, 2) >= 3000])


def test_shares_by_weight_and_by_temperature():
    """null temperature: the weights; T = 1: sizes times weights (plain concatenation for
    equal weights); large T: toward uniform, as fairseq's temperature sampling."""
    assert shares([3, 1], [10, 1000]).tolist() == [0.75, 0.25]
    assert np.allclose(shares([1, 1], [100, 300], 1.0), [0.25, 0.75])
    assert np.allclose(shares([1, 1], [100, 400], 2.0), [1 / 3, 2 / 3])  # sqrt: 10 vs 20
    one = Mixture(["x"], in_memory([57]), shares([0.3], [57]))
    assert np.array_equal(one.draw(5, 3), np.arange(57))  # one corpus: every pair once


def test_a_batch_holds_each_corpus_rows_with_its_tags_in_batch_order():
    corpora = in_memory([40, 30], prefixes=[(), (7,)])  # the second corpus tagged with id 7
    mix = Mixture(["a", "b"], corpora, shares([1, 1], [40, 30]))
    assert mix.src_lens.tolist() == [2] * 40 + [3] * 30  # the tag counts in the length
    indices = [45, 3, 69, 0, 41]
    batch = mix.collate(indices)
    for row, i in enumerate(indices):
        c, j = (1, i - 40) if i >= 40 else (0, i)
        expected = ([7] if c else []) + [c + 10, j % 50 + 10, EOS_ID]
        assert batch.src[row, :len(expected)].tolist() == expected
        assert batch.src_valid_lens[row] == len(expected)
        assert batch.tgt_out[row, :batch.tgt_valid_lens[row] - 1].tolist() == \
            [j % 50 + 10] * (1 + j % 3)


# ---- in a training run --------------------------------------------------------------------


@pytest.fixture
def two_corpora(tmp_path, multi30k_dir) -> list[str]:
    """Overrides for a run on two corpora of the slice (the second tagged <bt>, cleaned by
    the basic filters) with two validation sets, small enough for seconds."""
    files = {}
    for part, (start, end) in (("a", (0, 200)), ("b", (200, 300)), ("v", (0, 40))):
        stem = "val" if part == "v" else "train"
        for lang in ("en", "de"):
            path = tmp_path / f"{part}.{lang}"
            path.write_text("\n".join(lines(multi30k_dir, f"{stem}.{lang}.gz")[start:end]) + "\n")
            files[f"{part}.{lang}"] = path
    spm = tmp_path / "spm.model"
    Tokenizer.train(lines(multi30k_dir, "train.en.gz")[:1500]
                    + lines(multi30k_dir, "train.de.gz")[:1500], spm, vocab_size=500,
                    tags=["<bt>"])
    corpora = (f"data.corpora=[{{name:a,src:{files['a.en']},tgt:{files['a.de']},weight:0.75}},"
               f"{{name:b,src:{files['b.en']},tgt:{files['b.de']},weight:0.25,tag:'<bt>',"
               f"filters:basic}}]")
    valid = (f"data.valid_sets=[{{name:first,src:{files['v.en']},tgt:{files['v.de']}}},"
             f"{{name:second,src:{files['v.de']},tgt:{files['v.de']}}}]")
    return ["model=tiny", f"data.root={multi30k_dir}", f"data.spm_model={spm}",
            "data.vocab_size=500", "data.max_tokens=512", corpora, valid,
            "model.num_hiddens=32", "model.ffn_num_hiddens=64", "model.num_encoder_layers=1",
            "model.num_decoder_layers=1", "model.num_heads=2", "model.dropout=0.3",
            "optim.lr=0.002", "optim.warmup_updates=4", "optim.update_freq=2",
            "optim.cooldown=0", "optim.warmup_fraction=null", "trainer.max_time=null",
            "trainer.bleu_max_sentences=8", "trainer.log_every_updates=1",
            "trainer.keep_last=1", "trainer.precision=fp32", "trainer.validate_every_updates=4",
            "trainer.validate_every_epoch=false"]


def test_two_corpora_train_resume_exactly_and_report_each_corpus_and_set(tmp_path,
                                                                         two_corpora):
    """8 updates straight == 4, stop, 4 more (the resume point mid-epoch); the log and
    TensorBoard count each corpus's pairs per epoch and score each validation set; the
    tagged corpus's sources start with the tag in its batches."""
    from test_training import scalars

    straight = train(compose_config(two_corpora + ["trainer.max_updates=8"]), tmp_path / "a")
    first = train(compose_config(two_corpora + ["trainer.max_updates=4"]), tmp_path / "b")
    assert first.state.batches_done > 0  # stopped mid-epoch
    second = train(compose_config(two_corpora + ["trainer.max_updates=8",
                                                  "trainer.resume=true"]), tmp_path / "b")
    assert first.losses + second.losses == straight.losses and len(straight.losses) == 8

    log = (tmp_path / "a" / "train.log").read_text()
    assert "epoch 1 draws 300 pairs: a 225 (75.0%), b 75 (25.0%)" in log
    assert "| valid first |" in log and "| valid second |" in log
    tb = scalars(tmp_path / "a")
    assert tb["data/a"][0] == 225 and tb["data/b"][0] == 75
    assert len(tb["valid_first/bleu"]) == len(tb["valid_second/bleu"]) == 2
    assert tb["valid/bleu"] == pytest.approx([(x + y) / 2 for x, y in zip(
        tb["valid_first/bleu"], tb["valid_second/bleu"], strict=True)])
    assert (tmp_path / "a" / "cleaning.txt").read_text().split("\n")[2].split()[0] == "b"

    state = ckpt.load_checkpoint(tmp_path / "a/checkpoints/checkpoint_last.pt")
    data = load_data(ckpt.stored_training_config(state).data, tmp_path / "a",
                     tokenizers=ckpt.tokenizers_from_state(state))
    tag = data.tokenizers.src.tags["<bt>"]
    batch = data.train.collate(np.arange(len(data.train)))
    first_ids = batch.src[:, 0].tolist()
    assert first_ids.count(tag) == len(data.train.corpora[1])  # every pair of b, no other
    assert all(t == tag for t in first_ids[len(data.train.corpora[0]):])


# ---- mistakes stopped before training ------------------------------------------------------


@pytest.fixture
def corpus_files(tmp_path, multi30k_dir) -> dict[str, Path]:
    out = {}
    for lang in ("en", "de"):
        out[lang] = tmp_path / f"c.{lang}"
        out[lang].write_text("\n".join(lines(multi30k_dir, f"train.{lang}.gz")[:300]) + "\n")
    out["short"] = tmp_path / "short.de"
    out["short"].write_text("\n".join(lines(multi30k_dir, "train.de.gz")[:299]) + "\n")
    out["tagged"] = tmp_path / "tagged.en"
    text = lines(multi30k_dir, "train.en.gz")[:300]
    text[41] = "A <bt> in the text."
    out["tagged"].write_text("\n".join(text) + "\n")
    return out


def corpus_override(src: Path, tgt: Path, **extra: str) -> str:
    fields = ",".join([f"name:web,src:{src},tgt:{tgt}", *(f"{k}:{v}" for k, v in extra.items())])
    return f"data.corpora=[{{{fields}}}]"


@pytest.mark.parametrize("case", ["missing", "mismatched", "weight", "weight_text", "filter",
                                  "filter_value", "tag_in_text", "tag_form"])
def test_a_bad_corpus_entry_stops_with_one_line_naming_corpus_and_key(case, corpus_files,
                                                                       tmp_path, multi30k_dir):
    en, de = corpus_files["en"], corpus_files["de"]
    override, expected = {
        "missing": (corpus_override(en, tmp_path / "nope.de"),
                    "data.corpora[web].tgt: no such file"),
        "mismatched": (corpus_override(en, corpus_files["short"]),
                       "data.corpora[web]: "),
        "weight": (corpus_override(en, de, weight=-1), "data.corpora[web].weight"),
        "weight_text": (corpus_override(en, de, weight="abc"), "data.corpora"),
        "filter": (corpus_override(en, de, filters="{nope:true}"),
                   "data.corpora[web].filters: unknown filter 'nope'"),
        "filter_value": (corpus_override(en, de, filters="{max_ratio:0.5}"),
                         "data.corpora[web].filters.max_ratio"),
        "tag_in_text": (corpus_override(corpus_files["tagged"], de, tag="'<bt>'"),
                        "data.corpora[web]: "),
        "tag_form": (corpus_override(en, de, tag="bt"), "data.corpora[web].tag"),
    }[case]
    status, err = run_command(["prepare-data", f"data.root={multi30k_dir}", override,
                               "data.vocab_size=600", f"hydra.run.dir={tmp_path / 'run'}"])
    assert_reported(status, err)
    assert status == 1 and expected in err.splitlines()[-1], err
    if case == "mismatched":
        assert "has 300 lines but" in err and "299 lines" in err
    if case == "tag_in_text":
        assert "line 42 holds '<bt>'" in err
    assert not list((tmp_path / "run").glob("checkpoints/*"))


def test_the_one_corpus_forms_are_one_uncleaned_corpus_named_train(multi30k_dir):
    cfg = DataConfig(root=str(multi30k_dir))
    (corpus,) = cfg.training_corpora()
    assert (corpus.name, corpus.cleaning().is_none(), corpus.tgt_lang) == ("train", True, "de")
    assert [e.name for e in cfg.evaluation_sets("valid")] == ["valid"]
    assert cfg.reserved_tags() == [] and not cfg.lang_tags
    multi = DataConfig(root=str(multi30k_dir), corpora=[
        {"name": "de", "src": "a", "tgt": "b"},
        {"name": "fr", "src": "a", "tgt": "c", "tgt_lang": "fr", "tag": "<bt>"}])
    assert multi.target_languages() == ["de", "fr"] and multi.lang_tags
    assert multi.reserved_tags() == ["<2de>", "<2fr>", "<bt>"]
    assert multi.source_tags("<bt>", "fr") == ["<2fr>", "<bt>"]
    assert multi.corpora[0].cleaning().duplicates  # a listed corpus: basic by default


def test_the_multilingual_preset_names_three_pairs_under_data_root():
    cfg = compose_config(["experiment=multi30k_en_xx", "data.root=/data/m30k"])
    assert [c.name for c in cfg.data.corpora] == ["en-de", "en-fr", "en-cs"]
    assert cfg.data.corpora[2].tgt == "/data/m30k/train.cs.gz"
    assert cfg.data.reserved_tags() == ["<2cs>", "<2de>", "<2fr>"]
    assert [e.tgt_lang for e in cfg.data.evaluation_sets("test")] == ["de", "fr", "cs"]
    assert cfg.data.languages() == ["cs", "de", "en", "fr"]  # what Multi30k downloads
    assert cfg.optim.lr is None and cfg.trainer.max_target_tokens == 61_000_000  # the recipe's


def test_a_changed_filter_makes_a_new_store_and_an_unchanged_one_is_reused(
        corpus_files, tmp_path, multi30k_dir, multi30k_tokenizer_path, monkeypatch):
    from transformer.run import data as data_module

    def config(filters: str | dict) -> DataConfig:
        return DataConfig(root=str(multi30k_dir), spm_model=str(multi30k_tokenizer_path),
                          vocab_size=2000, corpora=[{"name": "web", "src": str(corpus_files["en"]),
                                                     "tgt": str(corpus_files["de"]),
                                                     "filters": filters}])

    basic = load_data(config("basic"), tmp_path / "run").train.corpora[0].path
    written = []
    monkeypatch.setattr(data_module, "write_split_store",
                        lambda directory, *args: written.append(directory))
    again = load_data(config("basic"), tmp_path / "run")
    assert again.train.corpora[0].path == basic and written == []  # reused
    assert again.cleaning["web"]["read"] == 300  # the counts come from the store
    with pytest.raises(DataError):  # the stub writes nothing: opening the new store fails
        load_data(config({"preset": "basic", "max_ratio": 2.0}), tmp_path / "run")
    assert len(written) == 1 and written[0] != basic
    assert written[0].parent == basic.parent


def test_an_uncleaned_store_keeps_the_name_earlier_versions_gave_it(tmp_path,
                                                                    multi30k_tokenizer_path):
    """Runs prepared by earlier versions find their stores again: without filters, the name
    is the hash of the same key (version, split, the files' paths, the tokenizers)."""
    import hashlib

    from transformer.data.cleaning import Filters
    from transformer.data.tokenizer import TokenizerPair
    from transformer.run.data import SplitFiles, _cleaning_key, store_path

    tok = Tokenizer.load(multi30k_tokenizer_path)
    files = SplitFiles(tmp_path / "a.en", tmp_path / "a.de")
    key = "|".join(["v2", "train", str(files.src.resolve()), str(files.tgt.resolve()),
                    tok.fingerprint, tok.fingerprint])
    old = tmp_path / f"train-{hashlib.sha256(key.encode()).hexdigest()[:20]}"
    corpus = DataConfig().training_corpora()[0]
    assert _cleaning_key(Filters.parse("none", "f"), corpus) is None
    assert store_path(files, "train", TokenizerPair(tok, tok), tmp_path) == old
    cleaned = _cleaning_key(Filters.parse("basic", "f"), corpus)
    assert store_path(files, "train", TokenizerPair(tok, tok), tmp_path, cleaned) != old
