"""The Hugging Face bridge: import a `MarianMTModel` directory (an OPUS-MT model, as
`save_pretrained` writes it) as our checkpoint, and export our models so that
`transformers` loads them (`AutoModelForSeq2SeqLM`, `AutoTokenizer`, `pipeline`).

    import_hf("opus-mt-en-de/")                 -> an inference checkpoint (a dict)
    export_hf(Translator.load("runs/x"), "hf/")  -> config.json, model.safetensors, ...,
                                                   README.md (the model card)

The two models compute the same function; what differs is bookkeeping:

    ours                                    Hugging Face (Marian; Pegasus for pre-norm)
    encoder.embedding (= decoder's)         model.shared (= embed_tokens, = lm_head if tied)
    output_projection.bias                  final_logits_bias (1, V)
    blks.i.attention(1).W_q/W_k/W_v/W_o     layers.i.self_attn.q_proj/k_proj/v_proj/out_proj
    decoder.blks.i.attention2               layers.i.encoder_attn
    addnorm1/2(/3).ln                       self_attn_layer_norm, (encoder_attn_layer_norm,)
                                            final_layer_norm
    ffn.dense1, dense2                      fc1, fc2
    encoder/decoder.final_ln (pre-norm)     encoder/decoder.layer_norm (Pegasus)
    sinusoid: sin and cos interleaved       sines in the first half, cosines in the second

The positions differ only in layout: the same frequencies, feature 2i (sin) and 2i + 1 (cos)
ours, features i and d/2 + i theirs. Rather than a second layout in our model, the bridge
permutes the model dimension of every weight that reads or writes the residual stream
(`MODEL_AXIS`): embeddings' columns, layer norms, the input columns of W_q/W_k/W_v/dense1,
the output rows and biases of W_o/dense2. Layer norm commutes with a permutation and heads are
split after the projections, so the function is unchanged; a round trip gives back the same
tensors bit for bit.

Special ids come from the model's config (OPUS-MT: `</s>` 0, `<unk>` 1, `<pad>` = V - 1, and
the decoder starts from `<pad>`); the tokenizer maps SentencePiece's pieces through
`vocab.json` (`tokenizer.Tokenizer`'s id table), as MarianTokenizer does (a leading `>>xx<<`
language token included); one difference: `<unk>` decodes as SentencePiece's " ⁇ ", where
MarianTokenizer drops it. Files are read with `safetensors` or
`torch.load(weights_only=True)`: nothing is unpickled otherwise. Every tensor of an imported
state is read, or known to repeat one that is (`from_hf_state`); any other is an error, as
it would be a weight the imported model silently lacks. Writing safetensors needs the
`safetensors` package (the `hf` extra brings it with `transformers`). A multilingual model
(one reading a target-language tag, `<2de>`, in front of each source) is not exported:
MarianTokenizer would not add the tag.

The export's README.md is a Hugging Face model card, written by `model_card.model_card`.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any, Union

import sentencepiece as spm
import torch
from torch import Tensor

from ..data.tokenizer import SpecialIds, Tokenizer, TokenizerPair
from ..decoding.translator import Translator
from ..errors import CheckpointError, ExportError, require
from ..files import atomic_directory, atomic_write
from ..model.pruning import unpruned_weights
from ..model.transformer import ModelConfig, Transformer
from ..run.checkpoint import inference_checkpoint
from ..run.config import DecodingSettings
from .model_card import DEFAULT_LICENSE, check_license, model_card

__all__ = ["ACTIVATION_FROM_HF", "NORM_FIRST_BY_MODEL_TYPE", "MODEL_AXIS", "permutation",
           "hf_model_config", "hf_config", "generation_config", "to_hf_state", "from_hf_state",
           "read_hf_tokenizers", "import_hf", "export_hf"]

log = logging.getLogger(__name__)

PathLike = Union[str, "os.PathLike[str]"]
# config.json's activation_function -> our `model.activation` (SiLU is swish)
ACTIVATION_FROM_HF = {"relu": "relu", "gelu": "gelu", "swish": "swish", "silu": "swish"}
# config.json's model_type -> our `model.norm_first` (Pegasus is Marian's pre-norm twin)
NORM_FIRST_BY_MODEL_TYPE = {"marian": False, "pegasus": True}
ARCHITECTURES = {"marian": "MarianMTModel", "pegasus": "PegasusForConditionalGeneration"}


# ---- names and the permutation ------------------------------------------------------------

# Which axis of a weight is the model dimension, by our parameter name's ending: 1 = the
# columns a layer reads the residual stream through, 0 = the rows (and bias) it writes.
MODEL_AXIS = {"embedding.weight": 1, "output_projection.weight": 1,
              "W_q.weight": 1, "W_k.weight": 1, "W_v.weight": 1, "dense1.weight": 1,
              "W_o.weight": 0, "W_o.bias": 0, "dense2.weight": 0, "dense2.bias": 0,
              "ln.weight": 0, "ln.bias": 0, "final_ln.weight": 0, "final_ln.bias": 0}


def permutation(num_hiddens: int) -> Tensor:
    """Hugging Face's feature j is our feature `permutation(d)[j]`: [0, 2, ..., 1, 3, ...]."""
    return torch.cat([torch.arange(0, num_hiddens, 2), torch.arange(1, num_hiddens, 2)])


def _permuted(name: str, tensor: Tensor, index: Tensor) -> Tensor:
    axis = next((a for end, a in MODEL_AXIS.items() if name.endswith(end)), None)
    return tensor if axis is None else tensor.index_select(axis, index)


_ATTENTION = {"W_q": "q_proj", "W_k": "k_proj", "W_v": "v_proj", "W_o": "out_proj"}
_SUBLAYERS = {  # ours -> Hugging Face's, within one block
    "encoder": {"attention": "self_attn", "addnorm1.ln": "self_attn_layer_norm",
                "ffn.dense1": "fc1", "ffn.dense2": "fc2", "addnorm2.ln": "final_layer_norm"},
    "decoder": {"attention1": "self_attn", "addnorm1.ln": "self_attn_layer_norm",
                "attention2": "encoder_attn", "addnorm2.ln": "encoder_attn_layer_norm",
                "ffn.dense1": "fc1", "ffn.dense2": "fc2", "addnorm3.ln": "final_layer_norm"},
}


def _hf_name(name: str) -> str | None:
    """Hugging Face's name of our parameter `name` (None: stored under another name once,
    the tied embeddings)."""
    if name in ("decoder.embedding.weight", "output_projection.weight"):
        return None  # = model.shared.weight (joint vocabulary, tied output)
    if name == "encoder.embedding.weight":
        return "model.shared.weight"
    if name == "output_projection.bias":
        return "final_logits_bias"
    stack, rest = name.split(".", 1)
    if rest.startswith("final_ln."):
        return f"model.{stack}.layer_norm.{rest.split('.')[-1]}"
    _, layer, inner = rest.split(".", 2)  # blks.<i>.<sublayer...>.<weight|bias>
    for ours, theirs in _SUBLAYERS[stack].items():
        if inner.startswith(ours + "."):
            tail = inner[len(ours) + 1:]
            if "." in tail:  # an attention's W_q.weight
                projection, kind = tail.split(".")
                tail = f"{_ATTENTION[projection]}.{kind}"
            return f"model.{stack}.layers.{layer}.{theirs}.{tail}"
    raise KeyError(f"no Hugging Face name for {name}")


def _check_exportable(config: ModelConfig) -> None:
    if not config.share_embeddings:
        raise ExportError("--format hf needs a joint vocabulary (model.share_embeddings=true); "
                          "this model has separate source and target vocabularies")


def to_hf_state(model: Transformer) -> dict[str, Tensor]:
    """Our weights under Hugging Face's names, the model dimension permuted; pruned heads
    come back as zeros (one head count per stack there). Tied matrices appear once."""
    c = model.config
    _check_exportable(c)
    full = _unpruned_state(model)
    index = permutation(c.num_hiddens)
    state = {}
    for name, tensor in full.items():
        hf = _hf_name(name)
        if hf is None:
            if name == "output_projection.weight" and not c.tie_output:
                state["lm_head.weight"] = _permuted(name, tensor, index).contiguous()
            continue
        value = _permuted(name, tensor, index)
        state[hf] = (value[None] if hf == "final_logits_bias" else value).contiguous()
    if "final_logits_bias" not in state:
        state["final_logits_bias"] = torch.zeros(1, c.tgt_vocab_size)
    if not c.tie_output:  # then transformers ties the stacks' embeddings to `shared` no more
        for stack in ("encoder", "decoder"):
            state[f"model.{stack}.embed_tokens.weight"] = state["model.shared.weight"].clone()
    return state


def _unpruned_state(model: Transformer) -> dict[str, Tensor]:
    """The state dict with pruned heads restored as zeros
    (`pruning.unpruned_weights`)."""
    state = {k: v.detach() for k, v in model.state_dict().items()}
    for name in model.config.pruned_heads:
        for key, value in unpruned_weights(model.get_submodule(name)).items():
            state[f"{name}.{key}"] = value
    return state


# Tensors a Hugging Face state may hold besides those the import reads, because they say
# nothing new. Copies of the one embedding table (`model.shared.weight`, which Marian ties to
# both stacks and, with tie_word_embeddings, to the output: `save_pretrained` may keep every
# copy) are checked to be copies. The position tables are the fixed sinusoid (config.json's
# static_position_embeddings is checked), which `model.PositionalEncoding` computes.
SHARED_EMBEDDING = "model.shared.weight"
EMBEDDING_COPIES = ("model.shared.weight", "model.encoder.embed_tokens.weight",
                    "model.decoder.embed_tokens.weight", "lm_head.weight")  # searched in order
POSITION_TABLES = ("model.encoder.embed_positions.weight",
                   "model.decoder.embed_positions.weight")


def from_hf_state(hf_state: dict[str, Tensor], model: Transformer,
                  path: PathLike = "model") -> dict[str, Tensor]:
    """The state dict for `model` (its names and shapes) from Hugging Face's tensors (the
    inverse of `to_hf_state`). CheckpointError naming the first missing tensor, or the
    tensors left unread (other than `EMBEDDING_COPIES` and `POSITION_TABLES`): a model with
    weights ours does not have would be imported as another function."""
    config = model.config
    inverse = torch.argsort(permutation(config.num_hiddens))
    shared_key = next((k for k in EMBEDDING_COPIES if k in hf_state), SHARED_EMBEDDING)
    state, read = {}, set()
    for name, ours in model.state_dict().items():
        hf = _hf_name(name)
        if name == "output_projection.weight" and not config.tie_output:
            hf = "lm_head.weight"
        if hf is None or hf == SHARED_EMBEDDING:
            hf = shared_key
        if hf not in hf_state:
            raise CheckpointError(f"{path} has no tensor {hf} (for our {name})")
        read.add(hf)
        value = hf_state[hf].reshape(-1) if hf == "final_logits_bias" else hf_state[hf]
        value = _permuted(name, value.to(torch.float32), inverse)
        if value.shape != ours.shape:
            raise CheckpointError(f"{path}: {hf} has shape {tuple(value.shape)}, the config "
                                  f"asks for {tuple(ours.shape)}")
        state[name] = value.contiguous()
    _check_all_read(hf_state, read, shared_key, path)
    return state


def _check_all_read(hf_state: dict[str, Tensor], read: set[str], shared_key: str,
                    path: PathLike) -> None:
    """CheckpointError unless every tensor of `hf_state` was `read`, is a position table, or
    is an unread copy of the embedding table `shared_key` equal to it."""
    for key in EMBEDDING_COPIES:
        if key in hf_state and key not in read and not torch.equal(hf_state[key],
                                                                    hf_state[shared_key]):
            raise CheckpointError(f"{path}: {key} differs from {shared_key}; the import needs "
                                  f"one embedding table for both stacks (and a tied output)")
    unread = [key for key in hf_state
              if key not in read and key not in EMBEDDING_COPIES and key not in POSITION_TABLES]
    if unread:
        shown = ", ".join(unread[:3]) + (", ..." if len(unread) > 3 else "")
        raise CheckpointError(f"{path} has {len(unread)} tensor(s) our model has no place for "
                              f"({shown}): it is not the model its config.json describes")


# ---- configs ------------------------------------------------------------------------------

def hf_model_config(cfg: dict[str, Any], path: PathLike = "config.json") -> ModelConfig:
    """Our `ModelConfig` of a Marian (or Pegasus) config.json; CheckpointError naming the
    key of anything our model cannot compute exactly."""
    def fail(key: str, why: str) -> None:
        raise CheckpointError(f"{path}: {key}={cfg.get(key)!r} is not supported: {why}")

    model_type = cfg.get("model_type")
    if not isinstance(model_type, str) or model_type not in NORM_FIRST_BY_MODEL_TYPE:
        fail("model_type", f"the bridge reads {' and '.join(NORM_FIRST_BY_MODEL_TYPE)} models")
    activation = cfg.get("activation_function")
    if not isinstance(activation, str) or activation not in ACTIVATION_FROM_HF:
        fail("activation_function", f"the FFN computes {', '.join(ACTIVATION_FROM_HF)}")
    if cfg.get("scale_embedding") is not True:
        fail("scale_embedding", "our embeddings are always scaled by sqrt(d_model)")
    for key in ("normalize_embedding", "layernorm_embedding", "add_bias_logits"):
        if cfg.get(key):
            fail(key, "our model has no such layer")
    if model_type == "marian" and cfg.get("normalize_before"):
        fail("normalize_before", "a pre-norm Marian model has no exact equivalent here")
    if cfg.get("static_position_embeddings") is False:
        fail("static_position_embeddings", "our positions are sinusoidal")
    if cfg.get("share_encoder_decoder_embeddings", True) is not True:
        fail("share_encoder_decoder_embeddings", "import needs one id table for both sides")
    for ours, theirs in (("encoder_attention_heads", "decoder_attention_heads"),
                         ("encoder_ffn_dim", "decoder_ffn_dim")):
        if cfg.get(ours) != cfg.get(theirs):
            fail(theirs, f"it must equal {ours} ({cfg.get(ours)!r})")
    if cfg.get("pruned_heads"):
        fail("pruned_heads", "import an unpruned model, then prune with transformer "
                             "prune-heads")
    for key in ("activation_dropout", "encoder_layerdrop", "decoder_layerdrop"):
        if cfg.get(key):
            log.warning("%s: %s=%s is a training setting our model does not have; "
                        "fine-tuning will not use it", path, key, cfg[key])
    try:
        return ModelConfig(
            num_hiddens=cfg["d_model"], ffn_num_hiddens=cfg["encoder_ffn_dim"],
            num_heads=cfg["encoder_attention_heads"],
            num_encoder_layers=cfg["encoder_layers"], num_decoder_layers=cfg["decoder_layers"],
            dropout=float(cfg.get("dropout", 0.1)),
            attention_dropout=float(cfg.get("attention_dropout", 0.0)),
            norm_first=NORM_FIRST_BY_MODEL_TYPE[model_type],
            tie_output=cfg.get("tie_word_embeddings", True),
            max_positions=cfg["max_position_embeddings"],
            activation=ACTIVATION_FROM_HF[activation], output_bias=True,
            src_vocab_size=cfg["vocab_size"], tgt_vocab_size=cfg["vocab_size"],
            share_embeddings=True, pad_id=cfg["pad_token_id"],
            start_id=cfg.get("decoder_start_token_id", cfg["pad_token_id"]),
            eos_id=cfg["eos_token_id"])
    except KeyError as e:
        raise CheckpointError(f"{path} has no {e.args[0]!r}") from None
    except (ValueError, TypeError) as e:  # TypeError: float(None), float([...])
        raise CheckpointError(f"{path}: {e}") from None


def hf_config(config: ModelConfig) -> dict[str, Any]:
    """config.json for `config`: MarianMTModel (post-norm) or PegasusForConditionalGeneration
    (pre-norm with final layer norms: the same sinusoid and embedding scale)."""
    _check_exportable(config)
    model_type = "pegasus" if config.norm_first else "marian"
    c = config
    out = {"architectures": [ARCHITECTURES[model_type]], "model_type": model_type,
           "vocab_size": c.tgt_vocab_size, "d_model": c.num_hiddens,
           "encoder_layers": c.num_encoder_layers, "decoder_layers": c.num_decoder_layers,
           "encoder_attention_heads": c.num_heads, "decoder_attention_heads": c.num_heads,
           "encoder_ffn_dim": c.ffn_num_hiddens, "decoder_ffn_dim": c.ffn_num_hiddens,
           "activation_function": c.activation, "dropout": c.dropout,
           "attention_dropout": c.attention_dropout, "activation_dropout": 0.0,
           "max_position_embeddings": c.max_positions, "scale_embedding": True,
           "pad_token_id": c.pad_id, "eos_token_id": c.eos_id, "forced_eos_token_id": c.eos_id,
           "decoder_start_token_id": c.start_id, "tie_word_embeddings": c.tie_output,
           "is_encoder_decoder": True, "use_cache": True}
    if model_type == "marian":
        out["share_encoder_decoder_embeddings"] = True
    return out


def generation_config(config: ModelConfig, decoding: DecodingSettings) -> dict[str, Any]:
    """generation_config.json: our beam size, room for the longest output the positions
    allow, and PAD and the start token never generated, as our search. The length limit is
    `max_length` (decoder tokens, the start token included; Hugging Face's default of 20
    cuts translations), not `max_new_tokens`: the translation pipeline of transformers 4
    replaces a model's `max_new_tokens` with its own 256, which overruns a model's positions,
    but honours its `max_length`."""
    c = config
    return {"decoder_start_token_id": c.start_id, "pad_token_id": c.pad_id,
            "eos_token_id": c.eos_id, "forced_eos_token_id": c.eos_id,
            "num_beams": decoding.beam_size, "max_length": c.max_positions,
            "suppress_tokens": sorted({c.pad_id, c.start_id})}


# ---- tokenizers ---------------------------------------------------------------------------

def read_hf_tokenizers(directory: Path, config: ModelConfig) -> TokenizerPair:
    """MarianTokenizer's files -> our tokenizers: source.spm / target.spm, their pieces
    mapped to ids through vocab.json, the special ids of the model's config."""
    for name in ("source.spm", "target.spm", "vocab.json"):
        if not (directory / name).is_file():
            raise CheckpointError(f"{directory} has no {name} (MarianTokenizer's files: "
                                  f"source.spm, target.spm, vocab.json)")
    if (directory / "target_vocab.json").is_file():
        raise CheckpointError(f"{directory / 'target_vocab.json'}: separate source and target "
                              f"id tables are not supported")
    path = directory / "vocab.json"
    try:
        vocab = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"unreadable {path}: {e}") from None
    ids_are_ints = isinstance(vocab, dict) and all(
        isinstance(i, int) and not isinstance(i, bool) for i in vocab.values())
    pieces = sorted(vocab, key=vocab.__getitem__) if ids_are_ints else []
    if [vocab[p] for p in pieces] != list(range(config.tgt_vocab_size)):
        raise CheckpointError(f"{path} must map {config.tgt_vocab_size} pieces (config.json's "
                              f"vocab_size) to the ids 0..{config.tgt_vocab_size - 1}")
    unk = _unk_token(directory)
    if unk not in vocab:
        raise CheckpointError(f"{path} has no unknown-piece token {unk!r}")
    specials = SpecialIds(pad=config.pad_id, unk=vocab[unk], start=config.start_id,
                          eos=config.eos_id)
    tokenizers = []
    for name in ("source.spm", "target.spm"):
        try:
            processor = spm.SentencePieceProcessor(model_file=str(directory / name))
        except (OSError, RuntimeError) as e:
            raise CheckpointError(f"unreadable SentencePiece model {directory / name}: "
                                  f"{str(e).splitlines()[0]}") from None
        tokenizers.append(Tokenizer(processor, pieces, specials))
    src, tgt = tokenizers
    return TokenizerPair(src, src if src == tgt else tgt)


def _unk_token(directory: Path) -> str:
    path = directory / "tokenizer_config.json"
    if not path.is_file():
        return "<unk>"
    try:
        token = json.loads(path.read_text(encoding="utf-8")).get("unk_token", "<unk>")
    except (OSError, ValueError) as e:
        raise CheckpointError(f"unreadable {path}: {e}") from None
    return token.get("content", "<unk>") if isinstance(token, dict) else str(token)


# ---- import -------------------------------------------------------------------------------

def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise CheckpointError(f"{path.parent} has no {path.name} (a directory as "
                              f"save_pretrained writes it)")
    try:
        value = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise CheckpointError(f"unreadable {path}: {e}") from None
    if not isinstance(value, dict):
        raise CheckpointError(f"{path} is not a JSON object")
    return value


def _read_weights(directory: Path) -> dict[str, Tensor]:
    """model.safetensors, else pytorch_model.bin (weights_only): {name: tensor}."""
    path = directory / "model.safetensors"
    if path.is_file():
        safetensors = require("safetensors.torch", extra="hf", feature=f"reading {path}")
        try:
            return safetensors.load_file(str(path))
        except Exception as e:  # any: SafetensorError (not a subclass of ours), or what the
            # header's JSON and torch raise for damaged bytes
            raise CheckpointError(f"corrupt or truncated {path}: {e}") from None
    path = directory / "pytorch_model.bin"
    if not path.is_file():
        raise CheckpointError(f"{directory} has no model.safetensors or pytorch_model.bin "
                              f"(sharded checkpoints are not supported)")
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # any: damaged bytes fail in torch's zip or pickle layers alike,
        # and weights_only's refusals are UnpicklingErrors
        raise CheckpointError(f"cannot read {path} safely (weights only): "
                              f"{str(e).splitlines()[0]}") from None
    if not isinstance(state, dict):
        raise CheckpointError(f"{path} does not hold a state dict")
    return state


def import_hf(directory: PathLike) -> dict[str, Any]:
    """A Hugging Face Marian (or Pegasus, with MarianTokenizer's files) directory -> our
    inference checkpoint: the model, its tokenizers, decoding defaults with the directory's
    beam size, and `imported_from`."""
    directory = Path(directory)
    if not directory.is_dir():
        raise CheckpointError(f"{directory} is not a directory")
    config = hf_model_config(_read_json(directory / "config.json"), directory / "config.json")
    tokenizers = read_hf_tokenizers(directory, config)
    model = Transformer(config)
    model.load_state_dict(from_hf_state(_read_weights(directory), model, directory))
    decoding = DecodingSettings()
    generation = directory / "generation_config.json"
    beams = _read_json(generation).get("num_beams") if generation.is_file() else None
    if isinstance(beams, int) and beams >= 1:
        decoding = replace(decoding, beam_size=beams)
    return inference_checkpoint(model, tokenizers, training_config=None, decoding=decoding,
                                imported_from=str(directory.resolve()))


# ---- export -------------------------------------------------------------------------------

def export_hf(translator: Translator, output: PathLike, *, source: str = "",
              license: str = DEFAULT_LICENSE,
              facts: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Write `translator`'s model as a Hugging Face directory `output` that
    `AutoModelForSeq2SeqLM`, `AutoTokenizer` and `pipeline("translation")` load offline:
    config.json, generation_config.json, model.safetensors, MarianTokenizer's files
    (source.spm, target.spm, vocab.json, tokenizer_config.json) and README.md, the model
    card (`model_card.model_card`: `license`, a Hub license id; `facts`, what the
    checkpoint records beyond the model, `model_card.checkpoint_facts`). The directory
    appears complete or not at all (built beside `output`, then renamed; an existing one is
    replaced only if it holds a config.json). A multilingual model, or one loaded in int8
    (`quantize`), is refused with an `ExportError` naming `source` (its checkpoint), and a
    malformed license with a `ConfigError`, before anything is written. Returns
    config.json's contents."""
    check_license(license)
    translator.check_bilingual(
        source, "exporting it to Hugging Face",
        "MarianTokenizer and generate() do not put the target-language tag every source of "
        "this model needs in front of it; translate it with transformer translate "
        "--target-lang")
    translator.check_float(source, "exporting it to Hugging Face")
    safetensors = require("safetensors.torch", extra="hf", feature="export --format hf")
    model, tokenizers = translator.model, translator.tokenizers
    config = hf_config(model.config)
    state = to_hf_state(model)
    output = Path(output)
    if output.exists() and (not output.is_dir() or (any(output.iterdir())
                                                    and not (output / "config.json").is_file())):
        raise ExportError(f"{output} exists and is not a Hugging Face model directory: "
                          f"choose another --output")
    with atomic_directory(output) as build:
        safetensors.save_file({k: v.to(torch.float32).contiguous() for k, v in state.items()},
                              str(build / "model.safetensors"), metadata={"format": "pt"})
        _write_json(build / "config.json", config)
        _write_json(build / "generation_config.json",
                    generation_config(model.config, translator.decoding))
        _write_tokenizer(build, tokenizers, model.config)
        with atomic_write(build / "README.md", text=True) as f:
            f.write(model_card(translator, config, license=license, facts=facts,
                               source=source))
    return config


def _write_json(path: Path, value: Any) -> None:
    with atomic_write(path, text=True) as f:
        json.dump(value, f, indent=2, ensure_ascii=False)
        f.write("\n")


def _write_tokenizer(directory: Path, tokenizers: TokenizerPair, config: ModelConfig) -> None:
    """MarianTokenizer's files: each side's SentencePiece model, one vocab.json (our ids are
    one table for both sides: a joint vocabulary), and the special tokens."""
    with atomic_write(directory / "source.spm") as f:
        f.write(tokenizers.src.to_bytes())
    with atomic_write(directory / "target.spm") as f:
        f.write(tokenizers.tgt.to_bytes())
    pieces = tokenizers.tgt.vocabulary()
    _write_json(directory / "vocab.json", {piece: i for i, piece in enumerate(pieces)})
    ids = tokenizers.tgt.specials
    _write_json(directory / "tokenizer_config.json", {
        "tokenizer_class": "MarianTokenizer", "model_max_length": config.max_positions,
        "unk_token": pieces[ids.unk], "eos_token": pieces[ids.eos], "pad_token": pieces[ids.pad],
        "separate_vocabs": False, "source_lang": None, "target_lang": None})

