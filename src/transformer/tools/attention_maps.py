"""What the attention heads attend to: per-head attention weights and their pictures.

Every attention layer is a `MultiHeadAttention` named as in `model.named_modules()`
(`ModelConfig.attention_names`): `encoder.blks.{i}.attention` (encoder self-attention),
`decoder.blks.{i}.attention1` (decoder self-attention), `decoder.blks.{i}.attention2`
(encoder-decoder attention). `attention_layers` lists them with their kind and layer.

`attention_maps` runs one teacher-forced forward pass with every layer keeping its weights
(`recording_attention`); `plot_attention` draws them, one panel per head, axes labelled with
the SentencePiece pieces. Decoder rows are labelled with the token each position predicts
(as JoeyNMT plots them); decoder self-attention columns with the token each position reads
(`<s>` first). `encoder_decoder_figure` is the figure training logs to TensorBoard at each
validation; `write_attention_maps` writes one PNG per layer (`transformer attention-maps`).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Union

import torch
from torch import Tensor

from ..data.tokenizer import TokenizerPair
from ..model.attention import AttentionRecord, MultiHeadAttention
from ..model.transformer import Transformer, eval_mode
from .plots import new_figure, save_png

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["KINDS", "AttentionLayer", "attention_layers", "recording_attention",
           "attention_maps", "axis_labels", "plot_attention", "encoder_decoder_figure",
           "write_attention_maps"]

PathLike = Union[str, "os.PathLike[str]"]
DECODER_KINDS = {"attention1": "dec-self", "attention2": "enc-dec"}  # by module attribute
KINDS = {"enc-self": "encoder self-attention", "dec-self": "decoder self-attention",
         "enc-dec": "encoder-decoder attention"}


@dataclass(frozen=True)
class AttentionLayer:
    """One MultiHeadAttention of a Transformer and where it sits."""

    name: str  # as in named_modules(), e.g. "decoder.blks.0.attention2"
    kind: str  # "enc-self", "dec-self" or "enc-dec"
    layer: int  # block index, from 0
    module: MultiHeadAttention


def attention_layers(model: Transformer) -> list[AttentionLayer]:
    """The model's attention layers: encoder self, decoder self, encoder-decoder, by layer."""
    layers = []
    for name in model.config.attention_names():
        side, _, index, attribute = name.split(".")  # e.g. decoder.blks.0.attention2
        kind = "enc-self" if side == "encoder" else DECODER_KINDS[attribute]
        layers.append(AttentionLayer(name, kind, int(index), model.get_submodule(name)))
    return layers


@contextlib.contextmanager
def recording_attention(model: Transformer) -> Iterator[dict[str, AttentionRecord]]:
    """Eval mode with every attention layer recording (`MultiHeadAttention.recording`):
    {layer name: its record}, in `attention_layers`' order. The training flag is restored
    and the layers stop recording on exit."""
    with contextlib.ExitStack() as stack:
        records = {layer.name: stack.enter_context(layer.module.recording())
                   for layer in attention_layers(model)}
        stack.enter_context(eval_mode(model))
        yield records


@torch.no_grad()
def attention_maps(model: Transformer, src_ids: Sequence[int],
                   tgt_ids: Sequence[int]) -> dict[str, Tensor]:
    """Attention weights of one sentence pair, teacher-forced: {layer name: (heads,
    queries, keys)} as float32 on the CPU. The ids are pieces without BOS/EOS; the model
    reads `src + [EOS]` and `[BOS] + tgt` (BOS: the model's start id)."""
    device, c = model.device, model.config
    src = torch.tensor([list(src_ids) + [c.eos_id]], device=device)  # (1, src_len)
    tgt_in = torch.tensor([[c.start_id] + list(tgt_ids)], device=device)  # (1, tgt_len)
    with recording_attention(model) as records:
        model(src, torch.tensor([src.shape[1]], device=device), tgt_in)
    return {name: record.weights[0].float().cpu() for name, record in records.items()}


def axis_labels(tokenizers: TokenizerPair, src_ids: Sequence[int],
                 tgt_ids: Sequence[int]) -> dict[str, tuple[list[str], list[str]]]:
    """(query labels, key labels) per kind of layer, as SentencePiece pieces."""
    ids = tokenizers.tgt.specials
    src = [tokenizers.src.id_to_piece(i) for i in [*src_ids, tokenizers.src.specials.eos]]
    reads = [tokenizers.tgt.id_to_piece(i) for i in [ids.start, *tgt_ids]]  # decoder input
    predicts = [tokenizers.tgt.id_to_piece(i) for i in [*tgt_ids, ids.eos]]  # its output
    return {"enc-self": (src, src), "dec-self": (predicts, reads), "enc-dec": (predicts, src)}


def plot_attention(rows: Sequence[tuple[str, Tensor, Sequence[int]]],
                   query_labels: Sequence[str], key_labels: Sequence[str],
                   title: str = "") -> Figure:
    """A grid of attention maps: one row per (row title, weights (heads, queries, keys),
    original head indices), one panel per head. The colour scale runs from 0 to the largest
    weight in the figure (diffuse heads would be invisible on a 0..1 scale).

    Panels are placed by hand, in inches (an automatic layout measures every tick label
    again and again: several times slower with a few hundred labels)."""
    num_cols = max(weights.shape[0] for _, weights, _ in rows)
    vmax = max(float(weights.max()) for _, weights, _ in rows) or 1.0
    num_q, num_k = len(query_labels), len(key_labels)
    cell = min(0.14, 6.0 / max(num_q, num_k))  # inches per token; long sentences shrink
    char = 0.045  # inches per label character (fontsize 5)
    panel_w, panel_h = num_k * cell, num_q * cell
    left = char * max(map(len, query_labels)) + 0.15  # room for the labels left of a panel
    below = char * max(map(len, key_labels)) + 0.15  # and under it (rotated)
    top, colorbar = 0.25 + 0.3 * bool(title), 0.8
    col_w, row_h = left + panel_w + 0.15, 0.25 + panel_h + below
    width, height = num_cols * col_w + colorbar, top + len(rows) * row_h
    figure = new_figure(width, height, layout=None)
    image = None
    for r, (row_title, weights, head_ids) in enumerate(rows):
        for c in range(weights.shape[0]):  # a pruned layer has fewer heads: blank space
            x, y = c * col_w + left, height - top - r * row_h - 0.25 - panel_h  # inches
            ax = figure.add_axes((x / width, y / height, panel_w / width, panel_h / height))
            image = ax.imshow(weights[c].numpy(), vmin=0.0, vmax=vmax, cmap="viridis",
                              aspect="auto")
            ax.set_title(f"{row_title} head {head_ids[c]}", fontsize=7)
            ax.set_xticks(range(num_k), key_labels, rotation=90, fontsize=5)
            ax.set_yticks(range(num_q), query_labels, fontsize=5)
            ax.tick_params(length=0)
    if title:
        figure.suptitle(title, fontsize=9, y=1 - 0.1 / height, va="top")
    if image is not None:
        bar_h = min(3.0, height - top - 0.3)
        cax = figure.add_axes(((width - colorbar + 0.2) / width, (height - top - bar_h) / height,
                               0.12 / width, bar_h / height))
        figure.colorbar(image, cax=cax).set_label("attention weight", fontsize=7)
        cax.tick_params(labelsize=6)
    return figure


def _rows(model: Transformer, maps: dict[str, Tensor],
          kind: str) -> list[tuple[str, Tensor, list[int]]]:
    return [(f"layer {layer.layer}", maps[layer.name], layer.module.head_ids)
            for layer in attention_layers(model) if layer.kind == kind]


def encoder_decoder_figure(model: Transformer, tokenizers: TokenizerPair, source: str,
                           target: str) -> Figure:
    """Encoder-decoder attention of one sentence pair (teacher-forced on `target`): one row
    of panels per decoder layer, one panel per head. Training logs it to TensorBoard."""
    src_ids, tgt_ids = tokenizers.src.encode(source), tokenizers.tgt.encode(target)
    maps = attention_maps(model, src_ids, tgt_ids)
    queries, keys = axis_labels(tokenizers, src_ids, tgt_ids)["enc-dec"]
    return plot_attention(_rows(model, maps, "enc-dec"), queries, keys,
                          "encoder-decoder attention (rows: target token predicted)")


def write_attention_maps(model: Transformer, tokenizers: TokenizerPair, source: str,
                         target: str, output_dir: PathLike) -> list[Path]:
    """One PNG per attention layer, `{kind}-{layer}.png` (e.g. enc-dec-3.png), one panel
    per head, for a sentence pair teacher-forced on `target`. Returns the paths."""
    src_ids, tgt_ids = tokenizers.src.encode(source), tokenizers.tgt.encode(target)
    maps = attention_maps(model, src_ids, tgt_ids)
    labels = axis_labels(tokenizers, src_ids, tgt_ids)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for layer in attention_layers(model):
        queries, keys = labels[layer.kind]
        figure = plot_attention([(f"layer {layer.layer}", maps[layer.name],
                                  layer.module.head_ids)], queries, keys,
                                f"{KINDS[layer.kind]}, layer {layer.layer}")
        path = output_dir / f"{layer.kind}-{layer.layer}.png"
        save_png(figure, path)
        paths.append(path)
    return paths
