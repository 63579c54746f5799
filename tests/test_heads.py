"""Head masks, pruning, importance and attention maps (transformer.tools.heads and its scripts).

All models are tiny and random (vocabulary of a SentencePiece model trained here on 600
Multi30k lines); nothing is trained.
"""

from __future__ import annotations

import copy
import csv
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from outputs import scored

from transformer.cli import attention_maps as attention_maps_command
from transformer.cli import head_importance as head_importance_command
from transformer.cli import prune_heads as prune_heads_command
from transformer.data.tokenizer import PAD_ID, Tokenizer, TokenizerPair
from transformer.decoding.request import DecodingRequest
from transformer.decoding.search import beam_search
from transformer.decoding.translator import Translator
from transformer.errors import CheckpointError
from transformer.model.attention import MultiHeadAttention
from transformer.model.transformer import ModelConfig, Transformer
from transformer.run.checkpoint import (
    average_checkpoints,
    check_model_config,
    inference_checkpoint,
    load_checkpoint,
    model_from_checkpoint,
    save_checkpoint,
)
from transformer.run.compose import compose_config
from transformer.run.config import DecodingSettings, TrainConfig
from transformer.run.data_config import DataConfig
from transformer.runtime import DistEnv
from transformer.tools import attention_maps, heads
from transformer.training.trainer import Trainer

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# Heads of every kind of layer: encoder self, decoder self, encoder-decoder attention.
SOME_HEADS = {"encoder.blks.0.attention": [1], "decoder.blks.1.attention1": [0, 3],
              "decoder.blks.0.attention2": [2]}




@pytest.fixture(scope="module")
def pairs(multi30k_lines) -> tuple[list[str], list[str]]:
    """Six validation pairs (English, German)."""
    return multi30k_lines("val.en.gz")[:6], multi30k_lines("val.de.gz")[:6]


@pytest.fixture(scope="module")
def tokenizers(multi30k_small_tokenizer_path) -> TokenizerPair:
    tokenizer = Tokenizer.load(multi30k_small_tokenizer_path)
    return TokenizerPair(tokenizer, tokenizer)


def tiny_model(vocab: int = 50, seed: int = 0, **overrides) -> Transformer:
    torch.manual_seed(seed)
    config = dict(src_vocab_size=vocab, tgt_vocab_size=vocab, num_hiddens=32, ffn_num_hiddens=64,
                  num_heads=4, num_encoder_layers=2, num_decoder_layers=2, max_positions=128)
    return Transformer(ModelConfig(**{**config, **overrides})).eval()


def random_batch(vocab: int = 50, seed: int = 1):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (3, 9), generator=g)
    src_valid_lens = torch.tensor([9, 6, 2])
    src[1, 6:] = PAD_ID
    src[2, 2:] = PAD_ID
    tgt_in = torch.randint(4, vocab, (3, 7), generator=g)
    return src, src_valid_lens, tgt_in


def mask_for(model: Transformer, pruned: dict[str, list[int]]) -> dict[str, torch.Tensor]:
    """Head masks (`heads.head_masks`) that zero `pruned` (original indices of an unpruned
    model)."""
    masks = {}
    for name, hs in pruned.items():
        masks[name] = torch.ones(model.config.num_heads)
        masks[name][hs] = 0.0
    return masks


def save_model(model: Transformer, tokenizers: TokenizerPair, path: Path) -> Path:
    save_checkpoint(inference_checkpoint(model, tokenizers, training_config=None), path)
    return path


# ---- the head mask ----------------------------------------------------------------------


def test_default_path_is_unchanged():
    """No mask: same checkpoint format as before pruning existed; a mask of ones changes
    nothing on the fused or the explicit attention path."""
    model = tiny_model()
    before = {"src_vocab_size", "tgt_vocab_size", "num_hiddens", "ffn_num_hiddens",
              "num_heads", "num_encoder_layers", "num_decoder_layers", "dropout",
              "attention_dropout", "norm_first", "share_embeddings", "tie_output",
              "max_positions", "pad_id"}
    later = {"activation", "output_bias", "start_id", "eos_id"}  # defaults = the old model
    assert model.config.to_dict().keys() == before | later
    old_style = ModelConfig.from_dict({k: v for k, v in model.config.to_dict().items()
                                       if k in before})  # a checkpoint from before
    assert old_style.pruned_heads == {} and old_style == model.config
    for layer in attention_maps.attention_layers(model):
        assert layer.module.head_mask is None and layer.module.head_ids == [0, 1, 2, 3]

    torch.manual_seed(0)
    attention = MultiHeadAttention(32, 32, 32, 32, 4, 0.0).eval()
    X, Y = torch.randn(2, 5, 32), torch.randn(2, 60, 32)  # 60 keys: the fused path on CPU
    valid_lens = torch.tensor([60, 17])
    for need_weights in (False, True):
        plain = attention(X, Y, Y, valid_lens, need_weights=need_weights)
        with attention.masking_heads(torch.ones(4)):
            ones = attention(X, Y, Y, valid_lens, need_weights=need_weights)
        assert torch.equal(plain, ones)


def test_head_mask_scales_each_head_before_W_o():
    torch.manual_seed(0)
    attention = MultiHeadAttention(16, 16, 16, 16, 4, 0.0, bias=True).eval()
    X = torch.randn(2, 3, 16)
    with attention.masking_heads(torch.zeros(4)):
        torch.testing.assert_close(attention(X, X, X), attention.W_o.bias.expand(2, 3, 16))
    # One row per example: example 0 keeps every head, example 1 none.
    with attention.masking_heads(torch.tensor([[1.0, 1, 1, 1], [0, 0, 0, 0]])):
        out = attention(X, X, X)
    torch.testing.assert_close(out[0], attention(X, X, X)[0])
    torch.testing.assert_close(out[1], attention.W_o.bias.expand(3, 16))


# ---- pruning ------------------------------------------------------------------------------


def test_zero_mask_equals_pruning_and_pruned_model_is_smaller():
    model = tiny_model()
    src, src_valid_lens, tgt_in = random_batch()
    pruned = copy.deepcopy(model)
    pruned.prune_heads(SOME_HEADS)
    with heads.head_masks(model, mask_for(model, SOME_HEADS)):
        masked_logits = model(src, src_valid_lens, tgt_in)
        masked_hyps = beam_search(model, src, src_valid_lens, DecodingRequest(beam_size=3, nbest=2))
    torch.testing.assert_close(pruned(src, src_valid_lens, tgt_in), masked_logits,
                               rtol=1e-5, atol=1e-6)
    # Decoding over the key/value cache (beam reordering included) agrees too.
    pruned_hyps = beam_search(pruned, src, src_valid_lens, DecodingRequest(beam_size=3, nbest=2))
    assert [[h.tokens for h in s] for s in pruned_hyps] == \
        [[h.tokens for h in s] for s in masked_hyps]
    assert not torch.allclose(model(src, src_valid_lens, tgt_in), masked_logits)

    d, head_dim = 32, 8
    removed = sum(map(len, SOME_HEADS.values()))  # 4 heads: Q, K, V rows (+bias), W_o columns
    assert model.num_parameters() - pruned.num_parameters() == removed * (4 * head_dim * d
                                                                         + 3 * head_dim)
    layer = pruned.get_submodule("decoder.blks.1.attention1")
    assert layer.num_heads == 2 and layer.head_ids == [1, 2]
    assert layer.W_q.weight.shape == (16, 32) and layer.W_o.weight.shape == (32, 16)
    assert pruned.config.pruned_heads == SOME_HEADS


def test_pruning_in_steps_uses_original_head_indices():
    once, twice = tiny_model(), tiny_model()
    once.prune_heads({"decoder.blks.0.attention2": [0, 2]})
    twice.prune_heads({"decoder.blks.0.attention2": [2]})
    twice.prune_heads({"decoder.blks.0.attention2": [0, 2]})  # 2 again: ignored
    assert twice.config.pruned_heads == {"decoder.blks.0.attention2": [0, 2]}
    src, src_valid_lens, tgt_in = random_batch()
    torch.testing.assert_close(once(src, src_valid_lens, tgt_in),
                               twice(src, src_valid_lens, tgt_in))


def test_bad_pruning_is_refused_before_anything_changes():
    model = tiny_model()
    parameters = model.num_parameters()
    with pytest.raises(ValueError, match="removes every head"):
        model.prune_heads({"encoder.blks.1.attention": [0, 1, 2, 3]})
    with pytest.raises(ValueError, match="not an attention module"):
        model.prune_heads({"encoder.blks.1.ffn": [0]})
    with pytest.raises(ValueError, match=r"in \[0, 4\)"):
        model.prune_heads({"encoder.blks.0.attention": [4]})
    assert model.num_parameters() == parameters and model.config.pruned_heads == {}
    with pytest.raises(ValueError, match="cannot prune all"):
        MultiHeadAttention(8, 8, 8, 8, 2, 0.0).prune_heads([0, 1])
    base = tiny_model().config.to_dict()
    for bad in ({"decoder.blks.0.attention1": [2, 1]}, {"decoder.blks.0.attention1": []},
                {"decoder.blks.2.attention1": [0]}, {"encoder.blks.0.attention": [True]}):
        with pytest.raises(ValueError, match="model.pruned_heads"):
            ModelConfig.from_dict({**base, "pruned_heads": bad})


def test_pruned_checkpoint_rebuilds_itself_and_translates(tmp_path, tokenizers, pairs):
    model = tiny_model(tokenizers.src.vocab_size)
    model.prune_heads(SOME_HEADS)
    path = save_model(model, tokenizers, tmp_path / "pruned.pt")
    state = load_checkpoint(path)  # weights_only: the config is plain values
    assert state["model_config"]["pruned_heads"] == SOME_HEADS
    rebuilt = model_from_checkpoint(state, path).eval()
    assert rebuilt.num_parameters() == model.num_parameters()
    src, src_valid_lens, tgt_in = random_batch(tokenizers.src.vocab_size)
    torch.testing.assert_close(rebuilt(src, src_valid_lens, tgt_in),
                               model(src, src_valid_lens, tgt_in))

    check_model_config(state, model.config, path)
    with pytest.raises(CheckpointError, match="model.pruned_heads: checkpoint has"):
        check_model_config(state, tiny_model(tokenizers.src.vocab_size).config, path)
    other = save_model(model, tokenizers, tmp_path / "other.pt")
    averaged = average_checkpoints([path, other])
    assert model_from_checkpoint(averaged).num_parameters() == model.num_parameters()

    translations = Translator.load(path, device="cpu").translate(pairs[0][:2], beam_size=2)
    assert len(translations) == 2 and all(isinstance(t, str) for t in translations)


# ---- importance ---------------------------------------------------------------------------


def one_layer_model(vocab: int) -> Transformer:
    """1 + 1 layers: one attention layer of each kind, 12 heads (fewer PNGs to draw)."""
    return tiny_model(vocab, num_encoder_layers=1, num_decoder_layers=1)


def test_importance_scores_match_direct_computations(tokenizers, pairs):
    model = one_layer_model(tokenizers.src.vocab_size)
    translator = Translator(model, tokenizers, "cpu")
    sources, references = pairs
    report = heads.head_importance(translator, sources, references, max_tokens=64)
    assert len(report.heads) == 3 * 4 and report.search == "greedy"
    for s in report.heads:
        assert all(math.isfinite(v) for v in (s.delta_loss, s.delta_bleu, s.gradient,
                                               s.entropy)), s
        assert s.gradient > 0 and s.entropy >= 0

    # (a) The masked loss equals the loss of a model without that head, computed directly.
    batches = heads.teacher_forced_batches(tokenizers, sources, references, "cpu", 64)
    assert len(batches) > 1
    score = next(s for s in report.heads if s.name == "decoder.blks.0.attention2" and s.head == 2)
    pruned = copy.deepcopy(model)
    pruned.prune_heads({score.name: [score.head]})
    total = tokens = 0
    for batch in batches:
        logits = pruned(batch.src, batch.src_valid_lens, batch.tgt_in)
        total += F.cross_entropy(logits.transpose(1, 2), batch.tgt_out, ignore_index=PAD_ID,
                                 reduction="sum").item()
        tokens += batch.num_tgt_tokens
    assert report.loss + score.delta_loss == pytest.approx(total / tokens, rel=1e-5)

    # (b) Gradient importance: one sentence at a time, one scalar gate per head.
    expected = torch.zeros(4)
    layer = model.get_submodule(score.name)
    for src, ref in zip(sources, references, strict=True):
        (batch,) = heads.teacher_forced_batches(tokenizers, [src], [ref], "cpu")
        gate = torch.ones(4, requires_grad=True)
        with layer.masking_heads(gate):
            logits = model(batch.src, batch.src_valid_lens, batch.tgt_in)
        loss = F.cross_entropy(logits[0], batch.tgt_out[0], reduction="sum")
        expected += torch.autograd.grad(loss, gate)[0].abs()
    gradient = [s.gradient for s in report.heads if s.name == score.name]
    torch.testing.assert_close(torch.tensor(gradient), expected / len(sources),
                               rtol=1e-4, atol=1e-6)

    # (c) Entropy of encoder self-attention, from the weights of one sentence at a time.
    entropies, queries = torch.zeros(4), 0
    for src, ref in zip(sources, references, strict=True):
        src_ids, tgt_ids = tokenizers.src.encode(src), tokenizers.tgt.encode(ref)
        w = attention_maps.attention_maps(model, src_ids, tgt_ids)["encoder.blks.0.attention"]
        entropies += -(w * w.clamp_min(1e-30).log()).sum(-1).sum(-1)  # (heads,)
        queries += w.shape[1]
    entropy = [s.entropy for s in report.heads if s.name == "encoder.blks.0.attention"]
    torch.testing.assert_close(torch.tensor(entropy), entropies / queries, rtol=1e-4, atol=1e-6)


def test_heads_to_prune_ranks_normalized_scores_and_keeps_a_head_per_layer():
    model = tiny_model()
    names = model.config.attention_names()
    importance = {name: torch.tensor([4.0, 3.0, 2.0, 1.0]) for name in names}
    importance[names[0]] = torch.tensor([40.0, 30.0, 20.0, 10.0])  # same after normalizing
    importance[names[1]] = torch.tensor([1.0, 1.0, 1.0, 0.01])
    chosen = heads.heads_to_prune(model, importance, 0.25)  # 6 of 24 heads
    assert sum(map(len, chosen.values())) == 6
    assert chosen[names[1]] == [3]  # the lowest after normalization
    assert all(chosen[n] == [3] for n in names)  # one head per layer: 1/||s|| ties
    raw = heads.heads_to_prune(model, importance, 0.25, normalize=False)
    assert names[0] not in raw and 3 in raw[names[1]]  # raw scores: the large layer is safe
    everything = heads.heads_to_prune(model, importance, 1.0)
    assert all(len(everything[n]) == 3 for n in names)  # one head left everywhere
    model.prune_heads(everything)
    assert all(layer.module.num_heads == 1 for layer in attention_maps.attention_layers(model))


# ---- attention maps and scripts -----------------------------------------------------------


def test_attention_maps_shapes_and_state_restored(tmp_path, tokenizers, pairs):
    model = one_layer_model(tokenizers.src.vocab_size)
    model.prune_heads({"decoder.blks.0.attention2": [1]})
    model.train()
    src, ref = pairs[0][0], pairs[1][0]
    src_ids, tgt_ids = tokenizers.src.encode(src), tokenizers.tgt.encode(ref)
    maps = attention_maps.attention_maps(model, src_ids, tgt_ids)
    S, T = len(src_ids) + 1, len(tgt_ids) + 1
    assert maps["encoder.blks.0.attention"].shape == (4, S, S)
    assert maps["decoder.blks.0.attention1"].shape == (4, T, T)
    assert maps["decoder.blks.0.attention2"].shape == (3, T, S)  # a pruned head
    assert torch.all(maps["decoder.blks.0.attention1"].triu(1) == 0)  # causal
    for w in maps.values():
        torch.testing.assert_close(w.sum(-1), torch.ones(w.shape[:2]))
    assert model.training  # restored
    for layer in attention_maps.attention_layers(model):
        assert not layer.module.is_recording and layer.module.attention.attention_weights is None

    paths = attention_maps.write_attention_maps(model, tokenizers, src, ref, tmp_path)
    assert sorted(p.name for p in paths) == sorted(
        f"{kind}-0.png" for kind in ("enc-self", "dec-self", "enc-dec"))
    for path in paths:
        assert path.read_bytes()[:8] == PNG_MAGIC and path.stat().st_size > 5_000


def test_scripts_on_a_tiny_checkpoint(tmp_path, tokenizers, pairs, capsys):
    """attention_maps.py (translating first), head_importance.py and prune_heads.py on
    plain-text files; the pruned checkpoint translates."""
    path = save_model(one_layer_model(tokenizers.src.vocab_size), tokenizers, tmp_path / "m.pt")
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(pairs[0][:4]) + "\n", encoding="utf-8")
    ref.write_text("\n".join(pairs[1][:4]) + "\n", encoding="utf-8")

    assert attention_maps_command.main(["--checkpoint", str(path), "--source", pairs[0][0],
                                       "--output-dir", str(tmp_path / "maps"),
                                       "--beam-size", "2", "--device", "cpu"]) == 0
    assert len(list((tmp_path / "maps").glob("*.png"))) == 3

    out = tmp_path / "importance"
    assert head_importance_command.main(["--checkpoint", str(path), "--src", str(src),
                                        "--ref", str(ref), "--output-dir", str(out),
                                        "--device", "cpu"]) == 0
    table = capsys.readouterr().out
    assert "4 sentences: loss" in table and "enc-dec" in table
    with open(out / "head_importance.csv", encoding="utf-8") as f:
        rows = list(csv.DictReader(f))
    assert len(rows) == 12 and all(math.isfinite(float(r["gradient"])) for r in rows)
    png = out / "head_importance.png"
    assert png.read_bytes()[:8] == PNG_MAGIC and png.stat().st_size > 10_000
    # Without --src/--ref the language pair comes from the checkpoint, which has none here.
    assert head_importance_command.main(["--checkpoint", str(path), "--device", "cpu"]) == 1

    pruned = tmp_path / "pruned.pt"
    assert prune_heads_command.main(["--checkpoint", str(path), "--fraction", "0.3",
                                    "--output", str(pruned), "--src", str(src), "--ref",
                                    str(ref), "--device", "cpu"]) == 0
    state = load_checkpoint(pruned)
    assert sum(map(len, state["model_config"]["pruned_heads"].values())) == 4  # 0.3 x 12
    translator = Translator.load(pruned, device="cpu")
    assert translator.model.num_parameters() < model_from_checkpoint(
        load_checkpoint(path)).num_parameters()
    assert len(translator.translate(pairs[0][:2])) == 2


def test_pruning_a_tuned_checkpoint_keeps_its_decoding_settings(tmp_path, tokenizers, pairs):
    """prune_heads.py on a `chosen.pt` with a tuned alpha and beam: the pruned checkpoint
    decodes with them (its scores are those of that alpha), and keeps the run's config."""
    run_config = TrainConfig(data=DataConfig(src_lang="en", tgt_lang="de"))
    chosen = tmp_path / "chosen.pt"
    save_checkpoint(inference_checkpoint(
        one_layer_model(tokenizers.src.vocab_size), tokenizers, training_config=run_config,
        decoding=DecodingSettings(alpha=2.5, beam_size=3), valid_bleu=12.0), chosen)
    src, ref = tmp_path / "src.txt", tmp_path / "ref.txt"
    src.write_text("\n".join(pairs[0][:4]) + "\n", encoding="utf-8")
    ref.write_text("\n".join(pairs[1][:4]) + "\n", encoding="utf-8")
    pruned = tmp_path / "pruned.pt"
    assert prune_heads_command.main(["--checkpoint", str(chosen), "--fraction", "0.3",
                                    "--output", str(pruned), "--src", str(src), "--ref",
                                    str(ref), "--device", "cpu"]) == 0
    translator = Translator.load(pruned, device="cpu")
    assert translator.model_config.pruned_heads
    assert translator.decoding == DecodingSettings(alpha=2.5, beam_size=3)
    assert translator.training_config == run_config
    lines = pairs[0][:6]
    stored = scored(translator.translations(lines))
    assert stored == scored(translator.translations(lines, alpha=2.5, beam_size=3))
    assert stored != scored(translator.translations(lines, alpha=1.0, beam_size=3))


def test_validation_logs_attention_without_side_effects(tmp_path, multi30k_dir,
                                                        multi30k_small_tokenizer_path,
                                                        monkeypatch):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    from transformer.training import validation

    cfg = compose_config([
        "model=tiny", f"data.root={multi30k_dir}",
        f"data.spm_model={multi30k_small_tokenizer_path}",
        "data.vocab_size=400",
        "data.max_train_pairs=50", "data.max_tokens=512", "model.num_hiddens=32",
        "model.ffn_num_hiddens=64", "model.num_heads=2", "model.num_encoder_layers=1",
        "model.num_decoder_layers=1", "trainer.bleu_max_sentences=4", "trainer.device=cpu"])
    trainer = Trainer(cfg, tmp_path, DistEnv())
    try:
        rng = torch.get_rng_state()
        report = trainer.validate()  # writes nothing
        assert report.figure is not None and len(report.samples) == 4
        assert torch.equal(torch.get_rng_state(), rng) and trainer.model.training
        trainer.validate_and_save()
        assert torch.equal(torch.get_rng_state(), rng) and trainer.model.training
        for layer in attention_maps.attention_layers(trainer.model):
            assert not layer.module.is_recording

        def fail(*args, **kwargs):
            raise RuntimeError("validation failed")

        monkeypatch.setattr(validation, "search_corpus", fail)
        with pytest.raises(RuntimeError, match="validation failed"):
            trainer.validate()
        assert trainer.model.training  # restored although validation raised
    finally:
        trainer.close()
    events = EventAccumulator(str(tmp_path))
    events.Reload()
    assert events.Tags()["images"] == ["valid/encoder_decoder_attention"]
