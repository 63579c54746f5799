"""Our engine in int8 (`Translator.load(..., quantize="int8")`, `transformer translate
--quantize int8`): every linear layer is PyTorch's dynamically quantized one and computes
what `torch.ao.quantization.quantize_dynamic` makes of that layer alone; the tied embedding
keeps its float32 values; a trained model translates as well in int8 as in float32;
values and combinations that cannot work are refused in one line naming the option."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest
import sacrebleu
import torch
from conftest import run_command  # tests/conftest.py
from torch import nn
from torch.ao.nn.quantized.dynamic import Linear as DynamicQuantizedLinear

from transformer import hardware
from transformer.cli import serve as serve_command
from transformer.cli.options import load_model
from transformer.data.batching import pad_rows
from transformer.decoding.corpus import search_corpus
from transformer.decoding.request import DecodingRequest, RequestError, check_quantize, option_name
from transformer.decoding.translator import Translator
from transformer.deploy.export import EXPORT_INFO, export_ctranslate2
from transformer.deploy.hf import export_hf
from transformer.errors import ConfigError, ExportError
from transformer.model import int8
from transformer.model.int8 import quantize_int8, rows_per_call
from transformer.model.transformer import ModelConfig
from transformer.run.checkpoint import load_checkpoint, model_from_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture(scope="module")
def random_pair(random_checkpoint) -> tuple[Translator, Translator]:
    """`random_checkpoint` loaded twice on the CPU: float32, and with quantize="int8"."""
    return (Translator.load(random_checkpoint, "cpu"),
            Translator.load(random_checkpoint, "cpu", quantize="int8"))


def linear_layers(model: nn.Module) -> dict[str, nn.Linear]:
    return {name: m for name, m in model.named_modules() if isinstance(m, nn.Linear)}


def reference_int8(layer: nn.Linear, engine: str | None = None) -> nn.Module:
    """`quantize_dynamic` applied to a standalone `nn.Linear` with `layer`'s weights, packed
    for `engine`'s kernels (default: the engine selected)."""
    alone = nn.Linear(layer.in_features, layer.out_features, bias=layer.bias is not None)
    alone.load_state_dict(layer.state_dict())
    selected = torch.backends.quantized.engine
    torch.backends.quantized.engine = engine or selected
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # PyTorch's deprecation notices
            return torch.ao.quantization.quantize_dynamic(nn.Sequential(alone), {nn.Linear},
                                                          dtype=torch.qint8)[0]
    finally:
        torch.backends.quantized.engine = selected


def engine_of(layer: nn.Linear) -> str | None:
    """The engine `quantize_int8` packs `layer` for: oneDNN's for the wide layers where
    PyTorch has it, else the engine selected (None)."""
    wide = layer.out_features >= hardware.TUNING.int8_onednn_min_outputs
    return "onednn" if hardware.TUNING.int8_onednn and wide else None


def test_every_linear_layer_is_pytorchs_int8_layer(random_pair):
    floating, quantized = random_pair
    layers = linear_layers(floating.model)
    # encoder blocks: attention 4 + FFN 2; decoder blocks: 4 + 4 + 2; + the output projection
    c = floating.model.config
    assert len(layers) == 6 * c.num_encoder_layers + 10 * c.num_decoder_layers + 1
    modules = dict(quantized.model.named_modules())
    assert not linear_layers(quantized.model)
    torch.manual_seed(0)
    for name, layer in layers.items():
        assert isinstance(modules[name], DynamicQuantizedLinear), name
        x = torch.randn(3, 5, layer.in_features)
        expected = reference_int8(layer, engine_of(layer))(x)
        assert torch.equal(modules[name](x), expected), name
        assert not torch.equal(layer(x), expected), name  # int8 is not float32


def test_int8_logits_are_close_to_float32_not_equal(random_pair):
    floating, quantized = random_pair
    torch.manual_seed(0)
    src = torch.randint(4, floating.model.config.src_vocab_size, (2, 9))
    lens = torch.tensor([9, 6])
    tgt = torch.randint(4, floating.model.config.tgt_vocab_size, (2, 7))
    with torch.no_grad():
        a, b = floating.model(src, lens, tgt), quantized.model(src, lens, tgt)
    assert not torch.equal(a, b)
    assert (a - b).abs().max() < 0.1 * a.abs().max()
    assert torch.corrcoef(torch.stack([a.flatten(), b.flatten()]))[0, 1] > 0.99


def test_tied_embedding_keeps_its_float32_values(random_checkpoint, random_pair):
    floating, quantized = random_pair
    f, q = floating.model, quantized.model
    assert f.config.tie_output and f.output_projection.weight is f.decoder.embedding.weight
    original = model_from_checkpoint(load_checkpoint(random_checkpoint), "random")
    assert torch.equal(q.decoder.embedding.weight, original.decoder.embedding.weight)
    assert torch.equal(q.encoder.embedding.weight, original.encoder.embedding.weight)
    # the projection holds the embedding in int8: equal to it within half a step
    weight = q.output_projection.weight()
    assert weight.dtype == torch.qint8
    step = weight.q_scale()
    assert (weight.dequantize() - original.decoder.embedding.weight).abs().max() <= step / 2 + 1e-6
    assert q.device == torch.device("cpu")  # read from the embedding: still a float tensor
    assert quantized.num_parameters == floating.num_parameters == original.num_parameters()


def test_an_int8_layer_takes_its_rows_in_chunks_of_bounded_output(tuning):
    """FBGEMM's int8 layers slow down once a call's output is large: `quantize_int8`'s
    layers on FBGEMM take at most int8_max_outputs // out_features rows per call, each chunk
    exactly what the plain int8 layer gives for it, in order, whatever the leading shape."""
    table = tuning(int8_onednn=False)  # a PyTorch without oneDNN's int8 engine
    torch.manual_seed(0)
    layer = nn.Linear(16, 4096)
    quantized = quantize_int8(nn.Sequential(layer))[0]
    rows = table.int8_max_outputs // 4096
    x = torch.randn(3, 100, 16)  # 300 rows: 3 chunks
    expected = torch.cat([reference_int8(layer)(chunk) for chunk in x.reshape(-1, 16).split(rows)])
    assert torch.equal(quantized(x), expected.view(3, 100, 4096))
    small = torch.randn(rows, 16)  # one chunk: the plain layer itself
    assert torch.equal(quantized(small), reference_int8(layer)(small))
    steps = torch.randn(2, 5, 16)  # a decoding step's (sentences, beam, features)
    assert torch.equal(quantized(steps), reference_int8(layer)(steps))


def test_joined_int8_layers_compute_each_layers_product_bit_for_bit(tuning):
    """`int8.joined_int8` joins FBGEMM int8 layers of one shape into one layer whose output
    is their outputs side by side, bit for bit (each weight keeps its own scale), at any
    rows, in the row chunks each of them takes; the joined layer is kept for the next call
    while the layers keep their weights, made anew when one is given others; float layers,
    or int8 ones of other shapes, are not joined."""
    torch.manual_seed(0)
    layers = [nn.Linear(16, 24) for _ in range(3)]
    with torch.no_grad():
        layers[1].weight.mul_(5)  # another scale
    quantized = list(quantize_int8(nn.Sequential(*layers)))
    joined = int8.joined_int8(quantized)
    assert joined is not None and joined.out_features == 72
    for rows in (1, 5, 14, 300):
        x = torch.randn(rows, 16)
        separate = torch.cat([reference_int8(layer)(x) for layer in layers], 1)
        assert torch.equal(joined(x), separate), rows
    tuning(int8_max_outputs=24 * 7)  # each layer's chunks: 7 rows
    x = torch.randn(30, 16)
    assert rows_per_call(joined) == rows_per_call(quantized[0]) == 7
    assert torch.equal(joined(x), torch.cat([layer(x) for layer in quantized], 1))
    assert int8.joined_int8(quantized) is joined
    quantized[2].set_weight_bias(quantized[0].weight(), quantized[0].bias())
    rejoined = int8.joined_int8(quantized)
    assert rejoined is not joined
    assert torch.equal(rejoined(x)[:, 48:], quantized[0](x))
    assert int8.joined_int8(layers) is None
    other = quantize_int8(nn.Sequential(nn.Linear(16, 8)))[0]
    assert int8.joined_int8([quantized[0], other]) is None


@pytest.mark.parametrize("onednn", [True, False])
def test_the_wide_int8_layers_are_packed_for_onednn_and_take_any_rows(onednn, monkeypatch,
                                                                     tuning):
    """With oneDNN's int8 engine (forced here either way), `quantize_int8` packs the layers of
    at least int8_onednn_min_outputs outputs for oneDNN's kernels and the others for the
    engine selected; a layer on oneDNN takes all its rows in one call, as the plain layer
    does, and is fed int8_onednn_chunk_rows rows at a time by beam search
    (`rows_per_call`)."""
    table = tuning(int8_onednn=onednn)
    packed = []  # (layer names, engine) of each packing
    pack = int8.quantize_linears
    monkeypatch.setattr(int8, "quantize_linears",
                        lambda model, names, engine: (packed.append((set(names), engine)),
                                                      pack(model, names, engine)))
    torch.manual_seed(0)
    wide, narrow = nn.Linear(16, table.int8_onednn_min_outputs), nn.Linear(16, 64)
    quantized = quantize_int8(nn.Sequential(wide, nn.ReLU(), narrow))
    selected = torch.backends.quantized.engine
    assert packed == ([({"2"}, selected), ({"0"}, "onednn")] if onednn
                      else [({"0", "2"}, selected), (set(), "onednn")])
    x = torch.randn(3, 300, 16)  # 900 rows: more than either chunk of the wide layer
    assert rows_per_call(quantized[0]) == (
        table.int8_onednn_chunk_rows if onednn else table.int8_max_outputs // 2048)
    expected = reference_int8(wide, "onednn" if onednn else None)
    if onednn:
        assert torch.equal(quantized[0](x), expected(x))
    assert rows_per_call(quantized[2]) == table.int8_max_outputs // 64
    assert torch.equal(quantized[2](x), reference_int8(narrow)(x))


def search_counting_projection_rows(model, beam: int) -> tuple[list, list[int]]:
    """Beam search (beam `beam`, 2-best) over seven random sources of 3-12 pieces -> its
    n-best lists and the rows of each call of `model`'s output projection."""
    gen = torch.Generator().manual_seed(0)
    sources = [torch.randint(4, 60, (n,), generator=gen).tolist() + [model.config.eos_id]
               for n in (3, 5, 7, 7, 9, 11, 12)]
    rows = []  # rows of each call of the projection
    hook = model.output_projection.register_forward_pre_hook(
        lambda _, args: rows.append(len(args[0])))
    try:
        return search_corpus(model, sources, DecodingRequest(beam_size=beam, nbest=2)), rows
    finally:
        hook.remove()


def test_beam_search_feeds_the_int8_projection_whole_sentences_in_its_row_chunks(
        random_pair, monkeypatch, tuning):
    """Beam search computes the int8 output projection's logits `rows_per_call` rows at a
    time (whole sentences: a sentence's beams are ranked together), never joined into one
    (rows, vocabulary) tensor, and finds what one joined projection finds: the layer cuts
    the same chunks from it."""
    import transformer.decoding.search as search

    model = random_pair[1].model
    projection = model.output_projection
    beam = 5
    tuning(int8_max_outputs=2 * beam * projection.out_features)
    assert rows_per_call(projection) == 2 * beam  # two sentences per call
    assert rows_per_call(random_pair[0].model.output_projection) is None  # float32: any
    chunked, rows = search_counting_projection_rows(model, beam)
    assert max(rows) == 2 * beam and rows.count(beam) > 0  # the odd sentence out: 1 of 7
    monkeypatch.setattr(search, "rows_per_call", lambda layer: None)  # one call per step
    joined, rows = search_counting_projection_rows(model, beam)
    assert max(rows) > 2 * beam
    assert [[h.tokens for h in hyps] for hyps in chunked] == \
        [[h.tokens for h in hyps] for hyps in joined]
    assert [[h.score for h in hyps] for hyps in chunked] == \
        [[h.score for h in hyps] for hyps in joined]


def test_beam_search_feeds_a_onednn_projection_whole_sentences_in_its_chunks(
        random_pair, tuning):
    """An output projection packed for oneDNN takes any number of rows, and beam search
    feeds it `rows_per_call` rows at a time, whole sentences (int8_onednn_chunk_rows
    forced down to two sentences' rows here); what the search finds with it stays within
    int8 of float32: the same best output on most inputs."""
    float_model = random_pair[0].model
    vocab = float_model.output_projection.out_features
    beam = 5
    tuning(int8_onednn=True, int8_onednn_min_outputs=vocab,  # the projection only
           int8_onednn_chunk_rows=2 * beam)
    model = quantize_int8(float_model)
    projection = model.output_projection
    assert type(projection) is DynamicQuantizedLinear  # packed for oneDNN, not row-chunked
    assert rows_per_call(projection) == 2 * beam
    found, rows = search_counting_projection_rows(model, beam)
    assert max(rows) == 2 * beam and rows.count(beam) > 0  # the odd sentence out: 1 of 7
    expected, _ = search_counting_projection_rows(float_model, beam)
    assert [len(hyps) for hyps in found] == [2] * len(expected)
    same = sum(a[0].tokens == b[0].tokens for a, b in zip(found, expected, strict=True))
    assert same > len(expected) // 2


def test_the_model_given_is_left_float32(random_checkpoint):
    model = model_from_checkpoint(load_checkpoint(random_checkpoint), "random")
    before = {k: v.clone() for k, v in model.state_dict().items()}
    quantized = quantize_int8(model)
    assert linear_layers(model) and not linear_layers(quantized)
    assert model.output_projection.weight is model.decoder.embedding.weight
    assert all(torch.equal(v, before[k]) for k, v in model.state_dict().items())


@pytest.fixture(scope="module")
def trained_pair(en_de_checkpoint) -> tuple[Translator, Translator]:
    """The trained en->de model (`en_de_checkpoint`), float32 and int8."""
    return (Translator.load(en_de_checkpoint, "cpu"),
            Translator.load(en_de_checkpoint, "cpu", quantize="int8"))


@pytest.mark.parametrize("beam_size", [1, 4])
def test_trained_model_int8_translates_as_float32_does(trained_pair, multi30k_lines,
                                                       beam_size):
    """On the test slice: the same BLEU within 0.5 (the bound the CTranslate2 int8 export
    keeps, tests/test_export.py), nearly always the same first words, and many lines
    the same throughout. The model is small and weakly trained: its outputs often run into
    near ties, where int8's rounding picks the other token and the rest of the line
    differs (CTranslate2's int8 export, too, changes many of its lines), and PyTorch's
    int8 scale of a layer's input is the whole batch's, so the batch matters as well."""
    floating, quantized = trained_pair
    src, refs = (multi30k_lines(f"test_2016_flickr.{lang}.gz") for lang in ("en", "de"))
    a = floating.translate(src, beam_size=beam_size)
    b = quantized.translate(src, beam_size=beam_size)
    assert len(b) == len(src) and all(isinstance(t, str) for t in b)
    # An empty output is a hypothesis like any other: on one line of the slice float32's
    # beam holds it 4th, and int8's rounding, with one input scale per batch, can rank it
    # first. Rare, not a failure mode.
    assert sum(not t for t in b) <= 0.01 * len(src)
    same = sum(x == y for x, y in zip(a, b, strict=True)) / len(src)
    start = sum(x.split()[:3] == y.split()[:3] for x, y in zip(a, b, strict=True)) / len(src)
    assert same >= 0.35 and start >= 0.85, (same, start)
    bleu = [sacrebleu.corpus_bleu(hyps, [refs]).score for hyps in (a, b)]
    assert bleu[0] > 1.0 and abs(bleu[1] - bleu[0]) <= 0.5, bleu


def test_trained_model_int8_picks_float32s_tokens(trained_pair, multi30k_lines):
    """Fed float32's greedy translations (teacher-forced), the int8 model's most likely
    next token is float32's at >= 90% of the steps."""
    floating, quantized = trained_pair
    src = multi30k_lines("test_2016_flickr.en.gz")[:100]
    c = floating.model.config
    ids = floating.encode_sources(src)
    outputs = [sentence[0].tokens for sentence in
               search_corpus(floating.model, ids, DecodingRequest(beam_size=1))]
    sources, lens = pad_rows(ids, c.pad_id, "cpu")
    tgt_in, tgt_lens = pad_rows([[c.start_id, *out] for out in outputs], c.pad_id, "cpu")
    with torch.no_grad():
        picked = [t.model(sources, lens, tgt_in).argmax(-1) for t in trained_pair]
    steps = torch.arange(tgt_in.shape[1])[None] < tgt_lens[:, None]  # (batch, len)
    agree = [((picked[0] == p) & steps).sum() / steps.sum() for p in (tgt_out(outputs, c),
                                                                      picked[1])]
    assert agree[0] >= 0.99 and 0.9 <= agree[1] < 1.0, agree


def tgt_out(outputs: list[list[int]], c: ModelConfig) -> torch.Tensor:
    """The tokens the decoder should predict (outputs + EOS), padded: (batch, len)."""
    return pad_rows([[*out, c.eos_id] for out in outputs], c.pad_id, "cpu")[0]


@pytest.mark.parametrize("value", ["int4", "INT8", "", 8])
def test_other_values_are_refused_naming_value_and_choices(random_checkpoint, value):
    with pytest.raises(ConfigError) as error:
        Translator.load(random_checkpoint, "cpu", quantize=value)
    message = str(error.value)
    assert "\n" not in message and message.startswith("quantize must be")
    assert repr(value) in message and "'int8'" in message and "None" in message


def test_a_gpu_is_refused_naming_quantize():
    with pytest.raises(RequestError) as error:
        check_quantize("int8", torch.device("cuda:0"))
    assert str(error.value).startswith("quantize int8 is a CPU path")
    assert error.value.message(option_name).startswith("--quantize int8 is a CPU path")
    assert "cuda:0" in str(error.value) and "--device cpu" in error.value.message(option_name)
    check_quantize("int8", torch.device("cpu"))
    check_quantize(None, torch.device("cuda:0"))


@pytest.mark.parametrize("export", [export_ctranslate2, export_hf])
def test_an_int8_translator_is_not_exported(random_pair, tmp_path, export):
    """Its float32 weights are gone: refused in one line, before anything is written."""
    with pytest.raises(ExportError) as error:
        export(random_pair[1], tmp_path / "out", source="random.pt")
    assert "\n" not in str(error.value)
    assert str(error.value).startswith("random.pt was loaded with quantize='int8'")
    assert list(tmp_path.iterdir()) == []


# ---- the command line ---------------------------------------------------------------------------


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


SOURCES = ["A man rides a bike.", "Two dogs play in the snow.", "A woman reads a book."]


def test_translate_quantize_int8_scores_with_the_int8_model(random_checkpoint, random_pair,
                                                           tmp_path):
    """`--score` prints the log-probabilities the int8 model gives, not float32's."""
    src = write_lines(tmp_path / "src.txt", SOURCES)
    ref = write_lines(tmp_path / "ref.txt", SOURCES[::-1])
    out = tmp_path / "scores.txt"
    status, err = run_command(["translate", "--checkpoint", str(random_checkpoint),
                               "--input", str(src), "--reference", str(ref), "--score",
                               "--output", str(out), "--device", "cpu", "--quantize", "int8"])
    assert status == 0, err
    printed = [float(row.split("\t")[0]) for row in out.read_text().splitlines()]
    floating, quantized = (t.score(SOURCES, SOURCES[::-1]) for t in random_pair)
    assert printed == [pytest.approx(h.log_prob, abs=1e-5) for h in quantized]
    assert printed != [pytest.approx(h.log_prob, abs=1e-5) for h in floating]


def test_translate_quantize_int4_is_a_usage_error_naming_quantize(random_checkpoint):
    status, err = run_command(["translate", "--checkpoint", str(random_checkpoint),
                               "--quantize", "int4"])
    named = [line for line in err.splitlines() if "--quantize" in line and "int4" in line]
    assert status == 2 and len(named) == 1, err
    assert "invalid choice" in named[0] and "int8" in named[0]


def fake_export(folder: Path) -> Path:
    """A directory that `engine_for` takes for an export (refused before it is read)."""
    folder.mkdir()
    (folder / EXPORT_INFO).write_text("{}")
    (folder / "model.bin").write_bytes(b"")
    return folder


@pytest.mark.parametrize("engine", ["ctranslate2", "auto"])
def test_quantize_with_ctranslate2_is_refused_in_one_line(random_checkpoint, tmp_path, engine):
    model = fake_export(tmp_path / "ct2") if engine == "auto" else random_checkpoint
    src = write_lines(tmp_path / "src.txt", SOURCES)
    out = tmp_path / "out.txt"
    status, err = run_command(["translate", "--checkpoint", str(model), "--engine", engine,
                               "--quantize", "int8", "--input", str(src),
                               "--output", str(out)])
    assert status == 1 and err.count("\n") == 1, err
    assert err.startswith("error: --quantize is our engine's (torch)")
    assert "transformer export --quantization int8" in err and "--engine ctranslate2" in err
    assert not out.exists()


def test_serve_quantize_int8_serves_the_int8_model(random_checkpoint, random_pair):
    """`transformer serve --quantize int8` loads the int8 model (`load_model`, as the
    command does); its translations and attention come from it."""
    testclient = pytest.importorskip("fastapi.testclient")
    from transformer.deploy.serve import create_app

    args = serve_command.build_parser().parse_args(
        ["--checkpoint", str(random_checkpoint), "--device", "cpu", "--quantize", "int8"])
    translator = load_model(args)
    assert translator.quantize == "int8" and not linear_layers(translator.model)
    with testclient.TestClient(create_app(translator)) as client:
        answer = client.post("/translate", json={"text": SOURCES, "beam_size": 2})
        assert answer.json() == {"translations": random_pair[1].translate(SOURCES,
                                                                          beam_size=2)}
        assert client.post("/attention", json={"text": SOURCES[0]}).status_code == 200
        assert client.get("/info").json()["parameters"] == random_pair[0].num_parameters
