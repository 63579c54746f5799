"""The Transformer: causality, padding invariance, cached decoding, learning a task."""

import random

import pytest
import torch
from conftest import copy_sentence
from torch import nn

from transformer.model.blocks import AddNorm, DecoderBlock, EncoderBlock, PositionWiseFFN
from transformer.model.transformer import ModelConfig, PositionalEncoding, Transformer, eval_mode
from transformer.run.checkpoint import load_checkpoint, model_from_checkpoint, tokenizers_from_state

PAD, BOS, EOS = 0, 2, 3


def small_config(**overrides) -> ModelConfig:
    kw = dict(src_vocab_size=30, tgt_vocab_size=30, num_hiddens=32, ffn_num_hiddens=64,
              num_heads=4, num_encoder_layers=2, num_decoder_layers=2, dropout=0.1)
    kw.update(overrides)
    return ModelConfig(**kw)


def random_batch(B=3, S=7, T=6, vocab=30, seed=0):
    g = torch.Generator().manual_seed(seed)
    src = torch.randint(4, vocab, (B, S), generator=g)
    tgt = torch.randint(4, vocab, (B, T), generator=g)
    src_lens = torch.tensor([S] + [max(1, S - 2 - i) for i in range(B - 1)])
    src = src.masked_fill(torch.arange(S)[None] >= src_lens[:, None], PAD)
    return src, src_lens, tgt


@pytest.fixture(params=[False, True], ids=["post-norm", "pre-norm"])
def model(request):
    torch.manual_seed(0)
    return Transformer(small_config(norm_first=request.param)).eval()


def test_blocks_shapes_like_the_book():
    X = torch.ones(2, 100, 24)
    assert PositionWiseFFN(24, 48)(X).shape == (2, 100, 24)
    add_norm = AddNorm(24, 0.5).eval()
    torch.testing.assert_close(add_norm(X, X), nn.functional.layer_norm(2 * X, (24,)))
    enc = EncoderBlock(24, 48, 8, 0.5).eval()
    Y = enc(X, torch.tensor([3, 2]))
    assert Y.shape == (2, 100, 24)
    dec = DecoderBlock(24, 48, 8, 0.5).eval()
    assert dec(X, Y, torch.tensor([3, 2])).shape == (2, 100, 24)


def test_positional_encoding_formula():
    pe = PositionalEncoding(16, 0.0, max_len=50)
    P = pe(torch.zeros(1, 50, 16))[0]
    i, j = 7, 3  # P[i, 2j] = sin(i / 10000^(2j/d)), P[i, 2j+1] = cos(...)
    angle = torch.tensor(i / 10000 ** (2 * j / 16))
    torch.testing.assert_close(P[i, 2 * j], torch.sin(angle))
    torch.testing.assert_close(P[i, 2 * j + 1], torch.cos(angle))
    torch.testing.assert_close(pe(torch.zeros(1, 2, 16), offset=7)[0, 0], P[7])
    with pytest.raises(ValueError, match="max_positions=50"):
        pe(torch.zeros(1, 51, 16))


def test_forward_shapes_and_output_mask(model):
    src, src_lens, tgt = random_batch()
    logits = model(src, src_lens, tgt)
    assert logits.shape == (3, 6, 30)
    keep = torch.rand(3, 6) > 0.5
    torch.testing.assert_close(model(src, src_lens, tgt, output_mask=keep), logits[keep])


def test_causality(model):
    """Changing target tokens after position t leaves outputs at <= t unchanged."""
    src, src_lens, tgt = random_batch()
    base = model(src, src_lens, tgt)
    for t in range(tgt.shape[1] - 1):
        changed = tgt.clone()
        changed[:, t + 1:] = torch.randint(4, 30, changed[:, t + 1:].shape)
        out = model(src, src_lens, changed)
        torch.testing.assert_close(out[:, :t + 1], base[:, :t + 1], atol=1e-5, rtol=1e-5)
        assert not torch.allclose(out[:, t + 1:], base[:, t + 1:])


def test_padding_invariance(model):
    """Appending padding to a sentence changes neither its encoder nor decoder outputs."""
    src, src_lens, tgt = random_batch(B=1, S=5, T=4)
    src_padded = torch.cat([src, torch.full((1, 6), PAD)], 1)
    tgt_padded = torch.cat([tgt, torch.full((1, 3), PAD)], 1)
    enc = model.encode(src, src_lens)
    enc_padded = model.encode(src_padded, src_lens)
    torch.testing.assert_close(enc_padded[:, :5], enc, atol=1e-5, rtol=1e-5)
    out = model(src, src_lens, tgt)
    out_padded = model(src_padded, src_lens, tgt_padded)
    torch.testing.assert_close(out_padded[:, :4], out, atol=1e-5, rtol=1e-5)
    # The same sentence batched with a longer one gives the same outputs.
    other = torch.randint(4, 30, (1, 11))
    batch_src = torch.cat([src_padded, other])
    batch_tgt = torch.cat([tgt_padded, torch.randint(4, 30, (1, 7))])
    out_batched = model(batch_src, torch.tensor([5, 11]), batch_tgt)
    torch.testing.assert_close(out_batched[:1, :4], out, atol=1e-5, rtol=1e-5)


def test_cached_decoding_equals_full_forward(model):
    src, src_lens, tgt = random_batch(B=4, S=9, T=8)
    full = model(src, src_lens, tgt)
    enc = model.encode(src, src_lens)
    cache = model.new_cache()
    steps = [model.decode_step(tgt[:, t:t + 1], enc, src_lens, cache) for t in range(8)]
    assert (torch.cat(steps, 1) - full).abs().max() <= 1e-5
    assert cache[0].self_attention.length == 8 and cache[0].cross_attention.length == 9
    # Reordering the cache (as beam search does) reorders the following step's outputs.
    index = torch.tensor([2, 0, 3, 1])
    for layer in cache:
        layer.reorder(index)
    nxt = torch.randint(4, 30, (4, 1))
    ref_cache = model.new_cache()
    ref_src, ref_lens = src[index], src_lens[index]
    ref_enc = model.encode(ref_src, ref_lens)
    model.decode_step(tgt[index], ref_enc, ref_lens, ref_cache)
    torch.testing.assert_close(model.decode_step(nxt, enc[index], src_lens[index], cache),
                               model.decode_step(nxt, ref_enc, ref_lens, ref_cache),
                               atol=1e-5, rtol=1e-5)


def test_shared_embeddings_and_parameter_count():
    shared = Transformer(small_config())
    assert shared.encoder.embedding.weight is shared.decoder.embedding.weight
    assert shared.output_projection.weight is shared.decoder.embedding.weight
    separate = Transformer(small_config(share_embeddings=False, tie_output=False))
    assert separate.num_parameters() == shared.num_parameters() + 2 * 30 * 32
    assert shared.num_parameters() == sum(
        p.numel() for p in {id(p): p for p in shared.state_dict().values()}.values()
        if p.dtype.is_floating_point) - 2 * 30 * 32  # state dict repeats the tied matrix


def test_rebuild_from_config_dict():
    torch.manual_seed(0)
    model = Transformer(small_config()).eval()
    clone = Transformer(ModelConfig.from_dict(model.config.to_dict())).eval()
    clone.load_state_dict(model.state_dict())
    src, src_lens, tgt = random_batch()
    torch.testing.assert_close(clone(src, src_lens, tgt), model(src, src_lens, tgt))
    with pytest.raises(ValueError, match="unknown model config keys.*colour"):
        ModelConfig.from_dict({**model.config.to_dict(), "colour": "red"})


@pytest.mark.parametrize("overrides, key", [
    ({"num_heads": 5}, "model.num_heads"),
    ({"num_hiddens": -8}, "model.num_hiddens"),
    ({"dropout": 1.5}, "model.dropout"),
    ({"tgt_vocab_size": 40}, "model.share_embeddings"),
    ({"num_encoder_layers": 0}, "model.num_encoder_layers"),
])
def test_bad_config_names_the_key(overrides, key):
    with pytest.raises(ValueError, match=key):
        small_config(**overrides)


def greedy_decode(model, src, src_lens, max_len):
    enc = model.encode(src, src_lens)
    cache = model.new_cache()
    tokens = torch.full((src.shape[0], 1), BOS)
    out = []
    for _ in range(max_len):
        tokens = model.decode_step(tokens, enc, src_lens, cache)[:, -1].argmax(-1, keepdim=True)
        out.append(tokens)
    return torch.cat(out, 1)


def test_learns_copy_task(copy_checkpoint):
    """A small model trained from scratch (conftest's `copy_checkpoint`: Adam, cross-entropy)
    copies 200 fresh sentences with >= 95% token accuracy, decoded here step by step with
    the model's own `decode_step` (no search code)."""
    state = load_checkpoint(copy_checkpoint)
    model, tokenizer = model_from_checkpoint(state), tokenizers_from_state(state).src
    rng = random.Random(123)
    pieces = [tokenizer.encode(copy_sentence(rng)) + [EOS] for _ in range(200)]
    longest = max(map(len, pieces))
    src = torch.tensor([p + [PAD] * (longest - len(p)) for p in pieces])
    src_lens = torch.tensor([len(p) for p in pieces])
    with torch.no_grad():
        pred = greedy_decode(model.eval(), src, src_lens, longest)
    real = src != PAD  # every real target token, EOS included
    accuracy = (pred == src)[real].float().mean().item()
    assert accuracy >= 0.95, f"copy-task token accuracy {accuracy:.3f} < 0.95"


def test_bf16_autocast_forward_matches_float32(model):
    """The mixed-precision path (as on GPU) gives finite logits close to float32."""
    src, src_lens, tgt = random_batch(B=4, S=9, T=8)
    full = model(src, src_lens, tgt)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        half = model(src, src_lens, tgt)
    assert half.dtype == torch.bfloat16 and torch.isfinite(half).all()
    torch.testing.assert_close(half.float(), full, atol=0.1, rtol=0.05)


@pytest.mark.parametrize(("activation", "function"), [
    ("relu", torch.relu), ("gelu", nn.functional.gelu),
    ("swish", lambda x: x * torch.sigmoid(x))])  # swish = SiLU, OPUS-MT's
def test_ffn_activation_is_the_named_function(activation, function):
    torch.manual_seed(0)
    ffn = PositionWiseFFN(8, 16, activation)
    X = torch.randn(2, 3, 8)
    expected = ffn.dense2(function(ffn.dense1(X)))
    torch.testing.assert_close(ffn(X), expected)


def test_output_bias_is_added_to_every_logit_and_trained_by_the_fused_loss():
    from transformer.model.loss import LabelSmoothedLoss

    torch.manual_seed(0)
    config = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, num_hiddens=16,
                         ffn_num_hiddens=32, num_heads=2, num_encoder_layers=1,
                         num_decoder_layers=1, dropout=0.0, output_bias=True)
    model = Transformer(config)
    with torch.no_grad():
        model.output_projection.bias.normal_()
    src, lens = torch.randint(4, 20, (3, 5)), torch.tensor([5, 4, 2])
    tgt_in, tgt_out = torch.randint(4, 20, (3, 6)), torch.randint(4, 20, (3, 6))
    hidden = model.hidden_states(src, lens, tgt_in)
    expected = hidden @ model.output_projection.weight.t() + model.output_projection.bias
    torch.testing.assert_close(model(src, lens, tgt_in), expected)
    loss = LabelSmoothedLoss(model, 0.1)(src, lens, tgt_in, tgt_out)
    reference = nn.CrossEntropyLoss(reduction="sum", label_smoothing=0.1)(
        expected.flatten(0, 1), tgt_out.flatten())
    torch.testing.assert_close(loss, reference)
    loss.backward()
    assert model.output_projection.bias.grad.abs().sum() > 0


def test_losses_and_log_probs_over_chunks_of_rows_equal_those_of_the_whole_logits(tuning):
    """Validation's loss, head importance's differentiable nll and forced decoding's
    sentence log-probabilities project a chunk of target rows at a time (here 4 of a
    batch's 17 real tokens): each equals `nn.CrossEntropyLoss` or the log-softmax over the
    batch's whole logits, an ensemble's the normalized mean of its members'."""
    from transformer.data.store import Batch
    from transformer.model.ensemble import Ensemble
    from transformer.model.loss import evaluate_loss, sentence_log_probs, teacher_forced_loss

    tuning(loss_min_chunk_rows=4, loss_chunk_logits_cpu=1)
    torch.manual_seed(0)
    config = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, num_hiddens=16,
                         ffn_num_hiddens=32, num_heads=2, num_encoder_layers=1,
                         num_decoder_layers=1, dropout=0.0)
    model, other = Transformer(config).eval(), Transformer(config).eval()
    src, lens = torch.randint(4, 20, (3, 5)), torch.tensor([5, 4, 2])
    tgt_lens = torch.tensor([7, 4, 6])  # 17 real tokens, padding after
    tgt_out = torch.randint(4, 20, (3, 7)).masked_fill(torch.arange(7) >= tgt_lens[:, None], 0)
    tgt_in = torch.cat([torch.full((3, 1), config.start_id), tgt_out[:, :-1]], 1)
    real = tgt_out != 0
    batch = Batch(src, lens, tgt_in, tgt_out, tgt_lens, real.flatten().nonzero().squeeze(1),
                  17, [0, 1, 2])

    def log_probs(m):  # (3, 7, V) over the whole logits
        with torch.no_grad():
            return m(src, lens, tgt_in).log_softmax(-1)

    report = evaluate_loss(model, [batch], label_smoothing=0.1)
    logits = model(src, lens, tgt_in).detach().flatten(0, 1)
    for smoothing, got in ((0.0, report.nll), (0.1, report.loss)):
        expected = nn.CrossEntropyLoss(ignore_index=0, label_smoothing=smoothing)(
            logits, tgt_out.flatten())
        assert got == pytest.approx(float(expected), rel=1e-6)
    assert report.tokens == 17

    nll = teacher_forced_loss(model, batch).nll
    nll.backward()
    chunked = model.output_projection.weight.grad.clone()
    model.zero_grad()
    reference = nn.CrossEntropyLoss(ignore_index=0, reduction="sum")(
        model(src, lens, tgt_in).flatten(0, 1), tgt_out.flatten())
    reference.backward()
    assert nll.item() == pytest.approx(reference.item(), rel=1e-6)
    torch.testing.assert_close(chunked, model.output_projection.weight.grad)

    picked = log_probs(model).gather(2, tgt_out[..., None]).squeeze(2)  # (3, 7)
    torch.testing.assert_close(sentence_log_probs(model, batch),
                               (picked * real).sum(1).double())
    mean = torch.log_softmax((log_probs(model) + log_probs(other)) / 2, -1)
    torch.testing.assert_close(
        sentence_log_probs(Ensemble([model, other]), batch),
        (mean.gather(2, tgt_out[..., None]).squeeze(2) * real).sum(1).double())


def test_configs_without_the_newer_fields_build_the_same_model():
    """A checkpoint from before activation, output bias and special ids were options."""
    config = ModelConfig(src_vocab_size=20, tgt_vocab_size=20, num_hiddens=16)
    old = {k: v for k, v in config.to_dict().items()
           if k not in ("activation", "output_bias", "start_id", "eos_id")}
    assert ModelConfig.from_dict(old) == config
    assert ModelConfig.normalized(old) == config.to_dict()
    model = Transformer(ModelConfig.from_dict(old))
    assert "output_projection.bias" not in model.state_dict()
    assert isinstance(model.encoder.blks[0].ffn.activation, nn.ReLU)


def test_eval_mode_switches_every_module_and_restores_the_callers_mode():
    model = Transformer(ModelConfig(num_hiddens=16, ffn_num_hiddens=32, num_heads=2,
                                    num_encoder_layers=1, num_decoder_layers=1,
                                    src_vocab_size=20, tgt_vocab_size=20))
    model.train()
    with eval_mode(model):
        assert not any(module.training for module in model.modules())
    assert all(module.training for module in model.modules())
    model.eval()
    with pytest.raises(RuntimeError), eval_mode(model):  # already in eval mode: kept so
        assert not any(module.training for module in model.modules())
        raise RuntimeError
    assert not any(module.training for module in model.modules())
