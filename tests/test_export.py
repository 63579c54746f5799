"""CTranslate2 export (`transformer export`) and the ctranslate2 engine (--engine ctranslate2),
checked against our PyTorch engine's own output on a model trained here.

The model: `en_de_checkpoint` (conftest.py), en->de on the Multi30k slice, trained for a few
hundred updates: weak, but a real translation model with peaked and flat distributions alike.
"""

from __future__ import annotations

import collections
import json
import re
import sys
from pathlib import Path

import pytest
import sacrebleu
import torch
from outputs import scored

from transformer import hardware
from transformer.cli import export as export_command
from transformer.cli import translate as translate_command
from transformer.cli.reports import translate_lines
from transformer.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, Tokenizer, TokenizerPair
from transformer.decoding.request import AlignmentOptions, RequestError, Sampling
from transformer.decoding.translator import Translator
from transformer.decoding.vocab_map import MIN_PAIRS, VocabMap, build_vocab_map
from transformer.deploy.engines import CTranslate2Translator, load_translator
from transformer.deploy.export import (
    INT8_WEIGHT_MAX,
    VOCAB_MAP,
    export_ctranslate2,
    quantize_spec,
    read_export,
    transformer_spec,
)
from transformer.errors import MissingDependency
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run.checkpoint import inference_checkpoint, save_checkpoint
from transformer.run.config import TrainConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

ROOT = Path(__file__).resolve().parents[1]




def save(model: Transformer, tokenizer: Tokenizer, path: Path, **extra) -> Path:
    save_checkpoint(inference_checkpoint(model, TokenizerPair(tokenizer, tokenizer),
                                         training_config=TrainConfig(), **extra), path)
    return path


# ---- fixtures -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def tokenizer(multi30k_tokenizer) -> Tokenizer:
    return multi30k_tokenizer


@pytest.fixture(scope="module")
def test_text(multi30k_lines) -> tuple[list[str], list[str]]:
    return multi30k_lines("test_2016_flickr.en.gz"), multi30k_lines("test_2016_flickr.de.gz")


@pytest.fixture(scope="module")
def checkpoint(en_de_checkpoint) -> Path:
    return en_de_checkpoint


@pytest.fixture(scope="module")
def torch_translator(checkpoint) -> Translator:
    return Translator.load(checkpoint, device="cpu")


@pytest.fixture(scope="module")
def exports(torch_translator, tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("exports")
    for quantization in ("float32", "int8"):
        export_ctranslate2(torch_translator, folder / quantization, quantization=quantization)
    return {q: folder / q for q in ("float32", "int8")}


@pytest.fixture(scope="module")
def ct2(exports) -> dict[str, CTranslate2Translator]:
    return {q: load_translator(path, "ctranslate2", device="cpu", threads=1)
            for q, path in exports.items()}


def same_fraction(a: list[str], b: list[str]) -> float:
    assert len(a) == len(b)
    return sum(x == y for x, y in zip(a, b, strict=True)) / len(a)


def bleu(hyps: list[str], refs: list[str]) -> float:
    return sacrebleu.corpus_bleu(hyps, [refs]).score


# ---- equivalence with our engine --------------------------------------------------------------

def test_float32_greedy_is_our_greedy(torch_translator, ct2, test_text):
    """Greedy search is the same argmax in both engines: >= 99% identical outputs (a flip
    needs two logits within float rounding of each other), and the same log-probs: within
    1e-3 (relative) for 99% of the identical outputs (the median differs by ~4e-7), and within
    1e-2 for all (a weak model's rare output gathers ~1e-3 of rounding)."""
    src, refs = test_text
    ours = scored(torch_translator.translations(src, beam_size=1))
    theirs = scored(ct2["float32"].translations(src, beam_size=1))
    ours_text, theirs_text = [s[0][0] for s in ours], [s[0][0] for s in theirs]
    assert same_fraction(ours_text, theirs_text) >= 0.99
    assert 1.0 < bleu(ours_text, refs)  # a real (weak) model, not an empty output
    # the same log-probs, also where the length limit cut it
    relative = [abs(b[0][1] - a[0][1]) / abs(a[0][1])
                for a, b in zip(ours, theirs, strict=True) if a[0][0] == b[0][0]]
    assert sum(r <= 1e-3 for r in relative) >= 0.99 * len(relative)
    assert max(relative) <= 1e-2


def test_float32_beam_within_0_2_bleu(torch_translator, ct2, test_text):
    """Beam 5, alpha 1 (GNMT): CTranslate2 searches by log-prob (length_penalty=0) and its
    finished hypotheses are ranked by our GNMT score (see transformer/engines.py)."""
    src, refs = test_text
    ours = torch_translator.translate(src, beam_size=5, alpha=1.0)
    theirs = ct2["float32"].translate(src, beam_size=5, alpha=1.0)
    assert abs(bleu(theirs, refs) - bleu(ours, refs)) <= 0.2
    assert same_fraction(ours, theirs) >= 0.9


def test_greedy_with_prefixes_is_our_greedy(torch_translator, ct2, test_text):
    """A target prefix (the reference's first two words) forces the same start in both
    engines, and greedy search goes on from it the same way."""
    src, refs = test_text[0][:200], test_text[1][:200]
    prefixes = [" ".join(ref.split()[:2]) if i % 3 else "" for i, ref in enumerate(refs)]
    ours = torch_translator.translate(src, beam_size=1, prefixes=prefixes)
    theirs = ct2["float32"].translate(src, beam_size=1, prefixes=prefixes)
    assert same_fraction(ours, theirs) >= 0.99
    for out, prefix in zip(ours, prefixes, strict=True):
        assert out.startswith(prefix)
    beam = ct2["float32"].translate(src[:20], beam_size=4, prefixes=prefixes[:20])
    assert all(out.startswith(prefix) for out, prefix in zip(beam, prefixes[:20], strict=True))


def test_scores_agree_within_1e_3_per_token(torch_translator, ct2, test_text):
    src, refs = test_text[0][:100], test_text[1][:100]
    ours = torch_translator.score(src, refs, alpha=1.0)
    theirs = ct2["float32"].score(src, refs, alpha=1.0)
    for a, b in zip(ours, theirs, strict=True):
        assert a.tokens == b.tokens
        assert b.log_prob == pytest.approx(a.log_prob, abs=1e-3 * (len(a.tokens) + 1))
        assert b.score == pytest.approx(a.log_prob / ((5 + len(a.tokens) + 1) / 6), rel=1e-3)


def test_alignments_and_sampling_through_ctranslate2(torch_translator, ct2, exports,
                                                    test_text):
    """CTranslate2's `return_attention` is the last layer's attention averaged over heads,
    as ours: the same word alignments; top-k 1 is greedy, and a fresh engine repeats its
    draws for a seed."""
    src = test_text[0][:100]
    ours = torch_translator.translations(src, beam_size=1, alignment=AlignmentOptions())
    theirs = ct2["float32"].translations(src, beam_size=1, alignment=AlignmentOptions())
    same = [a[0].alignment == b[0].alignment for a, b in zip(ours, theirs, strict=True)
            if a[0].text == b[0].text]
    assert len(same) >= 95 and sum(same) >= 0.95 * len(same)
    with pytest.raises(RequestError, match="alignment_layer") as info:
        ct2["float32"].translations(src[:2], alignment=AlignmentOptions(layer=0))
    assert info.value.field == "alignment_layer"
    with pytest.raises(RequestError, match="no lexically constrained search") as info:
        ct2["float32"].translations(src[:2], constraints=[["Hund"], []])
    assert info.value.field == "constraints"
    engine = ct2["float32"]
    assert engine.translate(src, sampling=Sampling(topk=1)) == engine.translate(src,
                                                                                 beam_size=1)
    # CTranslate2 seeds a thread's generator at its first draw: fresh one-thread engines
    # repeat their draws for a seed
    draws = [load_translator(exports["float32"], "ctranslate2", device="cpu", threads=1)
             .translate(src, sampling=Sampling(topk=0, seed=3)) for _ in range(2)]
    assert draws[0] == draws[1]
    assert draws[0] != engine.translate(src, beam_size=1)  # a draw, not the argmax


def test_int8_within_0_5_bleu_at_under_30_percent_of_the_size(torch_translator, ct2, exports,
                                                     test_text):
    src, refs = test_text
    ours = torch_translator.translate(src, beam_size=5, alpha=1.0)
    int8 = ct2["int8"].translate(src, beam_size=5, alpha=1.0)
    assert abs(bleu(int8, refs) - bleu(ours, refs)) <= 0.5
    sizes = {q: (path / "model.bin").stat().st_size for q, path in exports.items()}
    assert sizes["int8"] <= 0.3 * sizes["float32"], sizes


def test_int8_weights_are_seven_bit_roundings_of_the_float32_weights(torch_translator):
    """Every int8 matrix of an int8 export: per row, scale = 63 / max |w| and q = round(w x
    scale), so |q| <= 63, each nonzero row reaches 63, and q / scale is within half a step
    of the float32 weight."""
    model, tokenizers = torch_translator.model, torch_translator.tokenizers
    floats = transformer_spec(model, tokenizers)
    floats.validate()
    quantized = transformer_spec(model, tokenizers)
    quantized.validate()
    quantize_spec(quantized, "int8")
    weights = floats.variables()
    variables = quantized.variables()
    int8 = {name: value for name, value in variables.items()
            if getattr(value, "dtype", None) == "int8" and f"{name}_scale" in variables}
    assert len(int8) >= 4 * model.config.num_encoder_layers  # QKV, W_o, two FFN layers
    for name, value in int8.items():
        q = value.numpy().astype("float32")
        scale = variables[f"{name}_scale"].numpy()[:, None]
        w = weights[name].numpy()
        assert abs(q).max(axis=1).tolist() == [
            INT8_WEIGHT_MAX if row.any() else 0 for row in w], name
        assert (abs(q / scale - w) <= 0.5 / scale + 1e-7).all(), name


def test_int8_export_scores_as_float32_does(ct2, test_text):
    """Forced decoding of the references: the int8 export's log-probabilities within 0.02
    nats a token of the float32 export's on average, on any x86 CPU (with CTranslate2's own
    8-bit weights the mean is ~0.08 on an AVX2 CPU without VNNI, whose int8 product
    saturates, and ~0.006 with the exact product)."""
    src, refs = (lines[:150] for lines in test_text)
    float32 = ct2["float32"].score(src, refs, alpha=1.0)
    int8 = ct2["int8"].score(src, refs, alpha=1.0)
    tokens = sum(len(s.tokens) + 1 for s in float32)
    mean = sum(abs(a.log_prob - b.log_prob) for a, b in zip(float32, int8, strict=True)) / tokens
    assert mean <= 0.02, mean


def test_nbest_scores_and_blank_lines_follow_our_conventions(torch_translator, ct2):
    lines = ["A man rides a bike.", "", "Two dogs play in the snow.", "   "]
    ours = scored(torch_translator.translations(lines, beam_size=4, nbest=3, max_tokens=16))
    theirs = scored(ct2["float32"].translations(lines, beam_size=4, nbest=3, max_tokens=16))
    assert [len(s) for s in theirs] == [3, 3, 3, 3]
    assert theirs[1] == theirs[3] == [("", 0.0)] * 3
    for s in theirs:
        assert [score for _, score in s] == sorted((score for _, score in s), reverse=True)
    # A translation both n-best lists hold has the same GNMT score in both.
    common = [(score, dict(o)[text]) for s, o in zip(theirs, ours, strict=True) for text, score in s
              if text in dict(o) and text]
    assert common
    for score, our_score in common:
        assert score == pytest.approx(our_score, rel=1e-3)
    plain = ct2["float32"].translate(lines, beam_size=4)
    assert plain == [s[0][0] for s in theirs]


def test_export_keeps_tokenizer_decoding_defaults_and_languages(ct2, torch_translator,
                                                                exports):
    translator = ct2["float32"]
    assert translator.engine == "ctranslate2" and torch_translator.engine == "torch"
    assert translator.decoding == torch_translator.decoding  # stored alpha 1, beam 4
    assert translator.tokenizers.src == torch_translator.tokenizers.src
    assert translator.model_config == torch_translator.model.config
    assert translator.training_config == torch_translator.training_config == TrainConfig()
    info, _ = read_export(exports["int8"])
    assert info.quantization == "int8" and info.languages == {"src": "en", "tgt": "de"}


def test_max_length_is_cut_per_sentence_as_ours(torch_translator, ct2, test_text):
    """CTranslate2 gets one length limit per batch; each output is cut to its own."""
    src = test_text[0][:40]
    ours = torch_translator.translate(src, beam_size=1, max_len_a=0.0, max_len_b=3)
    theirs = ct2["float32"].translate(src, beam_size=1, max_len_a=0.0, max_len_b=3)
    assert same_fraction(ours, theirs) >= 0.97


def test_beam_search_at_the_length_limit_is_ours(torch_translator, ct2, test_text):
    """Beam 5 where the limit ends most outputs, a different limit per sentence of a batch:
    each sentence whose hypotheses ran past its own limit is searched again with it, and
    ends with the beam ours forces EOS onto: the same outputs (cut to the limit alone,
    0.44 of them), the same scores. What may still differ: an empty output, which ours can
    end with (EOS first) and CTranslate2 does not."""
    src = test_text[0][:100]
    ours = scored(torch_translator.translations(src, beam_size=5, max_len_a=0.5, max_len_b=2))
    theirs = scored(ct2["float32"].translations(src, beam_size=5, max_len_a=0.5, max_len_b=2))
    unlimited = torch_translator.translate(src, beam_size=5)
    assert same_fraction([o[0][0] for o in ours], unlimited) <= 0.2  # the limit bites
    assert same_fraction([o[0][0] for o in ours], [t[0][0] for t in theirs]) >= 0.97
    assert all(abs(o[0][1] - t[0][1]) <= 1e-3 * abs(o[0][1])
               for o, t in zip(ours, theirs, strict=True) if o[0][0] == t[0][0])


def test_pruned_checkpoint_exports_as_zero_heads(torch_translator, tokenizer, test_text,
                                                 tmp_path):
    """Layers left with different head counts: the removed heads are exported as zero
    weights, which changes nothing."""
    model = Transformer(torch_translator.model.config)
    model.load_state_dict(torch_translator.model.state_dict())
    model.prune_heads({"encoder.blks.0.attention": [1, 2], "decoder.blks.1.attention1": [0],
                       "decoder.blks.0.attention2": [3]})
    pruned = save(model, tokenizer, tmp_path / "pruned.pt")
    assert export_command.main(["--checkpoint", str(pruned), "--output",
                               str(tmp_path / "ct2")]) == 0
    src = test_text[0][:100]
    ours = Translator.load(pruned, device="cpu").translate(src, beam_size=1)
    theirs = load_translator(tmp_path / "ct2", "ctranslate2", device="cpu").translate(
        src, beam_size=1)
    assert same_fraction(ours, theirs) >= 0.99
    assert ours != torch_translator.translate(src, beam_size=1)  # pruning changed the model


def test_averaged_checkpoints_export(checkpoint, torch_translator, tokenizer, test_text,
                                     tmp_path):
    torch.manual_seed(2)
    other = save(Transformer(torch_translator.model.config), tokenizer, tmp_path / "other.pt")
    assert export_command.main(["--checkpoint", str(checkpoint), str(other), "--output",
                               str(tmp_path / "ct2")]) == 0
    src = test_text[0][:50]
    ours = Translator.load([checkpoint, other], device="cpu").translate(src, beam_size=1)
    theirs = load_translator(tmp_path / "ct2", "ctranslate2", device="cpu").translate(
        src, beam_size=1)
    assert same_fraction(ours, theirs) >= 0.98
    assert ours != torch_translator.translate(src, beam_size=1)  # the average is another model


def test_pre_norm_model_exports(tokenizer, test_text, tmp_path):
    torch.manual_seed(1)
    model = Transformer(ModelConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
        num_hiddens=32, ffn_num_hiddens=64, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, max_positions=64, norm_first=True)).eval()
    checkpoint = save(model, tokenizer, tmp_path / "pre.pt")
    export_ctranslate2(Translator.load(checkpoint, device="cpu"), tmp_path / "ct2")
    src = test_text[0][:30]
    ours = scored(Translator.load(checkpoint, device="cpu").translations(src, beam_size=1))
    theirs = scored(load_translator(tmp_path / "ct2", "ctranslate2",
                                    device="cpu").translations(src, beam_size=1))
    assert same_fraction([s[0][0] for s in ours], [s[0][0] for s in theirs]) >= 0.9
    assert theirs[0][0][1] == pytest.approx(ours[0][0][1], rel=1e-3)


# ---- scripts ------------------------------------------------------------------------------------

def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def test_translate_script_engines_write_the_same_lines(checkpoint, exports, test_text,
                                                       tmp_path, capsys):
    lines = test_text[0][:20]
    lines[3:3] = ["", "  "]
    src = write_lines(tmp_path / "in.en", lines)
    ref = write_lines(tmp_path / "ref.de", test_text[1][:20][:3] + ["", ""] + test_text[1][3:20])
    outputs = {}
    for engine, path in (("torch", checkpoint), ("ctranslate2", exports["float32"])):
        out = tmp_path / f"{engine}.txt"
        assert translate_command.main([
            "--engine", engine, "--checkpoint", str(path), "--input", str(src), "--output",
            str(out), "--beam-size", "1", "--chunk-lines", "7", "--max-tokens", "64",
            "--threads", "1", "--device", "cpu", "--reference", str(ref)]) == 0
        err = capsys.readouterr().err
        assert "BLEU|nrefs:1|" in err and "decoding: beam 1" in err
        outputs[engine] = out.read_text(encoding="utf-8").split("\n")
    assert len(outputs["torch"]) == len(lines) + 1
    assert outputs["ctranslate2"] == outputs["torch"]
    assert outputs["torch"][3:5] == ["", ""]


def test_our_engine_keeps_its_threads_beside_a_ctranslate2_model(checkpoint, exports,
                                                                  test_text):
    """Loading a CTranslate2 model sets the OpenMP thread count that PyTorch shares to 1 (with
    the wheels of today); our translator, made at 2 threads, still searches at 2 (two
    engines in one process keep their own settings), gives the same translations, and
    leaves the process's count as it found it."""
    lines = test_text[0][:3]
    with hardware.threads_set_to(2):
        ours = Translator.load(checkpoint, device="cpu")
        alone = ours.translate(lines)
        load_translator(exports["float32"], "ctranslate2", device="cpu", threads=2)
        beside = torch.get_num_threads()
        seen: list[int] = []
        hook = ours.model.encoder.register_forward_pre_hook(
            lambda module, args: seen.append(torch.get_num_threads()))
        try:
            assert ours.translate(lines) == alone
        finally:
            hook.remove()
        assert torch.get_num_threads() == beside
    assert ours.threads == 2 and seen and set(seen) == {2}
    assert Translator.load(checkpoint, device="cpu", threads=3).threads == 3


def test_translate_lines_accepts_either_engine(ct2, torch_translator, test_text):
    import io

    out = io.StringIO()
    kept = translate_lines(ct2["float32"], iter(test_text[0][:9]), out,
                           ct2["float32"].request(beam_size=1), chunk_lines=4, keep=True)
    assert out.getvalue().splitlines() == kept
    assert same_fraction(kept, torch_translator.translate(test_text[0][:9], beam_size=1)) >= 0.8


def one_line_error(capsys, *needles: str) -> str:
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith("error: "), err
    for needle in needles:
        assert needle in err, err
    return err


def test_export_script_errors_are_one_line(checkpoint, exports, tmp_path, capsys):
    bad = tmp_path / "bad.pt"
    bad.write_bytes(b"not a checkpoint" * 10)
    assert export_command.main(["--checkpoint", str(bad), "--output", str(tmp_path / "o")]) == 1
    one_line_error(capsys, str(bad))
    assert not (tmp_path / "o").exists()
    blocker = tmp_path / "a_file"
    blocker.write_text("x")
    assert export_command.main(["--checkpoint", str(checkpoint), "--output",
                               str(blocker / "ct2")]) == 1
    one_line_error(capsys, "could not write", str(blocker / "ct2"))
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    assert export_command.main(["--checkpoint", str(checkpoint), "--output",
                               str(tmp_path / "other")]) == 1
    one_line_error(capsys, "is not a CTranslate2 export")
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    # An earlier export is replaced, complete.
    again = tmp_path / "again"
    for quantization in ("int8", "float32"):
        assert export_command.main(["--checkpoint", str(checkpoint), "--output", str(again),
                                   "--quantization", quantization]) == 0
    assert json.loads((again / "transformer.json").read_text())["quantization"] == "float32"
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".")) == []


def test_translate_script_ctranslate2_errors_are_one_line(checkpoint, exports, tmp_path,
                                                          capsys):
    src = write_lines(tmp_path / "in.txt", ["Hallo"])
    for path, needle in ((checkpoint, "is not a CTranslate2 export"),
                         (tmp_path / "missing", "is not a CTranslate2 export")):
        assert translate_command.main(["--engine", "ctranslate2", "--checkpoint", str(path),
                                      "--input", str(src)]) == 1
        one_line_error(capsys, needle)
    # what CTranslate2 cannot do, named as the options that ask for it
    for options, needle in ((["--alignment", "--alignment-head", "0"], "--alignment-head"),
                            (["--alignment", "--alignment-layer", "0"], "--alignment-layer")):
        out = tmp_path / "out.txt"
        assert translate_command.main(["--engine", "ctranslate2", "--checkpoint",
                                      str(exports["float32"]), "--input", str(src),
                                      "--output", str(out), *options]) == 1
        one_line_error(capsys, needle, "need the torch engine")
        assert not out.exists()


def test_missing_ctranslate2_says_how_to_install(checkpoint, exports, tmp_path, capsys,
                                                 monkeypatch):
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # `import ctranslate2` fails
    hint = "needs the optional package ctranslate2: pip install 'transformer[export]'"
    with pytest.raises(MissingDependency, match=re.escape(hint)):
        load_translator(exports["float32"], "ctranslate2")
    src = write_lines(tmp_path / "in.txt", ["Hallo"])
    assert translate_command.main(["--engine", "ctranslate2", "--checkpoint",
                                  str(exports["float32"]), "--input", str(src)]) == 1
    one_line_error(capsys, hint)
    assert export_command.main(["--checkpoint", str(checkpoint), "--output",
                               str(tmp_path / "ct2")]) == 1
    one_line_error(capsys, hint)
    # Our engine needs no ctranslate2.
    assert translate_command.main(["--checkpoint", str(checkpoint), "--input", str(src),
                                  "--output", str(tmp_path / "out.txt"), "--device",
                                  "cpu"]) == 0


# ---- vocabulary map (vmap.txt) ----------------------------------------------------------------

def naive_vocab_map(tokenizers: TokenizerPair, src: list[str], tgt: list[str], per_source: int,
                    always: int) -> VocabMap:
    """The statistic of transformer/vocab_map.py, counted with dicts, pair by pair."""
    specials = {PAD_ID, UNK_ID, BOS_ID, EOS_ID}
    together, tgt_count = collections.Counter(), collections.Counter()
    for s, t in zip(src, tgt, strict=True):
        s_ids = set(tokenizers.src.encode(s)) - specials
        t_ids = set(tokenizers.tgt.encode(t)) - specials
        tgt_count.update(t_ids)
        together.update((a, b) for a in s_ids for b in t_ids)
    frequent = sorted(tgt_count, key=lambda b: (-tgt_count[b], b))[:always]
    by_source = collections.defaultdict(list)
    for (a, b), n in together.items():
        if b not in frequent and n >= MIN_PAIRS:
            by_source[a].append((-n, b))
    piece_s, piece_t = tokenizers.src.id_to_piece, tokenizers.tgt.id_to_piece
    return VocabMap([piece_t(b) for b in frequent],
                    {piece_s(a): [piece_t(b) for _, b in sorted(c)[:per_source]]
                     for a, c in by_source.items()}, len(src))


def test_vocab_map_counts_what_a_naive_count_finds(tokenizer, multi30k_dir, multi30k_lines):
    pair = TokenizerPair(tokenizer, tokenizer)
    src, tgt = multi30k_lines("train.en.gz"), multi30k_lines("train.de.gz")
    built = build_vocab_map(pair, multi30k_dir / "train.en.gz", multi30k_dir / "train.de.gz",
                            per_source=7, always=30)
    expected = naive_vocab_map(pair, src, tgt, per_source=7, always=30)
    assert built.always == expected.always and built.pairs == len(src) == 3000
    assert built.candidates == expected.candidates
    assert "▁Hund" in built.candidates["▁dog"]  # it learns translations
    # A sample: at most max_pairs pairs, the same ones for the same seed.
    sampled = [build_vocab_map(pair, multi30k_dir / "train.en.gz",
                               multi30k_dir / "train.de.gz", max_pairs=500, seed=seed)
               for seed in (1, 1, 2)]
    assert sampled[0].pairs == 500 and sampled[0] == sampled[1] != sampled[2]


@pytest.fixture(scope="module")
def mapped_exports(torch_translator, multi30k_dir, tmp_path_factory) -> dict[str, Path]:
    """int8 exports with the default map, and with a map of every piece (no restriction)."""
    folder = tmp_path_factory.mktemp("mapped")
    pieces = [torch_translator.tokenizers.tgt.id_to_piece(i)
              for i in range(4, torch_translator.tokenizers.tgt.vocab_size)]
    maps = {"default": build_vocab_map(torch_translator.tokenizers,
                                       multi30k_dir / "train.en.gz",
                                       multi30k_dir / "train.de.gz"),
            "everything": VocabMap(pieces, {}, 0)}
    for name, vocab_map in maps.items():
        export_ctranslate2(torch_translator, folder / name, quantization="int8",
                           vocab_map=vocab_map)
    return {name: folder / name for name in maps}


def test_a_map_of_every_piece_changes_nothing(ct2, mapped_exports, test_text):
    """vmap.txt is read and used (use_vmap), and scoring all of its candidates is scoring
    the whole vocabulary (the same outputs; scores up to float rounding: the projection is
    then a matrix of the candidates' rows). One sentence a batch: with a map the engine cuts
    batches into smaller sub-batches, which would pad differently."""
    everything = load_translator(mapped_exports["everything"], "ctranslate2", threads=1)
    assert everything.info.vocab_map["always"] > 1000
    src = test_text[0][:100]
    mapped = scored(everything.translations(src, beam_size=4, max_tokens=1))
    unmapped = scored(ct2["int8"].translations(src, beam_size=4, max_tokens=1))
    assert [hyps[0][0] for hyps in mapped] == [hyps[0][0] for hyps in unmapped]
    for a, b in zip(mapped, unmapped, strict=True):
        assert a[0][1] == pytest.approx(b[0][1], rel=1e-5)


def test_mapped_output_uses_only_candidates_and_keeps_bleu(torch_translator, mapped_exports,
                                                           test_text, multi30k_dir):
    mapped = load_translator(mapped_exports["default"], "ctranslate2", threads=1)
    vmap = (mapped_exports["default"] / VOCAB_MAP).read_text(encoding="utf-8").splitlines()
    rules = dict(line.split("\t") for line in vmap)
    src, refs = test_text
    pieces = mapped.tokenizers.src.encode_batch(src[:40])
    for ids in pieces:  # one sentence a batch: its own candidates
        allowed = set(rules[""].split()) | {"<unk>"}
        for i in ids:
            allowed.update(rules.get(mapped.tokenizers.src.id_to_piece(i), "").split())
        best = mapped._search_batch([ids], mapped.request(beam_size=4))[0][0]
        used = {mapped.tokenizers.tgt.id_to_piece(i) for i in best.tokens}
        assert used <= allowed, used - allowed
    ours = torch_translator.translate(src, beam_size=5, alpha=1.0)
    assert abs(bleu(mapped.translate(src, beam_size=5, alpha=1.0), refs)
               - bleu(ours, refs)) <= 0.5


def test_export_script_vocab_map_and_its_errors(checkpoint, multi30k_dir, tmp_path, capsys):
    train = [str(multi30k_dir / f"train.{lang}.gz") for lang in ("en", "de")]
    out = tmp_path / "mapped"
    assert export_command.main(["--checkpoint", str(checkpoint), "--output", str(out),
                               "--quantization", "int8", "--vocab-map", *train,
                               "--vocab-map-size", "5"]) == 0
    assert "vocabulary map of" in capsys.readouterr().out
    info, _ = read_export(out)
    assert info.vocab_map["pairs"] == 3000 and (out / VOCAB_MAP).is_file()
    short = write_lines(tmp_path / "short.de", ["Ein Hund."] * 10)
    assert export_command.main(["--checkpoint", str(checkpoint), "--output",
                               str(tmp_path / "o"), "--vocab-map", train[0], str(short)]) == 1
    one_line_error(capsys, train[0], str(short), "3000 lines", "10 lines")
    assert not (tmp_path / "o").exists()
    bad = tmp_path / "bad.en"
    bad.write_bytes(b"A dog.\n" * 9 + b"A \xff cat.\n")
    assert export_command.main(["--checkpoint", str(checkpoint), "--output",
                               str(tmp_path / "o"), "--vocab-map", str(bad), str(short)]) == 1
    one_line_error(capsys, str(bad), "line 10")
    assert export_command.main(["--checkpoint", str(checkpoint), "--output",
                                str(tmp_path / "o"), "--vocab-map", *train,
                                "--vocab-map-size", "0"]) == 1
    one_line_error(capsys, "--vocab-map-size must be >= 1")


def test_engine_auto_picks_ctranslate2_for_an_export_and_ours_for_a_checkpoint(checkpoint,
                                                                              exports):
    """`--engine auto` (every command's default): the engine that reads what --checkpoint
    names, so an exported model runs on CTranslate2 without asking."""
    from transformer.deploy.engines import engine_for

    assert engine_for(exports["int8"]) == "ctranslate2" and engine_for(checkpoint) == "torch"
    assert engine_for([checkpoint, checkpoint]) == "torch"  # several: averaged by ours
    assert load_translator(exports["int8"], device="cpu", threads=1).engine == "ctranslate2"
    assert load_translator(checkpoint, device="cpu").engine == "torch"


