"""Users' own parallel files, in the shapes they come in: CRLF, a BOM, tabs, empty lines, a
2,000-word line (training, validation, translation input), Latin-1 bytes, one side a line
longer, no final newline, a lone "\\r", control characters. Each is handled (a training
corpus's pairs counted in the cleaning table) or refused in one line naming file and line."""

from __future__ import annotations

import gzip
import logging
from pathlib import Path

import pytest
from conftest import MULTI30K_SLICE, assert_reported, run_command  # tests/conftest.py

from transformer.data.cleaning import REASONS
from transformer.data.tokenizer import EOS_ID, Tokenizer
from transformer.decoding.corpus import search_corpus
from transformer.decoding.request import DecodingRequest
from transformer.errors import DataError
from transformer.model.loss import evaluate_loss
from transformer.run.checkpoint import load_checkpoint, model_from_checkpoint
from transformer.run.data import CLEANING_REPORT, load_data
from transformer.run.data_config import DataConfig

CLEAN = 20  # clean Multi30k pairs in every training file
LONG = " ".join(["a man rides a bike"] * 400)  # 2,000 words
LONG_DE = " ".join(["ein Mann fährt ein Fahrrad"] * 400)
NO_CUTS = dict.fromkeys(REASONS, 0)


def multi30k(name: str, n: int = CLEAN) -> list[str]:
    """The first `n` lines of a file of the Multi30k slice."""
    return gzip.decompress((MULTI30K_SLICE / name).read_bytes()).decode("utf-8").split("\n")[:n]


def write(path: Path, data: str | bytes) -> str:
    """Bytes as given, or text as UTF-8 with its line ends untouched; the path as a str."""
    path.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
    return str(path)


def lines(text: list[str], end: str = "\n") -> str:
    return "".join(line + end for line in text)


@pytest.fixture
def tokenizer(multi30k_small_tokenizer_path) -> Tokenizer:
    return Tokenizer.load(multi30k_small_tokenizer_path)


def config(tmp_path: Path, spm: Path, train: tuple[str | bytes, str | bytes],
           valid: tuple[str | bytes, str | bytes] | None = None, **options) -> DataConfig:
    """`data=files` over the given contents (a clean validation set by default), with the
    small Multi30k tokenizer and data.max_len 64 (the random checkpoint's positions)."""
    valid = valid or (lines(multi30k("val.en.gz", 5)), lines(multi30k("val.de.gz", 5)))
    paths = {key: write(tmp_path / name, data) for key, name, data in [
        ("train_src", "train.en", train[0]), ("train_tgt", "train.de", train[1]),
        ("valid_src", "valid.en", valid[0]), ("valid_tgt", "valid.de", valid[1])]}
    return DataConfig(**{"name": "files", "spm_model": str(spm), "max_len": 64,
                         "max_tokens": 512, **paths, **options})


def table_row(run: Path) -> list[str]:
    """The training corpus's row of run/cleaning.txt, as written."""
    header, row = (run / CLEANING_REPORT).read_text().splitlines()
    assert header.split() == ["corpus", "read", *REASONS, "max_len", "kept"]
    return row.split()


def assert_counts(run: Path, counts: dict[str, int], read: int, **removed: int) -> None:
    """The cleaning table (in memory and in cleaning.txt): `read` pairs, `removed` by their
    filter (or max_len), the rest kept; every pair read is accounted for."""
    expected = {"read": read, **NO_CUTS, "max_len": 0, **removed}
    expected["kept"] = read - sum(removed.values())
    assert counts == expected
    assert table_row(run) == ["train", *(f"{expected[c]:,}" for c in expected)]


def one_line(info: pytest.ExceptionInfo) -> str:
    message = str(info.value)
    assert message and "\n" not in message
    return message


# ---- line ends, BOM, tabs --------------------------------------------------------------------


def test_crlf_line_endings_read_as_lines(tmp_path, multi30k_small_tokenizer_path, tokenizer):
    src, tgt = multi30k("train.en.gz"), multi30k("train.de.gz")
    cfg = config(tmp_path, multi30k_small_tokenizer_path, (lines(src, "\r\n"), lines(tgt, "\r\n")),
                 (lines(["A dog.", "Two cats."], "\r\n"), lines(["Ein Hund.", "Zwei."], "\r\n")))
    data = load_data(cfg, tmp_path / "run")
    assert_counts(tmp_path / "run", data.cleaning["train"], CLEAN)
    train = data.train.corpora[0]
    assert [train.pair(i) for i in range(CLEAN)] == list(zip(
        tokenizer.encode_batch(src), tokenizer.encode_batch(tgt), strict=True))
    assert data.valid.src_text == ["A dog.", "Two cats."]  # no "\r" left
    assert data.valid.tgt_text == ["Ein Hund.", "Zwei."]


def test_utf8_bom_is_dropped(tmp_path, multi30k_small_tokenizer_path, tokenizer):
    src, tgt = multi30k("train.en.gz"), multi30k("train.de.gz")
    cfg = config(tmp_path, multi30k_small_tokenizer_path,
                 ("\ufeff" + lines(src), "\ufeff" + lines(tgt)),
                 ("\ufeffA dog.\n", "\ufeffEin Hund.\n"))
    data = load_data(cfg, tmp_path / "run")
    assert_counts(tmp_path / "run", data.cleaning["train"], CLEAN)
    assert data.train.corpora[0].pair(0) == (tokenizer.encode_batch([src[0]])[0],
                                             tokenizer.encode_batch([tgt[0]])[0])
    assert (data.valid.src_text, data.valid.tgt_text) == (["A dog."], ["Ein Hund."])


def test_tabs_inside_lines_are_spaces_and_a_line_of_tabs_is_empty(
        tmp_path, multi30k_small_tokenizer_path, tokenizer):
    src, tgt = multi30k("train.en.gz"), multi30k("train.de.gz")
    src[3], tgt[3] = src[3].replace(" ", "\t"), tgt[3].replace(" ", " \t ")
    src[7] = "\t\t"  # whitespace only: an empty side
    cfg = config(tmp_path, multi30k_small_tokenizer_path, (lines(src), lines(tgt)))
    data = load_data(cfg, tmp_path / "run")
    assert_counts(tmp_path / "run", data.cleaning["train"], CLEAN, empty=1)
    train = data.train.corpora[0]
    assert train.lines.tolist() == [i for i in range(CLEAN) if i != 7]
    with_spaces = [line.replace("\t", " ") for line in (src[3], tgt[3])]
    assert train.pair(3) == tuple(tokenizer.encode_batch(with_spaces))


def test_no_final_newline_a_lone_cr_and_control_characters(tmp_path,
                                                           multi30k_small_tokenizer_path):
    src, tgt = multi30k("train.en.gz"), multi30k("train.de.gz")
    src[2] = src[2].replace(" ", "\r", 1)  # a lone "\r": a space, never a line end
    src[4], tgt[5] = "a\x00b c", "ein \x01 Mann"  # NUL, another control character
    train = (lines(src)[:-1], lines(tgt))  # the source without its final newline
    cfg = config(tmp_path, multi30k_small_tokenizer_path, train)
    data = load_data(cfg, tmp_path / "run")  # filters none: kept, as text
    assert_counts(tmp_path / "run", data.cleaning["train"], CLEAN)
    basic = config(tmp_path, multi30k_small_tokenizer_path, train, filters="basic")
    data = load_data(basic, tmp_path / "basic")  # the empty filter takes control characters
    assert_counts(tmp_path / "basic", data.cleaning["train"], CLEAN, empty=2)
    assert 4 not in data.train.corpora[0].lines and 5 not in data.train.corpora[0].lines


# ---- empty lines ----------------------------------------------------------------------------


@pytest.mark.parametrize("filters", ["none", "basic"])
def test_empty_lines_in_training_are_counted(tmp_path, multi30k_small_tokenizer_path, filters):
    src, tgt = multi30k("train.en.gz"), multi30k("train.de.gz")
    for i in (1, 2):
        src[i] = ""  # source only
    tgt[6] = ""  # target only
    for i in (10, 11):
        src[i] = tgt[i] = ""  # both
    src[12] = "   "  # whitespace only
    cfg = config(tmp_path, multi30k_small_tokenizer_path, (lines(src), lines(tgt)),
                 filters=filters)
    data = load_data(cfg, tmp_path / "run")
    assert_counts(tmp_path / "run", data.cleaning["train"], CLEAN, empty=6)


def test_empty_lines_in_validation_are_kept_and_scored(tmp_path, multi30k_small_tokenizer_path,
                                                       random_checkpoint):
    valid = (lines(["A dog runs.", "", "", "Two men talk."]),
             lines(["Ein Hund rennt.", "Leer.", "", ""]))
    cfg = config(tmp_path, multi30k_small_tokenizer_path,
                 (lines(multi30k("train.en.gz")), lines(multi30k("train.de.gz"))), valid)
    data = load_data(cfg, tmp_path / "run")
    assert len(data.valid) == 4 and data.valid.src_text[1:3] == ["", ""]
    assert data.valid.collate([1]).src.tolist() == [[EOS_ID]]
    validate(data, random_checkpoint)  # as training validates: no error


def validate(data, checkpoint: Path) -> None:
    """What training's validation does with the first validation set: the loss over its
    batches, greedy translations of every sentence (the random checkpoint: 64 positions)."""
    path = str(checkpoint)
    model = model_from_checkpoint(load_checkpoint(path), path)
    corpus = data.valid
    report = evaluate_loss(model, (corpus.collate(b) for b in data.eval_batches("valid")))
    assert report.tokens == int(corpus.tgt_lens.sum()) + len(corpus)
    sources = [corpus.pair(i)[0] + [EOS_ID] for i in range(len(corpus))]
    request = DecodingRequest(beam_size=1)
    assert len(search_corpus(model, sources, request, max_tokens=512)) == len(corpus)


def test_an_empty_validation_set_is_refused(tmp_path, multi30k_small_tokenizer_path):
    cfg = config(tmp_path, multi30k_small_tokenizer_path,
                 (lines(multi30k("train.en.gz")), lines(multi30k("train.de.gz"))), ("", ""))
    with pytest.raises(DataError) as info:
        load_data(cfg, tmp_path / "run")
    assert one_line(info) == f"data.valid: no lines in {cfg.valid_src} / {cfg.valid_tgt}"


# ---- a 2,000-word line ------------------------------------------------------------------------


def test_long_line_in_training_is_counted(tmp_path, multi30k_small_tokenizer_path):
    src, tgt = multi30k("train.en.gz"), multi30k("train.de.gz")
    src[3], tgt[3] = LONG, LONG_DE  # both sides: longer than data.max_len
    src[8] = LONG  # one side only: max_ratio, where it is on
    cfg = config(tmp_path, multi30k_small_tokenizer_path, (lines(src), lines(tgt)))
    data = load_data(cfg, tmp_path / "run")
    assert_counts(tmp_path / "run", data.cleaning["train"], CLEAN, max_len=2)
    basic = config(tmp_path, multi30k_small_tokenizer_path, (lines(src), lines(tgt)),
                   filters="basic")
    data = load_data(basic, tmp_path / "basic")
    assert_counts(tmp_path / "basic", data.cleaning["train"], CLEAN, max_ratio=1, max_len=1)


def test_long_line_with_a_tokenizer_trained_on_it_is_counted(tmp_path):
    """SentencePiece's trainer skips lines over 4,192 bytes in its sample; the corpus keeps
    the pair and the table counts it (max_len)."""
    n = 300  # enough text for a vocabulary
    src, tgt = multi30k("train.en.gz", n), multi30k("train.de.gz", n)
    src[9], tgt[9] = LONG, LONG_DE
    cfg = config(tmp_path, Path("unused"), (lines(src), lines(tgt)), spm_model=None,
                 vocab_size=None, max_len=256)
    data = load_data(cfg, tmp_path / "run")
    assert (tmp_path / "run" / "spm.model").is_file()
    assert_counts(tmp_path / "run", data.cleaning["train"], n, max_len=1)


@pytest.mark.parametrize("split", ["valid", "test"])
def test_long_line_in_an_evaluation_set_is_cut_to_max_len(
        tmp_path, multi30k_small_tokenizer_path, random_checkpoint, caplog, split):
    caplog.set_level(logging.WARNING, logger="transformer")
    src, tgt = ["A dog runs.", LONG, "Two men talk."], ["Ein Hund rennt.", "Ein Mann.", LONG]
    given = (lines(src), lines(tgt))
    files = {f"{split}_src": write(tmp_path / f"{split}.en", given[0]),
             f"{split}_tgt": write(tmp_path / f"{split}.de", given[1])}
    cfg = config(tmp_path, multi30k_small_tokenizer_path,
                 (lines(multi30k("train.en.gz")), lines(multi30k("train.de.gz"))),
                 given if split == "valid" else None, **files)
    data = load_data(cfg, tmp_path / "run")
    corpus = data.valid_sets[split] if split == "valid" else data.test_sets["test"]
    assert len(corpus) == 3 and corpus.lines.tolist() == [0, 1, 2]
    assert corpus.src_lens.tolist()[1] == corpus.tgt_lens.tolist()[2] == 63  # max_len - 1
    assert (corpus.src_text, corpus.tgt_text) == (src, tgt)  # the references stay whole
    assert (f"data.{split}: 2 pair(s) longer than data.max_len=64 (line(s) 2, 3 of "
            f"{files[f'{split}_src']} / {files[f'{split}_tgt']}); read as their first 63 "
            "source and 63 target pieces") in caplog.text
    if split == "valid":
        validate(data, random_checkpoint)  # without the cut: more positions than the model's


def test_long_line_in_translation_input_is_truncated_naming_the_line(tmp_path,
                                                                     random_checkpoint,
                                                                     tokenizer):
    given = write(tmp_path / "input.en", lines(["A dog runs.", LONG, "", "Two men talk."]))
    out = tmp_path / "out.de"
    status, err = run_command(["translate", "--checkpoint", str(random_checkpoint), "--input",
                               given, "--output", str(out), "--device", "cpu"])
    assert_reported(status, err)
    assert status == 0
    pieces = len(tokenizer.encode_batch([LONG])[0])
    assert (f"line 2 has {pieces} source tokens, more than the model's limit of 63; "
            "translating its first 63") in err
    translations = out.read_text(encoding="utf-8").split("\n")
    assert len(translations) == 5 and translations[2] == translations[4] == ""


def test_translation_input_in_every_shape(tmp_path, random_checkpoint):
    """CRLF, a BOM, tabs, a lone "\\r", an empty line, no final newline: one output line per
    input line, the empty one empty."""
    given = write(tmp_path / "input.en", "\ufeffA dog.\r\nTwo\tmen\r\n\r\nA cat\rsleeps.")
    out = tmp_path / "out.de"
    status, err = run_command(["translate", "--checkpoint", str(random_checkpoint), "--input",
                               given, "--output", str(out), "--device", "cpu"])
    assert_reported(status, err)
    assert status == 0
    translations = out.read_text(encoding="utf-8").split("\n")
    assert len(translations) == 5 and translations[2] == translations[4] == ""


# ---- refused: Latin-1 bytes, misaligned files ----------------------------------------------


LATIN1_LINE = "Un caf\xe9 cr\xe8me.".encode("latin-1")  # é: 0xe9 at byte 7


@pytest.mark.parametrize("side", ["train_src", "valid_tgt"])
def test_latin1_bytes_are_refused_naming_file_and_line(tmp_path, multi30k_small_tokenizer_path,
                                                       side):
    src, tgt = multi30k("train.en.gz"), multi30k("train.de.gz")
    train = [lines(src).encode(), lines(tgt).encode()]
    valid = [b"A dog.\nA cat.\n", b"Ein Hund.\nEine Katze.\n"]
    files = {"train_src": train, "valid_tgt": valid}[side]
    index = 0 if side.endswith("src") else 1
    files[index] = b"".join(files[index].splitlines(keepends=True)[:1] + [LATIN1_LINE + b"\n"]
                            + files[index].splitlines(keepends=True)[2:])
    cfg = config(tmp_path, multi30k_small_tokenizer_path, tuple(train), tuple(valid))
    with pytest.raises(DataError) as info:
        load_data(cfg, tmp_path / "run")
    assert one_line(info) == (f"{getattr(cfg, side)}, line 2: invalid UTF-8 (byte 0xe9 at "
                              "byte 7 of the line); text must be UTF-8: convert the file, "
                              "e.g. iconv -f latin1 -t utf-8")
    assert not list((tmp_path / "run" / "cache").glob(f"{side[:5]}-*"))  # no store


def test_latin1_bytes_refused_by_the_commands(tmp_path, multi30k_small_tokenizer_path,
                                              random_checkpoint):
    bad = write(tmp_path / "bad.en", b"A dog.\n" + LATIN1_LINE + b"\n")
    good = write(tmp_path / "good.de", "Ein Hund.\nEin Kaffee.\n")
    status, err = run_command(["prepare-data", "data=files", f"data.train_src={bad}",
                               f"data.train_tgt={good}", f"data.valid_src={bad}",
                               f"data.valid_tgt={good}",
                               f"data.spm_model={multi30k_small_tokenizer_path}",
                               f"hydra.run.dir={tmp_path / 'run'}"])
    assert_reported(status, err)
    assert err.splitlines()[-1].startswith(f"error: {bad}, line 2: invalid UTF-8 (byte 0xe9")
    status, err = run_command(["translate", "--checkpoint", str(random_checkpoint), "--input",
                               bad, "--output", str(tmp_path / "out"), "--device", "cpu"])
    assert_reported(status, err)
    assert err.splitlines()[-1].startswith(f"error: {bad}, line 2: invalid UTF-8 (byte 0xe9")


@pytest.mark.parametrize("tokenizer_given", [True, False])
def test_one_side_a_line_longer_is_refused_before_any_work(
        tmp_path, multi30k_small_tokenizer_path, tokenizer_given):
    """Refused while preparing, before training: with the tokenizer given, by the line
    counts before any pair is encoded; otherwise when the SentencePiece sample's stream
    reaches the end of the shorter file, before SentencePiece trains."""
    src, tgt = multi30k("train.en.gz", CLEAN + 1), multi30k("train.de.gz")
    options = {} if tokenizer_given else {"spm_model": None}
    cfg = config(tmp_path, multi30k_small_tokenizer_path, (lines(src), lines(tgt)), **options)
    with pytest.raises(DataError) as info:
        load_data(cfg, tmp_path / "run")
    assert one_line(info) == (f"data.train: {cfg.train_src} has 21 lines but {cfg.train_tgt} "
                              "has 20 lines; source and target files must be line-aligned")
    run = tmp_path / "run"
    assert not (run / "spm.model").exists() and not (run / CLEANING_REPORT).exists()
    assert not (run / "cache").exists() or not list((run / "cache").iterdir())


def test_one_side_a_line_longer_refused_by_prepare_data(tmp_path,
                                                       multi30k_small_tokenizer_path):
    src = write(tmp_path / "train.en", lines(multi30k("train.en.gz")))
    tgt = write(tmp_path / "train.de", lines(multi30k("train.de.gz", CLEAN - 1)))
    status, err = run_command(["prepare-data", "data=files", f"data.train_src={src}",
                               f"data.train_tgt={tgt}", f"data.valid_src={src}",
                               f"data.valid_tgt={src}",
                               f"data.spm_model={multi30k_small_tokenizer_path}",
                               f"hydra.run.dir={tmp_path / 'run'}"])
    assert_reported(status, err)
    assert err.splitlines()[-1] == (f"error: data.train: {src} has 20 lines but {tgt} has 19 "
                                    "lines; source and target files must be line-aligned")
