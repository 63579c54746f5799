"""`data=multi30k_tok`: Multi30k's lowercased, Moses-tokenized files (`tok/*.lc.norm.tok.*`)
with 10,000 joint BPE pieces, as Wu et al. (2021) trained Transformer-Tiny, and BLEU scored
on that tokenized text (`--tokenize none`): the preset, the paths, the download, training
and `transformer translate --reference`."""

from __future__ import annotations

import dataclasses
import hashlib
import re
from pathlib import Path

import pytest
import sacrebleu
from omegaconf import OmegaConf

from transformer.cli import translate as translate_command
from transformer.data import multi30k
from transformer.data.store import read_meta
from transformer.errors import ConfigError
from transformer.run.checkpoint import load_checkpoint
from transformer.run.compose import CONFIG_DIR, compose_config
from transformer.run.data import corpus_files, eval_set_files
from transformer.run.data_config import DataConfig
from transformer.training import validation
from transformer.training.trainer import train

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

STEMS = ("train", "val", "test_2016_flickr")
TRAIN_TOK_SHA256 = {  # data/task1/tok/ of multi30k/dataset
    "cs": "7645fb91efa18f94c83d493f740a5d5a941e4b01efa6a124bf2d4af040e133e0",
    "de": "cb5a23529b65ec2061f1dc446192a9c37382b63cc75f81a0be59d34894b3a505",
    "en": "08925f8e0572bcd5a006702fc5fe20e2d77c6917d4eebd576fc20de6693c2119",
    "fr": "8fa41bb718412bcb7c5dfa58603842810a01543eae86a51279f9886b901266e1",
}


def tokenized(line: str) -> str:
    """Lowercased, punctuation split off: text of the kind of the dataset's tok/ files."""
    return " ".join(re.sub(r"([.,!?;:\"()])", r" \1 ", line.lower()).split())


@pytest.fixture
def tok_root(tmp_path, multi30k_lines) -> Path:
    """A Multi30k root with only tokenized en/de files (tok/), from the slice: 300 training
    pairs, 40 validation and 40 test pairs. No raw file: a tokenized run must not need one."""
    root = tmp_path / "multi30k"
    (root / "tok").mkdir(parents=True)
    for stem, n in zip(STEMS, (300, 40, 40), strict=True):
        for lang in ("en", "de"):
            lines = [tokenized(line) for line in multi30k_lines(f"{stem}.{lang}.gz")[:n]]
            (root / "tok" / f"{stem}.lc.norm.tok.{lang}").write_text(
                "".join(line + "\n" for line in lines), encoding="utf-8")
    return root


# ---- the preset and the config ------------------------------------------------------------


def test_preset_is_the_recipe_on_tokenized_bpe_data():
    tok, recipe = compose_config(["data=multi30k_tok"]), compose_config()
    assert (tok.data.name, tok.data.tokenized, tok.data.spm_model_type,
            tok.data.vocab_size) == ("multi30k", True, "bpe", 10000)
    assert recipe.data.tokenized is False
    assert (tok.model, tok.optim, tok.trainer, tok.seed) == (
        recipe.model, recipe.optim, recipe.trainer, recipe.seed)
    changed = {f.name for f in dataclasses.fields(DataConfig)
               if getattr(tok.data, f.name) != getattr(recipe.data, f.name)}
    assert changed == {"tokenized", "spm_model_type", "vocab_size"}
    assert compose_config(["experiment=multi30k_tok"]) == tok  # the same run either way
    override = compose_config(["data=multi30k_tok", "data.vocab_size=4000"])
    assert override.data.vocab_size == 4000  # the command line still wins
    yaml = OmegaConf.load(CONFIG_DIR / "data" / "multi30k_tok.yaml")
    assert list(yaml.keys()) == [f.name for f in dataclasses.fields(DataConfig)]


def test_tokenized_splits_are_the_tok_files(tmp_path):
    cfg = DataConfig(root=str(tmp_path), src_lang="fr", tgt_lang="cs", tokenized=True)
    tok = tmp_path / "tok"
    [corpus] = cfg.training_corpora()
    assert (corpus.src, corpus.tgt) == (str(tok / "train.lc.norm.tok.fr"),
                                        str(tok / "train.lc.norm.tok.cs"))
    [valid], [test] = cfg.evaluation_sets("valid"), cfg.evaluation_sets("test")
    assert (valid.src, valid.tgt) == (str(tok / "val.lc.norm.tok.fr"),
                                      str(tok / "val.lc.norm.tok.cs"))
    assert (test.src, test.tgt) == (str(tok / "test_2016_flickr.lc.norm.tok.fr"),
                                    str(tok / "test_2016_flickr.lc.norm.tok.cs"))
    assert multi30k.split_file(tmp_path, "valid", "en", tokenized=True) == \
        tok / "val.lc.norm.tok.en"
    raw = dataclasses.replace(cfg, tokenized=False)  # the raw files, as always
    assert raw.training_corpora()[0].src == str(tmp_path / "train.fr.gz")
    assert raw.evaluation_sets("test")[0].tgt == str(tmp_path / "test_2016_flickr.cs.gz")


def test_tokenized_needs_multi30k_and_a_bool():
    files = ["data=files", "data.train_src=a", "data.train_tgt=b", "data.valid_src=c",
             "data.valid_tgt=d"]
    assert compose_config(files).data.tokenized is False
    with pytest.raises(ConfigError, match="data.tokenized=true is for data.name=multi30k") \
            as info:
        compose_config([*files, "data.tokenized=true"])
    assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="data.tokenized must be true or false, got 'yes'"):
        DataConfig(tokenized="yes")
    with pytest.raises(ConfigError, match="data.tokenized"):
        compose_config(["data.tokenized=maybe"])


# ---- download -------------------------------------------------------------------------------


@pytest.fixture
def downloads(monkeypatch) -> list[tuple[str, Path, str]]:
    """Every (url, destination, sha256) asked of `multi30k.download_file`, which writes an
    empty file instead of downloading."""
    asked = []

    def fake(url, dest, sha256, **kwargs):
        asked.append((url, Path(dest), sha256))
        Path(dest).parent.mkdir(parents=True, exist_ok=True)
        Path(dest).write_bytes(b"")

    monkeypatch.setattr(multi30k, "download_file", fake)
    return asked


def test_tokenized_run_downloads_exactly_its_tok_files(tmp_path, downloads):
    root = tmp_path / "root"
    cfg = DataConfig(root=str(root), src_lang="fr", tgt_lang="en", tokenized=True)
    files = corpus_files(cfg)
    assert files[0][1].src == root / "tok" / "train.lc.norm.tok.fr"
    expected = {(multi30k.TOK_URL + f"{stem}.lc.norm.tok.{lang}",
                 root / "tok" / f"{stem}.lc.norm.tok.{lang}",
                 multi30k.SHA256[f"tok/{stem}.lc.norm.tok.{lang}"])
                for stem in STEMS for lang in ("fr", "en")}
    assert len(downloads) == 6 and set(downloads) == expected  # no raw file
    assert {sha for _, dest, sha in downloads if dest.name.startswith("train.")} == {
        TRAIN_TOK_SHA256["fr"], TRAIN_TOK_SHA256["en"]}
    assert eval_set_files(cfg, "test")[0][1].tgt == root / "tok/test_2016_flickr.lc.norm.tok.en"
    assert len(downloads) == 6  # all present: nothing more

    raw_root = tmp_path / "raw"  # the raw files, as before
    corpus_files(DataConfig(root=str(raw_root), src_lang="fr", tgt_lang="en"))
    assert {(url, dest) for url, dest, _ in downloads[6:]} == {
        (multi30k.URL + f"{stem}.{lang}.gz", raw_root / f"{stem}.{lang}.gz")
        for stem in STEMS for lang in ("fr", "en")}


def test_tok_checksums_match_the_dataset(full_multi30k):
    for lang, sha256 in TRAIN_TOK_SHA256.items():
        assert multi30k.SHA256[f"tok/train.lc.norm.tok.{lang}"] == sha256
    for lang in ("en", "de", "fr"):
        for stem in STEMS:
            name = f"tok/{stem}.lc.norm.tok.{lang}"
            digest = hashlib.sha256((full_multi30k / name).read_bytes()).hexdigest()
            assert digest == multi30k.SHA256[name], name


# ---- training and scoring -------------------------------------------------------------------


def test_training_reads_the_tok_files_and_scores_them_as_they_are(tok_root, tmp_path,
                                                                  monkeypatch, capsys):
    """A few updates on the tokenized files: the stores are built from tok/ (no raw file
    exists), validation BLEU is sacreBLEU with tokenize none, and `transformer translate
    --reference` on the checkpoint scores the same way and says so."""
    def no_download(url, *args, **kwargs):
        raise AssertionError(f"nothing should be downloaded, asked for {url}")

    monkeypatch.setattr(multi30k, "download_file", no_download)
    bleu_calls, original = [], sacrebleu.corpus_bleu

    def corpus_bleu(hyps, refs, **kwargs):
        score = original(hyps, refs, **kwargs)
        bleu_calls.append((list(hyps), [list(r) for r in refs], kwargs, score.score))
        return score

    monkeypatch.setattr(validation.sacrebleu, "corpus_bleu", corpus_bleu)
    run = tmp_path / "run"
    cfg = compose_config([
        "data=multi30k_tok", "model=tiny", f"data.root={tok_root}", "data.vocab_size=400",
        "data.max_tokens=1024", "model.num_hiddens=32", "model.ffn_num_hiddens=64",
        "model.num_heads=2", "model.num_encoder_layers=1", "model.num_decoder_layers=1",
        "optim.warmup_updates=2", "optim.cooldown=0", "optim.warmup_fraction=null",
        "trainer.validate_after_budget=0", "trainer.max_updates=3", "trainer.max_time=null",
        "trainer.precision=fp32", "trainer.bleu_max_sentences=12",
        "trainer.validate_every_updates=0", "trainer.log_every_updates=1",
        "trainer.keep_last=1"])
    result = train(cfg, run)

    assert result.stop_reason == "max_updates" and result.valid is not None
    tok = tok_root / "tok"
    sources = sorted(read_meta(store)["sources"]["tgt"]["path"]
                     for store in (run / "cache").iterdir() if store.is_dir())
    assert sources == sorted(str((tok / f"{stem}.lc.norm.tok.de").resolve())
                             for stem in STEMS)
    assert sorted(p.name for p in tok_root.iterdir()) == ["tok"]  # no raw file fetched
    hyps, refs, kwargs, score = bleu_calls[-1]
    assert kwargs == {"tokenize": "none"}
    assert refs == [(tok / "val.lc.norm.tok.de").read_text().splitlines()[:12]]
    assert result.valid.bleu == score
    stored = load_checkpoint(run / "checkpoints" / "checkpoint_last.pt")["config"]
    assert stored["data"]["tokenized"] is True
    capsys.readouterr()

    # transformer translate --reference: BLEU with tokenize none, and a line saying so.
    # Each translation begins with its tokenized reference (--prefix: a model of 3 updates
    # translates nothing), scored against the reference with "." and "," attached to their
    # words, which 13a would split off again: the two tokenizations give different BLEU.
    tok_refs = (tok / "val.lc.norm.tok.de").read_text(encoding="utf-8").splitlines()
    prefix, ref, out = tmp_path / "prefix.de", tmp_path / "ref.de", tmp_path / "hyp.de"
    prefix.write_text("".join(line + "\n" for line in tok_refs), encoding="utf-8")
    references = [line.replace(" .", ".").replace(" ,", ",") for line in tok_refs]
    ref.write_text("".join(line + "\n" for line in references), encoding="utf-8")
    assert translate_command.main([
        "--checkpoint", str(run), "--input", str(tok / "val.lc.norm.tok.en"), "--output",
        str(out), "--device", "cpu", "--beam-size", "2", "--prefix", str(prefix),
        "--reference", str(ref)]) == 0
    err = capsys.readouterr().err.splitlines()
    assert ("scored with --tokenize none: the model was trained on tokenized text "
            "(data.tokenized)") in err
    [bleu_line] = [line for line in err if line.lstrip().startswith("BLEU|")]
    assert "|tok:none|" in bleu_line
    printed = float(bleu_line.split(" = ")[1].split()[0])
    hyps = out.read_text(encoding="utf-8").splitlines()
    none = original(hyps, [references], tokenize="none").score
    assert printed == round(none, 1) > 0
    assert round(original(hyps, [references]).score, 1) != printed  # 13a's
