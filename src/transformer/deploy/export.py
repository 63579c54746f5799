"""Export a trained model to CTranslate2 (OpenNMT's C++ inference engine) for fast CPU
translation, and read such an export back.

    export_ctranslate2(Translator.load("runs/x"), "runs/x/ct2-int8", quantization="int8")

The model goes through CTranslate2's model-spec API: a `TransformerSpec` filled from our
`ModelConfig` and weights. The mapping, layer by layer:

    ours                                    CTranslate2 spec
    embedding (x sqrt(d), shared)           embeddings.weight, scale_embeddings=True
    PositionalEncoding.P (sin even, cos odd) position_encodings.encodings (set explicitly:
                                            CTranslate2's own table puts sin | cos in halves)
    attention W_q, W_k, W_v (self)          self_attention.linear[0] (fused QKV)
    attention2 W_q | W_k, W_v (cross)       attention.linear[0] | linear[1] (fused KV)
    W_o                                     linear[-1]
    addnorm1/2/3.ln                         the sublayer's layer_norm (post-norm: after the
                                            residual; pre-norm: before, and a final norm)
    ffn.dense1, dense2 (activation)         ffn.linear_0, linear_1 (relu, gelu or swish)
    output_projection (tied), its bias      decoder.projection (the same matrix: saved once)
    the tokenizers' pieces in id order      the vocabularies; the special tokens are those of
                                            the tokenizer's ids (imported Marian models too)

A pruned model (layers with fewer heads) is exported with the removed heads as zero rows of
W_q, W_k, W_v and zero columns of W_o: CTranslate2 wants one head count per stack, and a zero
head adds nothing to W_o's output, so the translations are unchanged.

The export directory holds `model.bin` and the vocabularies (CTranslate2's), the
SentencePiece model(s), `transformer.json` (`ExportInfo`): our model config, decoding
defaults, language pair and quantization, and optionally `vmap.txt` (a vocabulary map,
`vocab_map.py`: CTranslate2 then scores only its candidate target pieces), so
`engines.CTranslate2Translator` rebuilds everything `Translator` has. `ctranslate2` is an
optional dependency (the `export` extra).

Bilingual models export, corpus tags (`<bt>`) among their pieces or not. A multilingual model
is refused before anything is written (`check_exportable`): each of its sources needs a
target-language tag in front, which CTranslate2, reading the pieces it is given, never adds.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Union

import numpy as np
import torch
from torch import Tensor, nn

from ..data.tokenizer import Tokenizer, TokenizerPair
from ..decoding.translator import Translator
from ..decoding.vocab_map import VocabMap
from ..errors import ExportError, require
from ..files import atomic_directory, atomic_write
from ..model.attention import MultiHeadAttention
from ..model.pruning import unpruned_weights
from ..model.transformer import ModelConfig, Transformer
from ..run.config import DecodingSettings, TrainConfig

__all__ = ["QUANTIZATIONS", "EXPORT_INFO", "VOCAB_MAP", "ExportInfo",
           "require_ctranslate2", "transformer_spec", "check_exportable", "export_ctranslate2",
           "read_export", "is_export"]

PathLike = Union[str, "os.PathLike[str]"]

QUANTIZATIONS = ("float32", "int8", "int8_float32")  # CPU weight types worth exporting
EXPORT_INFO = "transformer.json"  # our metadata beside CTranslate2's model.bin
VOCAB_MAP = "vmap.txt"  # the file name CTranslate2 looks for
CT2_ACTIVATION = {"relu": "RELU", "gelu": "GELU", "swish": "SWISH"}  # ModelConfig.activation


def require_ctranslate2() -> Any:
    """The `ctranslate2` module, or `MissingDependency` saying how to install it."""
    return require("ctranslate2", extra="export", feature="the ctranslate2 engine")


@dataclass
class ExportInfo:
    """`transformer.json`: what a CTranslate2 export needs besides CTranslate2's own files."""

    model_config: dict[str, Any]  # ModelConfig.to_dict() of the exported model
    decoding: dict[str, Any]  # DecodingSettings fields: the translator's defaults
    quantization: str
    tokenizer: dict[str, str]  # side ("src", "tgt") -> SentencePiece file in the directory
    source: str  # the checkpoint(s) it was exported from
    training_config: dict[str, Any] | None = None  # as the checkpoint recorded it
    format_version: int = 1
    languages: dict[str, str | None] = field(default_factory=dict)  # "src"/"tgt" -> code
    # vmap.txt's facts when the export has a vocabulary map (then CTranslate2 uses it)
    vocab_map: dict[str, Any] | None = None
    # side -> `Tokenizer.id_table()` for tokenizers whose ids come from a table (imported)
    id_tables: dict[str, dict[str, Any]] | None = None

    def model(self) -> ModelConfig:
        return ModelConfig.from_dict(self.model_config)

    def decoding_settings(self) -> DecodingSettings:
        return DecodingSettings.from_dict(self.decoding)

    def stored_training_config(self) -> TrainConfig | None:
        """The training config as the exported checkpoint recorded it, or None."""
        return None if self.training_config is None else TrainConfig.from_dict(
            self.training_config)


# ---- the spec --------------------------------------------------------------------------------

def _array(t: Tensor) -> Any:
    """A float32 numpy copy: CTranslate2's `optimize` (quantization) works in place, and
    must not change the model's own parameters."""
    return t.detach().to(torch.float32, copy=True).contiguous().numpy()


def _set_linear(spec: Any, weight: Tensor, bias: Tensor | None) -> None:
    spec.weight = _array(weight)
    if bias is not None:
        spec.bias = _array(bias)


def _set_layer_norm(spec: Any, ln: nn.LayerNorm) -> None:
    spec.gamma, spec.beta = _array(ln.weight), _array(ln.bias)


def _set_attention(spec: Any, attention: MultiHeadAttention, num_heads: int, *,
                   self_attention: bool) -> None:
    """Self-attention: linear[0] = fused QKV; cross: linear[0] = Q, linear[1] = fused KV.
    Pruned heads are zeros (`pruning.unpruned_weights`)."""
    full = unpruned_weights(attention)
    wq, wk, wv, w_o = (full[f"{name}.weight"] for name in ("W_q", "W_k", "W_v", "W_o"))
    bq, bk, bv = (full.get(f"{name}.bias", torch.zeros(len(full[f"{name}.weight"])))
                  for name in ("W_q", "W_k", "W_v"))
    if self_attention:
        _set_linear(spec.linear[0], torch.cat([wq, wk, wv]), torch.cat([bq, bk, bv]))
    else:
        _set_linear(spec.linear[0], wq, bq)
        _set_linear(spec.linear[1], torch.cat([wk, wv]), torch.cat([bk, bv]))
    _set_linear(spec.linear[-1], w_o, attention.W_o.bias)


def _set_ffn(spec: Any, block: nn.Module, ln: nn.LayerNorm) -> None:
    _set_linear(spec.linear_0, block.ffn.dense1.weight, block.ffn.dense1.bias)
    _set_linear(spec.linear_1, block.ffn.dense2.weight, block.ffn.dense2.bias)
    _set_layer_norm(spec.layer_norm, ln)


def _set_inputs(spec: Any, embedding: nn.Embedding, positions: Tensor) -> None:
    """Token embeddings, scaled by sqrt(d) as ours, and our sinusoid table (max_positions, d)."""
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _array(embedding.weight)
    spec.scale_embeddings = True
    spec.position_encodings.encodings = _array(positions)


def transformer_spec(model: Transformer, tokenizers: TokenizerPair) -> Any:
    """A CTranslate2 `TransformerSpec` holding `model`'s weights and vocabularies."""
    require_ctranslate2()
    from ctranslate2.specs import transformer_spec as ts
    from ctranslate2.specs.common_spec import Activation

    c = model.config
    # return_attention (word alignments) gives the last decoder layer's encoder-decoder
    # attention averaged over all heads (alignment_heads 0), as `alignment.AlignmentOptions()`
    spec = ts.TransformerSpec.from_config((c.num_encoder_layers, c.num_decoder_layers),
                                          c.num_heads, pre_norm=c.norm_first,
                                          activation=getattr(Activation, CT2_ACTIVATION[
                                              c.activation]),
                                          alignment_layer=-1, alignment_heads=0)
    encoder, decoder = model.encoder, model.decoder
    _set_inputs(spec.encoder, encoder.embedding, encoder.pos_encoding.P[0])
    for layer, block in zip(spec.encoder.layer, encoder.blks, strict=True):
        _set_attention(layer.self_attention, block.attention, c.num_heads, self_attention=True)
        _set_layer_norm(layer.self_attention.layer_norm, block.addnorm1.ln)
        _set_ffn(layer.ffn, block, block.addnorm2.ln)
    _set_inputs(spec.decoder, decoder.embedding, decoder.pos_encoding.P[0])
    for layer, block in zip(spec.decoder.layer, decoder.blks, strict=True):
        _set_attention(layer.self_attention, block.attention1, c.num_heads, self_attention=True)
        _set_layer_norm(layer.self_attention.layer_norm, block.addnorm1.ln)
        _set_attention(layer.attention, block.attention2, c.num_heads, self_attention=False)
        _set_layer_norm(layer.attention.layer_norm, block.addnorm2.ln)
        _set_ffn(layer.ffn, block, block.addnorm3.ln)
    if c.norm_first:
        _set_layer_norm(spec.encoder.layer_norm, encoder.final_ln)
        _set_layer_norm(spec.decoder.layer_norm, decoder.final_ln)
    _set_linear(spec.decoder.projection, model.output_projection.weight,
                model.output_projection.bias)
    spec.config.layer_norm_epsilon = encoder.blks[0].addnorm1.ln.eps
    # The vocabularies are the pieces in id order (SentencePiece's, or an imported table's).
    spec.register_source_vocabulary(tokenizers.src.vocabulary())
    spec.register_target_vocabulary(tokenizers.tgt.vocabulary())
    piece, ids = tokenizers.tgt.id_to_piece, tokenizers.tgt.specials
    spec.config.unk_token, spec.config.eos_token = piece(ids.unk), piece(ids.eos)
    spec.config.bos_token = spec.config.decoder_start_token = piece(ids.start)
    return spec


INT8_WEIGHT_MAX = 63  # int8 weights in [-63, 63]: see `quantize_spec`


def quantize_spec(spec: Any, quantization: str) -> None:
    """CTranslate2's `optimize` into `quantization`; then, for int8, every int8 weight matrix
    quantized again from its float32 values into 7 bits (per row: scale 63 / max |w|, where
    CTranslate2 takes 127), and the sinusoid tables halved (`_halve_position_tables`).

    Seven bits because CTranslate2's int8 product on x86 CPUs without VNNI (AVX2: oneDNN's
    u8s8 kernel, `vpmaddubsw`) adds each pair of uint8 x int8 products into a saturating
    16-bit sum: 2 x 255 x 127 overflows it, 2 x 255 x 63 = 32,130 does not. PyTorch's x86
    int8 gives up the same bit (its `reduce_range`, on the activations). With 8-bit weights
    an export loses far more on such CPUs than on VNNI ones (docs/benchmarks.md)."""
    floats = {}
    if quantization.startswith("int8"):
        floats = {name: np.array(value.numpy(), dtype=np.float32)  # copies: optimize
                  for name, value in spec.variables().items()  # works in place
                  if not isinstance(value, str) and value.dtype == "float32"}
    spec.optimize(quantization=quantization)
    if not floats:
        return
    from ctranslate2.specs.model_spec import NumpyVariable

    def seven_bits(layer: Any, name: str, value: Any) -> None:
        key = name.rsplit("/", 1)[-1]
        if getattr(value, "dtype", None) != "int8" or not hasattr(layer, f"{key}_scale"):
            return
        weight = floats[name]  # (out, in)
        row_max = np.abs(weight).max(axis=1)
        row_max[row_max == 0] = INT8_WEIGHT_MAX  # a zero row (a pruned head): scale 1
        scale = (INT8_WEIGHT_MAX / row_max).astype(np.float32)
        setattr(layer, key, NumpyVariable(np.rint(weight * scale[:, None]).astype(np.int8)))
        setattr(layer, f"{key}_scale", NumpyVariable(scale))

    spec._visit(seven_bits)
    if quantization == "int8":
        _halve_position_tables(spec)


def _halve_position_tables(spec: Any) -> None:
    """Store the sinusoid tables in float16 (CTranslate2 converts them back to float32 on
    loading): beside 8-bit weights their rounding (< 5e-4) is negligible, and a 1,024 x d
    table left in float32 is a tenth of a small model's int8 file."""
    for stack in (spec.encoder, spec.decoder):
        table = stack.position_encodings.encodings
        if not isinstance(table, str):  # a str is an alias of an identical table, saved once
            stack.position_encodings.encodings = table.to("float16")


# ---- writing and reading an export --------------------------------------------------------------

def check_exportable(translator: Translator, source: str = "") -> None:
    """`ExportError` (one line, naming `source`, the checkpoint) for a model that CTranslate2
    cannot translate as it was trained: a multilingual one; and for a translator loaded in
    int8 (`Translator`'s `quantize`: CTranslate2 quantizes the float32 weights itself)."""
    translator.check_float(source, "exporting it to CTranslate2 (which quantizes at "
                                   "export: quantization int8)")
    translator.check_bilingual(
        source, "exporting it to CTranslate2",
        "CTranslate2 reads the source pieces it is given and adds no target-language tag, "
        "which every source of this model needs; translate it with the torch engine "
        "(transformer translate --target-lang)")


def export_ctranslate2(translator: Translator, output: PathLike, *,
                       quantization: str = "float32", source: str = "",
                       vocab_map: VocabMap | None = None) -> ExportInfo:
    """Write `translator`'s model as a CTranslate2 model directory `output` (replacing an
    earlier export there; any other existing non-empty directory is refused). The directory
    appears complete or not at all: it is built beside `output`, then renamed. With a
    `vocab_map` (`vocab_map.build_vocab_map`), CTranslate2 decodes over its candidates only.
    A multilingual model is refused (`check_exportable`)."""
    check_exportable(translator, source)
    if quantization not in QUANTIZATIONS:
        raise ExportError(f"quantization must be one of {', '.join(QUANTIZATIONS)}, "
                          f"got {quantization!r}")
    output = Path(output)
    if output.exists() and (not output.is_dir() or (any(output.iterdir())
                                                    and not is_export(output))):
        raise ExportError(f"{output} exists and is not a CTranslate2 export: choose another "
                          f"--output")
    spec = transformer_spec(translator.model, translator.tokenizers)
    spec.validate()
    quantize_spec(spec, quantization)
    shared = translator.tokenizers.shared
    files = {"src": "spm.model", "tgt": "spm.model"} if shared else {
        "src": "source.spm.model", "tgt": "target.spm.model"}
    info = ExportInfo(model_config=translator.model.config.to_dict(),
                      decoding=asdict(translator.decoding), quantization=quantization,
                      tokenizer=files, source=source,
                      training_config=(None if translator.training_config is None
                                       else translator.training_config.to_dict()),
                      languages=translator.languages,
                      id_tables={side: table for side in ("src", "tgt")
                                 if (table := getattr(translator.tokenizers, side).id_table())}
                      or None,
                      vocab_map=None if vocab_map is None else {
                          "file": VOCAB_MAP, "pairs": vocab_map.pairs,
                          "always": len(vocab_map.always),
                          "source_pieces": len(vocab_map.candidates)})
    with atomic_directory(output) as build:
        spec.save(str(build))
        translator.tokenizers.src.save(build / files["src"])
        if not shared:
            translator.tokenizers.tgt.save(build / files["tgt"])
        if vocab_map is not None:
            vocab_map.write(build / VOCAB_MAP)
        with atomic_write(build / EXPORT_INFO, text=True) as f:
            json.dump(asdict(info), f, indent=2, default=str)
    return info


def is_export(directory: PathLike) -> bool:
    """Whether `directory` looks like a CTranslate2 export of ours."""
    directory = Path(directory)
    return (directory / EXPORT_INFO).is_file() and (directory / "model.bin").is_file()


def read_export(directory: PathLike) -> tuple[ExportInfo, TokenizerPair]:
    """The `ExportInfo` and tokenizers of an export directory; ExportError naming the file
    when something is missing or unreadable."""
    directory = Path(directory)
    path = directory / EXPORT_INFO
    if not is_export(directory):
        raise ExportError(f"{directory} is not a CTranslate2 export (no {EXPORT_INFO} and "
                          f"model.bin); make one with transformer export")
    try:
        info = ExportInfo(**json.loads(path.read_text(encoding="utf-8")))
        info.model()
        info.decoding_settings()
        info.stored_training_config()
    except (OSError, ValueError, TypeError) as e:
        raise ExportError(f"unreadable {path}: {e}") from e
    try:
        tables = info.id_tables or {}
        src = Tokenizer.load(directory / info.tokenizer["src"], tables.get("src"))
        tgt = (src if info.tokenizer["tgt"] == info.tokenizer["src"]
               else Tokenizer.load(directory / info.tokenizer["tgt"], tables.get("tgt")))
    except (OSError, RuntimeError, ValueError, KeyError, TypeError) as e:  # TypeError: a
        # `tokenizer` entry that is not a mapping of file names
        raise ExportError(f"{directory}: unreadable SentencePiece model: {e}") from e
    return info, TokenizerPair(src, tgt)
