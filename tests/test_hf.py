"""The Hugging Face bridge (`transformer import-hf`, `transformer export --format hf`,
`init_from`), checked against `transformers` itself: its MarianMTModel / Pegasus forward,
`generate`, MarianTokenizer and `pipeline`. Nothing is downloaded: the Marian models are
built here and written with `save_pretrained`.

- `random_marian`: a MarianConfig shaped like OPUS-MT (swish, scaled embeddings, an output
  bias, `</s>` 0, `<pad>` last and the decoder's start), random weights, separate source
  (en) and target (de) SentencePiece models behind one vocab.json.
- `trained_marian`: the same layout with weights that translate (trained here with
  teacher forcing, then written by `transformers`' own save_pretrained), so that greedy
  search is a real test: varied outputs that end.
- `en_de_checkpoint` (conftest.py): a post-norm model of ours, for the export direction.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import sacrebleu
import sentencepiece as spm
import torch
import yaml
from conftest import reusing_venv, train_en_de
from safetensors.torch import load_file, save_file
from transformers import (
    AutoModelForSeq2SeqLM,
    AutoTokenizer,
    MarianConfig,
    MarianMTModel,
    MarianTokenizer,
)

from transformer.cli import main as transformer_main
from transformer.data.store import ParallelCorpus
from transformer.data.text import ParallelText
from transformer.data.tokenizer import TokenizerPair
from transformer.decoding.corpus import search_corpus
from transformer.decoding.request import DecodingRequest
from transformer.decoding.translator import Translator
from transformer.deploy.engines import load_translator
from transformer.deploy.export import export_ctranslate2
from transformer.deploy.hf import export_hf, import_hf, permutation, read_hf_tokenizers
from transformer.errors import CheckpointError
from transformer.model.loss import evaluate_loss
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run.checkpoint import (
    inference_checkpoint,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
    tokenizers_from_state,
)
from transformer.run.config import DecodingSettings, TrainConfig, TrainerConfig

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

MAX_NEW = 40  # greedy comparisons: every output at most this many tokens, both sides


# ---- building Marian directories --------------------------------------------------------

def _train_spm(lines: list[str], vocab_size: int) -> bytes:
    """A plain SentencePiece model (its own ids, as OPUS-MT's .spm files have)."""
    buffer = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=buffer,
                                   vocab_size=vocab_size, minloglevel=2, num_threads=1)
    return buffer.getvalue()


def write_marian_tokenizer(directory: Path, src_lines: list[str], tgt_lines: list[str]) -> int:
    """source.spm, target.spm and one vocab.json as OPUS-MT lays them out: `</s>` 0,
    `<unk>` 1, the pieces of both models, `<pad>` last. Returns the vocabulary size."""
    directory.mkdir(parents=True, exist_ok=True)
    pieces: list[str] = []
    for name, lines in (("source.spm", src_lines), ("target.spm", tgt_lines)):
        proto = _train_spm(lines, 300)
        (directory / name).write_bytes(proto)
        sp = spm.SentencePieceProcessor(model_proto=proto)
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                   if not (sp.is_control(i) or sp.is_unknown(i))]
    vocab = ["</s>", "<unk>", *dict.fromkeys(pieces), "<pad>"]
    (directory / "vocab.json").write_text(json.dumps({p: i for i, p in enumerate(vocab)}))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "MarianTokenizer", "model_max_length": 128}))
    return len(vocab)


def opus_config(vocab_size: int) -> MarianConfig:
    """OPUS-MT's choices at a test's size."""
    return MarianConfig(
        vocab_size=vocab_size, d_model=32, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_ffn_dim=64,
        decoder_ffn_dim=64, activation_function="swish", max_position_embeddings=128,
        scale_embedding=True, pad_token_id=vocab_size - 1,
        decoder_start_token_id=vocab_size - 1, eos_token_id=0, forced_eos_token_id=0,
        dropout=0.0)


@pytest.fixture(scope="module")
def text(multi30k_lines) -> dict[str, list[str]]:
    return {name: multi30k_lines(f"{name}.gz") for name in
            ("train.en", "train.de", "val.en", "val.de", "test_2016_flickr.en",
             "test_2016_flickr.de")}


@pytest.fixture(scope="module")
def random_marian(tmp_path_factory, text) -> Path:
    directory = tmp_path_factory.mktemp("marian") / "random"
    vocab_size = write_marian_tokenizer(directory, text["train.en"][:1000],
                                        text["train.de"][:1000])
    torch.manual_seed(0)
    model = MarianMTModel(opus_config(vocab_size))
    with torch.no_grad():  # larger than the init: outputs that depend on the input
        for name, parameter in model.named_parameters():
            if "layer_norm" not in name:
                parameter.normal_(0, 0.3)
        model.model.shared.weight[vocab_size - 1].zero_()  # the start token: a zero vector
        model.final_logits_bias.normal_(0, 1.0)
    model.save_pretrained(directory)
    return directory


@pytest.fixture(scope="module")
def trained_marian(tmp_path_factory, random_marian, text) -> Path:
    """OPUS-MT's layout with weights that translate: our model with its options (swish,
    output bias, Marian's ids and tokenizers) trained on the slice, exported, then loaded
    and saved again by `transformers` itself."""
    config = hf_config_dict(random_marian)
    tokenizers = read_hf_tokenizers(random_marian, _model_config(config))
    model = train_en_de(tokenizers, text["train.en"], text["train.de"], activation="swish",
                        output_bias=True, num_hiddens=32, ffn_num_hiddens=64)
    ours = tmp_path_factory.mktemp("marian") / "ours"
    export_hf(Translator(model, tokenizers, "cpu"), ours)
    directory = tmp_path_factory.mktemp("marian") / "trained"
    MarianMTModel.from_pretrained(ours).save_pretrained(directory)
    MarianTokenizer.from_pretrained(ours).save_pretrained(directory)
    return directory


def hf_config_dict(directory: Path) -> dict:
    return json.loads((directory / "config.json").read_text())


def _model_config(config: dict) -> ModelConfig:
    from transformer.deploy.hf import hf_model_config
    return hf_model_config(config)


def imported(directory: Path) -> tuple[Transformer, TokenizerPair]:
    state = import_hf(directory)
    return model_from_checkpoint(state).eval(), tokenizers_from_state(state)


def greedy_ids(model: Transformer, tokenizers: TokenizerPair, lines: list[str]) -> list[list[int]]:
    """Our greedy search, every output at most MAX_NEW tokens (EOS not included)."""
    eos = tokenizers.src.specials.eos
    sources = [ids + [eos] for ids in tokenizers.src.encode_batch(lines)]
    request = DecodingRequest(beam_size=1, max_len_a=0, max_len_b=MAX_NEW)
    return [hyps[0].tokens for hyps in search_corpus(model, sources, request)]


def generate_ids(model, tokenizer, lines: list[str], **options) -> list[list[int]]:
    """`generate` in batches of 50, without the start token, the EOS and padding."""
    config = model.generation_config
    outputs = []
    for start in range(0, len(lines), 50):
        batch = tokenizer(lines[start:start + 50], return_tensors="pt", padding=True)
        with torch.no_grad():
            generated = model.generate(**batch, **options)
        for row in generated[:, 1:].tolist():
            ids = [i for i in row if i != config.pad_token_id]
            outputs.append(ids[:-1] if ids and ids[-1] == config.eos_token_id else ids)
    return outputs


def greedy_generate(model, tokenizer, lines: list[str]) -> list[list[int]]:
    return generate_ids(model, tokenizer, lines, num_beams=1, do_sample=False,
                        max_new_tokens=MAX_NEW, forced_eos_token_id=None)


def teacher_forced_logits(hf_model, tokenizer, src: list[str], tgt: list[str],
                          ours: Transformer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(theirs, ours, real-token mask) on a padded batch, through MarianTokenizer's ids."""
    batch = tokenizer(src, text_target=tgt, return_tensors="pt", padding=True)
    c = ours.config
    labels = batch["labels"].masked_fill(batch["labels"] == -100, c.pad_id)
    decoder_input = torch.cat([torch.full((len(src), 1), c.start_id), labels[:, :-1]], 1)
    with torch.no_grad():
        theirs = hf_model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"],
                          decoder_input_ids=decoder_input).logits
        mine = ours(batch["input_ids"], batch["attention_mask"].sum(1), decoder_input)
    return theirs, mine, labels != c.pad_id


# ---- import ---------------------------------------------------------------------------------

def test_permutation_turns_our_sinusoid_into_marians():
    from transformer.model.transformer import PositionalEncoding
    ours = PositionalEncoding(8, 0.0, 16).P[0]  # sin, cos interleaved
    position = torch.arange(16.0)[:, None]
    frequencies = 10000 ** (-torch.arange(0, 8, 2) / 8)
    marian = torch.cat([torch.sin(position * frequencies), torch.cos(position * frequencies)], 1)
    torch.testing.assert_close(ours[:, permutation(8)], marian, atol=1e-6, rtol=0)


@pytest.mark.parametrize("name", ["random_marian", "trained_marian"])
def test_imported_logits_equal_marians_on_a_padded_batch(name, request, text):
    directory = request.getfixturevalue(name)
    model, _ = imported(directory)
    theirs, mine, real = teacher_forced_logits(
        MarianMTModel.from_pretrained(directory).eval(), MarianTokenizer.from_pretrained(directory),
        text["val.en"][:8], text["val.de"][:8], model)
    assert real.sum() > 8 * 5 and (~real).any()  # several tokens each, and padding
    assert (theirs - mine)[real].abs().max() < 1e-4


def test_imported_tokenizer_reads_and_writes_as_marian_tokenizer(trained_marian, text):
    _, tokenizers = imported(trained_marian)
    marian = MarianTokenizer.from_pretrained(trained_marian)
    lines = text["test_2016_flickr.en"][:100] + [">>deu<< an unknown code stays text"]
    eos = tokenizers.src.specials.eos
    assert [ids + [eos] for ids in tokenizers.src.encode_batch(lines)] == \
        marian(lines)["input_ids"]
    targets = marian(text_target=text["test_2016_flickr.de"][:100])["input_ids"]
    # `<unk>` aside (SentencePiece's " ⁇ " here; MarianTokenizer drops it), the same text
    known = [ids for ids in targets if tokenizers.tgt.specials.unk not in ids]
    assert len(known) >= 90
    assert [tokenizers.tgt.decode(ids) for ids in known] == \
        marian.batch_decode(known, skip_special_tokens=True)


def test_imported_greedy_is_generate_token_for_token(trained_marian, text):
    lines = text["test_2016_flickr.en"][:200]
    model, tokenizers = imported(trained_marian)
    ours = greedy_ids(model, tokenizers, lines)
    theirs = greedy_generate(MarianMTModel.from_pretrained(trained_marian).eval(),
                             MarianTokenizer.from_pretrained(trained_marian), lines)
    assert len({tuple(ids) for ids in ours}) > 150  # a real test: varied outputs ...
    assert sum(len(ids) < MAX_NEW for ids in ours) > 150  # ... that end
    assert ours == theirs


def test_import_command_writes_a_run_every_tool_reads(trained_marian, tmp_path, text, capsys):
    run = tmp_path / "opus"
    assert transformer_main(["import-hf", str(trained_marian), "--output", str(run)]) == 0
    assert "swish" in capsys.readouterr().out
    translator = Translator.load(run, device="cpu")
    lines = text["test_2016_flickr.en"][:30]
    ours = translator.translate(lines, beam_size=1)
    # transformer translate
    (tmp_path / "in.en").write_text("\n".join(lines) + "\n")
    assert transformer_main(["translate", "--checkpoint", str(run), "--input",
                             str(tmp_path / "in.en"), "--beam-size", "1"]) == 0
    assert capsys.readouterr().out.splitlines() == ours
    # CTranslate2: the same greedy output
    export_ctranslate2(translator, tmp_path / "ct2")
    ct2 = load_translator(tmp_path / "ct2", "ctranslate2", device="cpu")
    assert sum(a == b for a, b in zip(ct2.translate(lines, beam_size=1), ours,
                                      strict=True)) >= 29
    # the server
    from fastapi.testclient import TestClient

    from transformer.deploy.serve import create_app
    with TestClient(create_app(translator)) as client:
        response = client.post("/translate", json={"text": lines[:3], "beam_size": 1})
    assert response.status_code == 200 and response.json()["translations"] == ours[:3]
    # head importance, on given files
    (tmp_path / "ref.de").write_text("\n".join(text["test_2016_flickr.de"][:30]) + "\n")
    assert transformer_main(["head-importance", "--checkpoint", str(run), "--src",
                             str(tmp_path / "in.en"), "--ref", str(tmp_path / "ref.de"),
                             "--output-dir", str(tmp_path / "heads")]) == 0
    assert any((tmp_path / "heads").iterdir())


def _broken_copy(source: Path, tmp_path: Path, **config_changes) -> Path:
    directory = tmp_path / "broken"
    shutil.copytree(source, directory)
    config = hf_config_dict(directory)
    config.update(config_changes)
    (directory / "config.json").write_text(json.dumps(config))
    return directory


class Payload:
    """Not a tensor: unpickling it would run code."""

    def __reduce__(self):
        return (print, ("unpickled!",))


@pytest.mark.parametrize(("change", "needle"), [
    ({"normalize_embedding": True}, "normalize_embedding"),
    ({"activation_function": "gelu_new"}, "activation_function"),
    ({"scale_embedding": False}, "scale_embedding"),
    ({"decoder_ffn_dim": 16}, "decoder_ffn_dim"),
    ({"model_type": "bart"}, "model_type"),
    ("vocab.json", "vocab.json"),
    ("model.safetensors", "pytorch_model.bin"),
    ("pickle", "weights only"),
    ("extra tensor", "has 1 tensor(s) our model has no place for "
                     "(model.encoder.layers.2.fc1.weight)"),
])
def test_import_errors_are_one_line_naming_the_key_or_file(random_marian, tmp_path, capsys,
                                                          change, needle):
    if isinstance(change, dict):
        directory = _broken_copy(random_marian, tmp_path, **change)
    else:
        directory = _broken_copy(random_marian, tmp_path)
        if change == "pickle":
            (directory / "model.safetensors").unlink()
            torch.save({"weights": Payload()}, directory / "pytorch_model.bin")
        elif change == "extra tensor":  # a third layer config.json does not describe
            state = load_file(directory / "model.safetensors")
            state["model.encoder.layers.2.fc1.weight"] = torch.zeros(64, 32)
            save_file(state, directory / "model.safetensors")
        else:
            (directory / change).unlink()
    code = transformer_main(["import-hf", str(directory), "--output", str(tmp_path / "run")])
    captured = capsys.readouterr()
    assert code == 1 and "unpickled!" not in captured.out
    error = captured.err.strip()
    assert error.startswith("error: ") and "\n" not in error and needle in error
    assert not (tmp_path / "run").exists()


def test_import_reads_every_tensor_of_a_full_state_dict(random_marian, tmp_path):
    """A state dict with every tensor MarianMTModel holds (the embedding table's copies and
    the position tables, which save_pretrained may drop) imports as its safetensors do; a
    copy that differs from the table is refused."""
    directory = _broken_copy(random_marian, tmp_path)
    (directory / "model.safetensors").unlink()
    state = MarianMTModel.from_pretrained(random_marian).state_dict()
    assert {"lm_head.weight", "model.encoder.embed_tokens.weight",
            "model.decoder.embed_positions.weight"} <= state.keys()
    torch.save(state, directory / "pytorch_model.bin")
    full, saved = import_hf(directory)["model"], import_hf(random_marian)["model"]
    assert full.keys() == saved.keys()
    assert all(torch.equal(full[k], saved[k]) for k in full)
    state["lm_head.weight"] = state["lm_head.weight"] + 1.0
    torch.save(state, directory / "pytorch_model.bin")
    with pytest.raises(CheckpointError, match="lm_head.weight differs from model.shared.weight"):
        import_hf(directory)


# ---- export -------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def exported(en_de_checkpoint, tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("hf") / "en-de"
    assert transformer_main(["export", "--format", "hf", "--checkpoint", str(en_de_checkpoint),
                             "--output", str(directory)]) == 0
    return directory


def test_exported_greedy_is_ours_token_for_token(exported, en_de_checkpoint, text):
    lines = text["test_2016_flickr.en"][:200]
    translator = Translator.load(en_de_checkpoint, device="cpu")
    ours = greedy_ids(translator.model, translator.tokenizers, lines)
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(exported), \
        AutoTokenizer.from_pretrained(exported)
    assert type(model).__name__ == "MarianMTModel"
    assert sum(len(ids) < MAX_NEW for ids in ours) > 150
    assert greedy_generate(model.eval(), tokenizer, lines) == ours


def test_exported_beam_search_within_a_bleu_point(exported, en_de_checkpoint, text):
    lines, refs = text["test_2016_flickr.en"], text["test_2016_flickr.de"]
    ours = Translator.load(en_de_checkpoint, device="cpu").translate(lines, beam_size=5)
    model, tokenizer = AutoModelForSeq2SeqLM.from_pretrained(exported).eval(), \
        AutoTokenizer.from_pretrained(exported)
    assert model.generation_config.num_beams == 4  # the checkpoint's decoding default
    theirs = tokenizer.batch_decode(
        list(_generated(model, tokenizer, lines, num_beams=5)),
        skip_special_tokens=True)
    ours_bleu = sacrebleu.corpus_bleu(ours, [refs]).score
    theirs_bleu = sacrebleu.corpus_bleu(theirs, [refs]).score
    assert ours_bleu > 5  # a model that translates
    # transformers' beam search ends hypotheses by its own rule (on this weak model its
    # outputs ran up to 1.3x the references' length, ours 1.2x): BLEU 4.91 against our 5.48
    # on an Intel Xeon with AMX, closer elsewhere
    assert abs(ours_bleu - theirs_bleu) <= 1.0


def _generated(model, tokenizer, lines, **options) -> list[list[int]]:
    out = []
    for start in range(0, len(lines), 50):
        batch = tokenizer(lines[start:start + 50], return_tensors="pt", padding=True)
        with torch.no_grad():
            out += model.generate(**batch, **options).tolist()
    return out


PIPELINE = """
import json, sys
from transformers import pipeline
translate = pipeline("translation", model=sys.argv[1], device="cpu")
print(json.dumps([r["translation_text"] for r in translate(json.loads(sys.argv[2]))]))
"""


@pytest.mark.registry  # opt-in: python -m pytest -m registry
def test_exported_model_translates_in_the_translation_pipeline_of_transformers_4(
        exported, en_de_checkpoint, text, tmp_path):
    """transformers 5 dropped `pipeline("translation")`; most users still have 4.x, so
    check it there: a fresh environment with transformers<5 (installed from the registry)."""
    python = reusing_venv(tmp_path / "venv")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                    "transformers>=4.40,<5"], check=True, capture_output=True, timeout=600)
    lines = text["test_2016_flickr.en"][:20]
    result = subprocess.run([str(python), "-c", PIPELINE, str(exported), json.dumps(lines)],
                            capture_output=True, text=True, timeout=300,
                            env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert result.returncode == 0, result.stderr[-3000:]
    theirs = json.loads(result.stdout.splitlines()[-1])
    ours = Translator.load(en_de_checkpoint, device="cpu").translate(lines)  # beam 4, as theirs
    assert all(theirs) and sum(a == b for a, b in zip(theirs, ours, strict=True)) >= 15


def test_round_trip_gives_identical_weights_and_translations(exported, en_de_checkpoint,
                                                             text):
    original = load_checkpoint(en_de_checkpoint)
    back = import_hf(exported)
    mine = original["model"]
    assert back["model"].keys() == {k for k in mine if k != "output_projection.bias"} | \
        {"output_projection.bias"}
    for name, value in mine.items():
        assert torch.equal(back["model"][name], value), name
    assert not back["model"]["output_projection.bias"].any()  # exported as zeros
    lines = text["test_2016_flickr.en"][:50]
    before = Translator.load(en_de_checkpoint, device="cpu").translate(lines)
    tokenizers = tokenizers_from_state(back)
    after = Translator(model_from_checkpoint(back), tokenizers, "cpu",
                       decoding=DecodingSettings(alpha=1.0, beam_size=4)).translate(lines)
    assert after == before


def test_pre_norm_model_exports_as_pegasus(multi30k_tokenizer, tmp_path, text):
    tokenizer = multi30k_tokenizer
    torch.manual_seed(1)
    model = Transformer(ModelConfig(
        src_vocab_size=tokenizer.vocab_size, tgt_vocab_size=tokenizer.vocab_size,
        num_hiddens=32, ffn_num_hiddens=64, num_heads=4, num_encoder_layers=2,
        num_decoder_layers=2, max_positions=64, norm_first=True, activation="gelu",
        tie_output=False)).eval()
    with torch.no_grad():
        for ln in (model.encoder.final_ln, model.decoder.blks[0].addnorm2.ln):
            ln.weight.normal_(1, 0.2)
            ln.bias.normal_(0, 0.2)
    tokenizers = TokenizerPair(tokenizer, tokenizer)
    export_hf(Translator(model, tokenizers, "cpu"), tmp_path / "pegasus")
    hf_model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "pegasus").eval()
    assert type(hf_model).__name__ == "PegasusForConditionalGeneration"
    theirs, mine, real = teacher_forced_logits(
        hf_model, AutoTokenizer.from_pretrained(tmp_path / "pegasus"), text["val.en"][:8],
        text["val.de"][:8], model)
    assert (theirs - mine)[real].abs().max() < 1e-4
    back = import_hf(tmp_path / "pegasus")["model"]
    assert all(torch.equal(back[k], v) for k, v in model.state_dict().items()
               if k != "output_projection.bias")


def test_separate_vocabularies_are_refused_in_one_line(multi30k_tokenizer,
                                                       multi30k_small_tokenizer_path,
                                                       tmp_path, capsys):
    from transformer.data.tokenizer import Tokenizer
    small = Tokenizer.load(multi30k_small_tokenizer_path)
    model = Transformer(ModelConfig(
        src_vocab_size=multi30k_tokenizer.vocab_size, tgt_vocab_size=small.vocab_size,
        share_embeddings=False, num_hiddens=16, ffn_num_hiddens=32, num_heads=2,
        num_encoder_layers=1, num_decoder_layers=1, max_positions=32))
    path = tmp_path / "separate.pt"
    save_checkpoint(inference_checkpoint(model, TokenizerPair(multi30k_tokenizer, small),
                                         training_config=None), path)
    code = transformer_main(["export", "--format", "hf", "--checkpoint", str(path),
                             "--output", str(tmp_path / "out")])
    error = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in error and "share_embeddings" in error
    assert not (tmp_path / "out").exists()



def model_card(directory: Path) -> tuple[dict, str]:
    """The export's README.md: its YAML front matter and its body."""
    text = (directory / "README.md").read_text(encoding="utf-8")
    assert text.startswith("---\n")
    front, body = text[len("---\n"):].split("\n---\n", 1)
    return yaml.safe_load(front), body


def test_the_export_has_a_model_card_with_the_models_numbers(exported, en_de_checkpoint):
    meta, body = model_card(exported)
    assert meta["language"] == ["en", "de"] and meta["license"] == "mit"
    assert {"translation", "en-de", "marian"} <= set(meta["tags"])
    assert meta["metrics"] == ["bleu", "chrf"] and meta["pipeline_tag"] == "translation"
    translator = Translator.load(en_de_checkpoint, device="cpu")
    c = translator.model_config
    assert f"| parameters | {translator.num_parameters:,} |" in body
    assert f"{c.tgt_vocab_size:,} SentencePiece pieces" in body
    assert (f"layers: {c.num_encoder_layers} encoder, {c.num_decoder_layers} decoder; model "
            f"dimension {c.num_hiddens}, feed-forward {c.ffn_num_hiddens}") in body
    assert "from English (`en`) into German (`de`)" in body and "`MarianMTModel`" in body
    assert "Multi30k (Elliott et al. 2016), task 1" in body  # the stored training config
    assert "beam 4, length penalty alpha 1" in body  # the checkpoint's decoding settings
    assert 'AutoModelForSeq2SeqLM.from_pretrained("PATH_OR_HUB_ID")' in body
    assert "```bash\ntransformer train data.src_lang=en data.tgt_lang=de" in body
    assert f"model.num_hiddens={c.num_hiddens}" in body
    assert str(en_de_checkpoint.parent) not in body  # files by name, no local paths


def test_the_model_card_reports_the_budget_training_and_chosen_scores(en_de_checkpoint,
                                                                      tmp_path, capsys):
    state = load_checkpoint(en_de_checkpoint)
    trained = TrainConfig(trainer=TrainerConfig(max_target_tokens=5_500_000, max_time=1800.0))
    state.update(config=trained.to_dict(), valid_bleu=37.254,
                 averaged_from=["checkpoint_800.pt", "checkpoint_900.pt"],
                 train_state={"epoch": 13, "batches_done": 0, "num_updates": 1234,
                              "best_bleu": 36.5, "train_time": 1799.0,
                              "target_tokens": 5_498_765},
                 budget_settings={"from_tokens": 0, "update_tokens": 1024, "dropout": 0.1,
                                  "lr": 0.0014, "warmup_fraction": 0.15, "epochs": 11.7})
    path = tmp_path / "chosen.pt"
    save_checkpoint(state, path)
    out = tmp_path / "hf"
    assert transformer_main(["export", "--format", "hf", "--checkpoint", str(path),
                             "--output", str(out), "--license", "apache-2.0"]) == 0
    meta, body = model_card(out)
    assert meta["license"] == "apache-2.0" and "Apache 2.0 license" in body
    assert "budget: 5,500,000 target tokens or 1,800 s of training, whichever came " \
           "first" in body
    assert "trained: 1,234 updates, 5,498,765 target tokens, 30.0 minutes of training, " \
           "12 epochs" in body
    assert ("validation BLEU 37.25 (cased sacreBLEU) with these settings, the average of 2 "
            "checkpoints, chosen by `transformer tune-decoding`") in body
    assert "best validation BLEU during training: 36.50" in body
    assert ("chosen for the budget: 1,024 target tokens an update, peak learning rate 0.0014, "
            "dropout 0.1") in body
    assert "trainer.max_target_tokens=5500000" in body and "trainer.max_time=1800" in body
    assert AutoTokenizer.from_pretrained(out) is not None  # the card changes no other file
    capsys.readouterr()
    code = transformer_main(["export", "--format", "hf", "--checkpoint", str(path),
                             "--output", str(tmp_path / "bad"), "--license", "MIT License"])
    error = capsys.readouterr().err.strip()
    assert code == 1 and "\n" not in error and "--license" in error
    assert not (tmp_path / "bad").exists()


# ---- fine-tuning ------------------------------------------------------------------------------

def valid_loss(checkpoint: Path, text: dict[str, list[str]]) -> float:
    state = load_checkpoint(checkpoint)
    model, tokenizers = model_from_checkpoint(state), tokenizers_from_state(state)
    corpus = ParallelCorpus.encode(ParallelText(text["val.en"], text["val.de"],
                                                list(range(len(text["val.en"])))), tokenizers)
    batches = [corpus.collate(range(i, min(i + 64, len(corpus))))
               for i in range(0, len(corpus), 64)]
    return evaluate_loss(model, batches).nll


def test_fine_tuning_an_imported_model_lowers_its_validation_loss(random_marian, tmp_path,
                                                                  text):
    run = tmp_path / "opus"
    assert transformer_main(["import-hf", str(random_marian), "--output", str(run)]) == 0
    files = []
    for split, stem, n in (("train", "train", 3000), ("valid", "val", 100)):
        for side, lang in (("src", "en"), ("tgt", "de")):
            path = tmp_path / f"{split}.{lang}"
            path.write_text("\n".join(text[f"{stem}.{lang}"][:n]) + "\n")
            files.append(f"data.{split}_{side}={path}")
    tuned = tmp_path / "tuned"
    overrides = ["experiment=smoke", "data=files", *files, f"init_from={run}",
                 "trainer.max_updates=40", "trainer.max_epochs=null", "optim.lr=0.001",
                 "optim.warmup_updates=10", "trainer.bleu_max_sentences=20",
                 "trainer.device=cpu", "data.max_len=128", f"hydra.run.dir={tuned}"]
    assert transformer_main(["prepare-data", *overrides]) == 0
    stores = sorted((tuned / "cache").iterdir())
    assert transformer_main(["train", *overrides]) == 0
    assert sorted((tuned / "cache").iterdir()) == stores  # train found them ready
    assert not list(tuned.glob("spm*.model"))  # the imported tokenizers, no new ones
    stored = load_checkpoint(tuned / "checkpoints/checkpoint_last.pt")
    assert stored["config"]["init_from"] == str(run)
    assert stored["model_config"]["activation"] == "swish"
    before = valid_loss(run / "checkpoints/checkpoint_best.pt", text)
    after = valid_loss(tuned / "checkpoints/checkpoint_last.pt", text)
    assert after < before - 0.5
    export_ctranslate2(Translator.load(tuned, device="cpu"), tmp_path / "ct2")
    lines = text["test_2016_flickr.en"][:10]
    translations = load_translator(tmp_path / "ct2", "ctranslate2", device="cpu").translate(
        lines, beam_size=1)
    assert translations == Translator.load(tuned, device="cpu").translate(lines, beam_size=1)
