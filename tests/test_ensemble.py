"""Ensembles (transformer.model.ensemble): several models in one search. References: a
greedy loop over the models' full forward passes, the members' own teacher-forced
log-probabilities, and one model (an ensemble of copies of it decodes exactly as it does)."""

from __future__ import annotations

import copy
import gzip
from dataclasses import replace

import pytest
import torch
from test_search import random_batch, random_model

from transformer.cli import translate as translate_command
from transformer.data.tokenizer import Tokenizer, TokenizerPair
from transformer.decoding.alignment import attention_weights
from transformer.decoding.corpus import search_corpus
from transformer.decoding.request import AlignmentOptions, DecodingRequest, Sampling
from transformer.decoding.search import beam_search, max_output_lengths, sample_search
from transformer.decoding.translator import Translator
from transformer.deploy.engines import load_translator
from transformer.errors import CheckpointError, ExportError
from transformer.model.ensemble import Ensemble, mean_logits
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run.checkpoint import inference_checkpoint, save_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


def tokens(hyps):
    return [[h.tokens for h in sentence] for sentence in hyps]


@torch.no_grad()
def reference_greedy(models, src, lens, max_lens) -> list[list[int]]:
    """Greedy search, one sentence at a time, each step the full forward pass of every model
    over the whole prefix: the token with the largest mean of the models' log-softmax
    (PAD and BOS excluded), EOS at the length limit."""
    c = models[0].config
    outputs = []
    for i in range(len(src)):
        out: list[int] = []
        for step in range(int(max_lens[i]) + 1):
            tgt_in = torch.tensor([[c.start_id, *out]])
            log_probs = []
            for m in models:
                logits = m(src[i:i + 1], lens[i:i + 1], tgt_in)[0, -1].float()
                logits[[c.pad_id, c.start_id]] = float("-inf")
                log_probs.append(torch.log_softmax(logits, -1))
            token = int(torch.stack(log_probs).mean(0).argmax())
            if token == c.eos_id or step == int(max_lens[i]):
                break
            out.append(token)
        outputs.append(out)
    return outputs


@pytest.fixture(scope="module")
def models():
    return [random_model(seed=seed, eos_logit=1.5) for seed in (0, 1, 2)]


def test_mean_logits_normalize_to_the_mean_log_probability():
    a, b = torch.randn(4, 9), torch.randn(4, 9)
    expected = torch.log_softmax((torch.log_softmax(a, -1) + torch.log_softmax(b, -1)) / 2, -1)
    got = torch.log_softmax(mean_logits([a.clone(), b.clone()]), -1)
    torch.testing.assert_close(got, expected)
    assert mean_logits([a]) is a


def test_greedy_ensemble_equals_the_full_forward_reference(models):
    src, lens = random_batch(batch=6)
    request = DecodingRequest(beam_size=1)
    max_lens = max_output_lengths(lens, request.max_len_a, request.max_len_b, 64)
    got = [h.tokens for h in sample_search(Ensemble(models), src, lens, request)]
    assert got == reference_greedy(models, src, lens, max_lens)
    single = [h.tokens for h in sample_search(models[0], src, lens, request)]
    assert got != single  # the other members change the outputs


def test_copies_of_one_model_decode_as_the_model(models):
    """The mean of equal logits is those logits, bit for bit: beam search, n-best, sampling
    and scores equal the model's own."""
    src, lens = random_batch()
    twins = Ensemble([models[0], copy.deepcopy(models[0])])
    request = DecodingRequest(beam_size=4, nbest=3)
    assert beam_search(twins, src, lens, request) == beam_search(models[0], src, lens, request)
    drawn = DecodingRequest(beam_size=1, sampling=Sampling(topk=5, temperature=1.5))
    assert (sample_search(twins, src, lens, drawn, generator=torch.Generator().manual_seed(3))
            == sample_search(models[0], src, lens, drawn,
                             generator=torch.Generator().manual_seed(3)))


def test_ensemble_beam_search_cached_equals_uncached_and_batched(models):
    ensemble = Ensemble(models)
    src, lens = random_batch(batch=10)
    request = DecodingRequest(beam_size=4, nbest=2)
    cached = beam_search(ensemble, src, lens, request)
    assert tokens(cached) == tokens(beam_search(ensemble, src, lens,
                                                DecodingRequest(beam_size=4, nbest=2,
                                                                use_cache=False)))
    sources = [row[:n].tolist() for row, n in zip(src, lens, strict=True)]
    assert tokens(search_corpus(ensemble, sources, request, max_tokens=12)) == tokens(cached)


def test_members_must_share_the_vocabulary(models):
    other = Transformer(ModelConfig(src_vocab_size=60, tgt_vocab_size=60, num_hiddens=32,
                                    ffn_num_hiddens=64, num_heads=4, num_encoder_layers=1,
                                    num_decoder_layers=1, max_positions=64))
    with pytest.raises(ValueError, match="member 2 differs from member 1 in src_vocab_size"):
        Ensemble([models[0], other])
    with pytest.raises(ValueError, match="at least two"):
        Ensemble([models[0]])


# ---- the translator and the command ---------------------------------------------------------

def save_model(path, tokenizer_path, seed: int, **config):
    tokenizer = Tokenizer.load(tokenizer_path)
    torch.manual_seed(seed)
    model = Transformer(ModelConfig(**{
        "src_vocab_size": tokenizer.vocab_size, "tgt_vocab_size": tokenizer.vocab_size,
        "num_hiddens": 32, "ffn_num_hiddens": 64, "num_heads": 4, "num_encoder_layers": 2,
        "num_decoder_layers": 2, "max_positions": 64, **config}))
    save_checkpoint(inference_checkpoint(model, TokenizerPair(tokenizer, tokenizer),
                                         training_config=None), path)
    return path


@pytest.fixture(scope="module")
def members(random_checkpoint, multi30k_small_tokenizer_path, tmp_path_factory):
    """Three checkpoints with the small tokenizer: different seeds, one of another size."""
    folder = tmp_path_factory.mktemp("members")
    return [random_checkpoint,
            save_model(folder / "b.pt", multi30k_small_tokenizer_path, 1),
            save_model(folder / "c.pt", multi30k_small_tokenizer_path, 2, num_hiddens=48,
                       num_decoder_layers=1, max_positions=48)]


LINES = ["A man rides a bike.", "", "Two dogs play in the snow.", "A girl in a red dress."]


def test_translator_ensemble_translates_scores_and_aligns(members):
    ensemble = Translator.load(members, device="cpu", ensemble=True)
    assert ensemble.model_config.max_positions == 48  # every member's limit
    assert ensemble.num_parameters == sum(Translator.load(m, device="cpu").num_parameters
                                          for m in members)
    translations = ensemble.translations(LINES, beam_size=3, nbest=2,
                                         alignment=AlignmentOptions())
    assert translations[1][0].text == ""
    models = [Translator.load(m, device="cpu").model for m in members]
    sources = ensemble.encode_sources(LINES)
    expected = search_corpus(Ensemble(models), sources, ensemble.request(beam_size=3, nbest=2))
    assert [[t.text for t in hyps] for hyps in translations] == \
           [[ensemble._decode(h.tokens) for h in hyps] for hyps in expected]
    done = [i for i, src in enumerate(sources) if src]  # alignments: the first member's
    weights = attention_weights(models[0], [sources[i] for i in done],
                                [expected[i][0].tokens for i in done], AlignmentOptions(), 4096)
    for i, w in zip(done, weights, strict=True):
        hyp = replace(expected[i][0], attention=w)
        assert translations[i][0].alignment == ensemble._translation(hyp, sources[i], 0).alignment
    texts = [hyps[0].text for hyps in translations]
    # forced decoding: the normalized mean of the members' own teacher-forced log-probs
    scored = ensemble.score(LINES[:1], texts[:1])[0]
    src = torch.tensor([sources[0]])
    tgt = ensemble.tokenizers.tgt.encode(texts[0]) + [ensemble.tokenizers.tgt.specials.eos]
    tgt_in = torch.tensor([[models[0].config.start_id, *tgt[:-1]]])
    with torch.no_grad():
        log_probs = torch.stack([torch.log_softmax(m(src, torch.tensor([src.shape[1]]),
                                                     tgt_in)[0].float(), -1) for m in models])
    mixed = torch.log_softmax(log_probs.mean(0), -1)
    assert scored.log_prob == pytest.approx(float(mixed[range(len(tgt)), tgt].sum()), abs=1e-4)


def test_int8_ensemble_quantizes_every_member(random_checkpoint):
    twins = Translator.load([random_checkpoint, random_checkpoint], device="cpu",
                            ensemble=True, quantize="int8")
    single = Translator.load(random_checkpoint, device="cpu", quantize="int8")
    assert twins.translate(LINES) == single.translate(LINES)
    linear = sum(type(m).__name__ == "Linear" for m in twins.model.modules())
    assert linear == 0  # every member's linear layers are int8


def test_ensemble_refusals_name_what_differs(members, tmp_path, copy_checkpoint):
    with pytest.raises(CheckpointError, match="their source and target tokenizers differ"):
        Translator.load([members[0], copy_checkpoint], device="cpu", ensemble=True)
    with pytest.raises(CheckpointError, match="at least two checkpoints"):
        Translator.load([members[0]], device="cpu", ensemble=True)
    with pytest.raises(ExportError, match="ctranslate2 engine does not decode ensembles"):
        load_translator(members, "ctranslate2", ensemble=True)
    with pytest.raises(CheckpointError, match="--ensemble"):  # averaging other runs' weights
        Translator.load([members[0], members[2]], device="cpu")


def test_the_server_serves_an_ensemble(members):
    from fastapi.testclient import TestClient

    from transformer.deploy.serve import create_app

    ensemble = Translator.load(members, device="cpu", ensemble=True)
    with TestClient(create_app(ensemble)) as client:
        answer = client.post("/translate", json={"text": LINES, "beam_size": 3}).json()
        assert answer == {"translations": ensemble.translate(LINES, beam_size=3)}
        heads = client.post("/attention", json={"text": LINES[0]}).json()
        first = Translator.load(members[0], device="cpu").model
        assert len(heads["layers"]) == 3 * 2  # the first member's 2 + 2 blocks' layers
        assert heads["num_heads"] == first.config.num_heads
        info = client.get("/info").json()
        alone = [Translator.load(path, device="cpu") for path in members]
        assert info["models"] == len(members)
        assert info["parameters"] == sum(t.num_parameters for t in alone)
        # the first member's config, within the positions every member has
        assert info["model"] == {**first.config.to_dict(), "max_positions": min(
            t.model_config.max_positions for t in alone)}


def test_translate_command_ensemble(members, tmp_path, capsys):
    source = tmp_path / "in.en"
    source.write_text("\n".join(LINES) + "\n")
    out = tmp_path / "out.de"
    assert translate_command.main(["--checkpoint", *map(str, members), "--ensemble",
                                   "--input", str(source), "--output", str(out),
                                   "--beam-size", "3", "--device", "cpu"]) == 0
    ensemble = Translator.load(members, device="cpu", ensemble=True)
    assert out.read_text().splitlines() == ensemble.translate(LINES, beam_size=3)
    packed = tmp_path / "in.en.gz"  # a gzipped input reads as the plain one
    packed.write_bytes(gzip.compress(source.read_bytes()))
    assert translate_command.main(["--checkpoint", *map(str, members), "--ensemble",
                                   "--input", str(packed), "--output", str(out),
                                   "--beam-size", "3", "--device", "cpu"]) == 0
    assert out.read_text().splitlines() == ensemble.translate(LINES, beam_size=3)
