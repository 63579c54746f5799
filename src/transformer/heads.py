"""Inside the attention heads: attention maps, head importance, head pruning.

Every attention layer is a `MultiHeadAttention` named as in `model.named_modules()`
(`ModelConfig.attention_names`): `encoder.blks.{i}.attention` (encoder self-attention),
`decoder.blks.{i}.attention1` (decoder self-attention), `decoder.blks.{i}.attention2`
(encoder-decoder attention).

- Attention maps: `attention_maps` runs one teacher-forced forward pass with every layer
  keeping its weights (`need_weights`); `plot_attention` draws them, one panel per head,
  axes labelled with the SentencePiece pieces. Decoder rows are labelled with the token each
  position predicts (as JoeyNMT plots them); decoder self-attention columns with the token
  each position reads (`<s>` first). `encoder_decoder_figure` is the figure training logs
  to TensorBoard at each validation.
- Head importance (Michel, Levy & Neubig, 2019, "Are Sixteen Heads Really Better than
  One?"), per head, on a validation set (`head_importance`):
  (a) masking: validation loss (token-level cross-entropy, no label smoothing) and BLEU with
      that one head's output zeroed, minus the unmasked values;
  (b) gradient importance: I_h = E_x |dL(x)/d xi_h|, the expected absolute gradient of a
      sentence's loss L(x) (summed token cross-entropy) w.r.t. a gate xi_h = 1 on the head's
      output. One gate row per sentence makes it per sentence in one backward pass;
  (c) entropy (nats) of the head's attention distribution, averaged over real queries.
  Masks and gates are `MultiHeadAttention.head_mask`, which scales each head's output
  before W_o; nothing is copied.
- Pruning: `heads_to_prune` picks the heads with the lowest gradient importance, each
  layer's scores divided by their L2 norm first (as Michel et al. 2019 do, after Molchanov
  et al. 2017), keeping at least one head per layer. `Transformer.prune_heads` then removes
  them for good and records them in `ModelConfig.pruned_heads`.

Figures are built as `matplotlib.figure.Figure` on the Agg canvas (no pyplot, no display).
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
from dataclasses import asdict, dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterator, Optional, Sequence, Union

import sacrebleu
import torch
import torch.nn.functional as F
from torch import Tensor

from .attention import MultiHeadAttention
from .data import Batch, ParallelCorpus, ParallelText, eval_batches
from .model import Transformer
from .tokenizer import BOS_ID, EOS_ID, PAD_ID, TokenizerPair
from .translator import Translator

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["AttentionLayer", "attention_layers", "recording_attention", "head_masks",
           "attention_maps", "plot_attention", "encoder_decoder_figure",
           "write_attention_maps", "teacher_forced_batches", "validation_loss",
           "gradient_importance", "HeadScore", "HeadImportance", "head_importance",
           "heads_to_prune", "format_table", "write_csv", "plot_importance"]

PathLike = Union[str, "os.PathLike[str]"]
DECODER_KINDS = {"attention1": "dec-self", "attention2": "enc-dec"}  # by module attribute


# ---- the attention layers of a model ------------------------------------------------------


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
def recording_attention(model: Transformer) -> Iterator[list[AttentionLayer]]:
    """Eval mode with every attention layer keeping its weights (`head_attention_weights`);
    the training flag and `need_weights` are restored on exit, the weights dropped."""
    layers = attention_layers(model)
    flags = [layer.module.need_weights for layer in layers]
    training = model.training
    model.eval()
    for layer in layers:
        layer.module.need_weights = True
    try:
        yield layers
    finally:
        for layer, flag in zip(layers, flags):
            layer.module.need_weights = flag
            layer.module.attention.attention_weights = None
        model.train(training)


@contextlib.contextmanager
def head_masks(model: Transformer, masks: dict[str, Tensor]) -> Iterator[None]:
    """Set `head_mask` of the named attention layers ({name: (num_heads,) or (batch,
    num_heads)}) for the duration; the previous masks are restored on exit."""
    modules = {name: model.get_submodule(name) for name in masks}
    previous = {name: module.head_mask for name, module in modules.items()}
    try:
        for name, module in modules.items():
            module.head_mask = masks[name]
        yield
    finally:
        for name, module in modules.items():
            module.head_mask = previous[name]


@contextlib.contextmanager
def _evaluating(model: Transformer) -> Iterator[None]:
    training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(training)


def _device(model: Transformer) -> torch.device:
    return next(model.parameters()).device


# ---- attention maps -----------------------------------------------------------------------


@torch.no_grad()
def attention_maps(model: Transformer, src_ids: Sequence[int],
                   tgt_ids: Sequence[int]) -> dict[str, Tensor]:
    """Attention weights of one sentence pair, teacher-forced: {layer name: (heads,
    queries, keys)} as float32 on the CPU. The ids are pieces without BOS/EOS; the model
    reads `src + [EOS]` and `[BOS] + tgt`."""
    device = _device(model)
    src = torch.tensor([list(src_ids) + [EOS_ID]], device=device)  # (1, src_len)
    tgt_in = torch.tensor([[BOS_ID] + list(tgt_ids)], device=device)  # (1, tgt_len)
    with recording_attention(model) as layers:
        model(src, torch.tensor([src.shape[1]], device=device), tgt_in)
        return {layer.name: layer.module.head_attention_weights[0].float().cpu()
                for layer in layers}


def _axis_labels(tokenizers: TokenizerPair, src_ids: Sequence[int],
                 tgt_ids: Sequence[int]) -> dict[str, tuple[list[str], list[str]]]:
    """(query labels, key labels) per kind of layer."""
    src = [tokenizers.src.id_to_piece(i) for i in [*src_ids, EOS_ID]]
    reads = [tokenizers.tgt.id_to_piece(i) for i in [BOS_ID, *tgt_ids]]  # decoder input
    predicts = [tokenizers.tgt.id_to_piece(i) for i in [*tgt_ids, EOS_ID]]  # its output
    return {"enc-self": (src, src), "dec-self": (predicts, reads), "enc-dec": (predicts, src)}


def _new_figure(width: float, height: float, layout: Optional[str] = "constrained") -> "Figure":
    """A figure on the Agg canvas (no pyplot: nothing global, nothing to close)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), layout=layout)
    FigureCanvasAgg(figure)
    return figure


def plot_attention(rows: Sequence[tuple[str, Tensor, Sequence[int]]],
                   query_labels: Sequence[str], key_labels: Sequence[str],
                   title: str = "") -> "Figure":
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
    figure = _new_figure(width, height, layout=None)
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
                           target: str) -> "Figure":
    """Encoder-decoder attention of one sentence pair (teacher-forced on `target`): one row
    of panels per decoder layer, one panel per head. Training logs it to TensorBoard."""
    src_ids, tgt_ids = tokenizers.src.encode(source), tokenizers.tgt.encode(target)
    maps = attention_maps(model, src_ids, tgt_ids)
    queries, keys = _axis_labels(tokenizers, src_ids, tgt_ids)["enc-dec"]
    return plot_attention(_rows(model, maps, "enc-dec"), queries, keys,
                          "encoder-decoder attention (rows: target token predicted)")


def write_attention_maps(model: Transformer, tokenizers: TokenizerPair, source: str,
                         target: str, output_dir: PathLike) -> list[Path]:
    """One PNG per attention layer, `{kind}-{layer}.png` (e.g. enc-dec-3.png), one panel
    per head, for a sentence pair teacher-forced on `target`. Returns the paths."""
    src_ids, tgt_ids = tokenizers.src.encode(source), tokenizers.tgt.encode(target)
    maps = attention_maps(model, src_ids, tgt_ids)
    labels = _axis_labels(tokenizers, src_ids, tgt_ids)
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    names = {"enc-self": "encoder self-attention", "dec-self": "decoder self-attention",
             "enc-dec": "encoder-decoder attention"}
    paths = []
    for layer in attention_layers(model):
        queries, keys = labels[layer.kind]
        figure = plot_attention([(f"layer {layer.layer}", maps[layer.name],
                                  layer.module.head_ids)], queries, keys,
                                f"{names[layer.kind]}, layer {layer.layer}")
        path = output_dir / f"{layer.kind}-{layer.layer}.png"
        figure.savefig(path, dpi=150)
        paths.append(path)
    return paths


# ---- teacher-forced evaluation batches -----------------------------------------------


def teacher_forced_batches(tokenizers: TokenizerPair, sources: Sequence[str],
                           references: Sequence[str], device: Union[str, torch.device],
                           max_tokens: int = 4096) -> list[Batch]:
    """The sentence pairs encoded and batched (length-sorted) on `device`."""
    text = ParallelText(list(sources), list(references), list(range(len(sources))))
    corpus = ParallelCorpus.encode(text, tokenizers)
    return [corpus.collate(idx).to(device)
            for idx in eval_batches(corpus.src_lens, corpus.tgt_lens, max_tokens)]


# ---- head importance ----------------------------------------------------------------------


@torch.no_grad()
def validation_loss(model: Transformer, batches: Sequence[Batch]) -> float:
    """Cross-entropy per target token (no label smoothing), under the current head masks."""
    total, tokens = 0.0, 0
    with _evaluating(model):
        for batch in batches:
            mask = batch.tgt_out != PAD_ID  # (B, T)
            logits = model(batch.src, batch.src_valid_lens, batch.tgt_in,
                           output_mask=mask)  # (N, V)
            total += float(F.cross_entropy(logits.float(), batch.tgt_out[mask],
                                           reduction="sum"))
            tokens += batch.num_tgt_tokens
    return total / max(tokens, 1)


def gradient_importance(model: Transformer, batches: Sequence[Batch]
                        ) -> tuple[dict[str, Tensor], dict[str, Tensor]]:
    """(gradient importance, attention entropy) per layer name, each (num_heads,) on the CPU.

    Importance: mean over sentences of |dL(x)/d xi_h|, with L(x) the sentence's summed token
    cross-entropy and xi a gate of ones on each head's output (`head_mask` of shape
    (batch, num_heads), so each sentence gets its own gradient). Entropy: mean over real
    (non-padding) queries of -sum_k p_k log p_k, in nats.
    """
    layers = attention_layers(model)
    device = _device(model)
    importance = {layer.name: torch.zeros(layer.module.num_heads, dtype=torch.float64)
                  for layer in layers}
    entropy = {name: torch.zeros_like(value) for name, value in importance.items()}
    queries = {name: 0 for name in importance}
    sentences = 0
    with recording_attention(model), torch.enable_grad():
        for batch in batches:
            gates = {layer.name: torch.ones(len(batch), layer.module.num_heads, device=device,
                                            requires_grad=True) for layer in layers}
            tgt_real = batch.tgt_out != PAD_ID  # (B, T)
            with head_masks(model, gates):
                logits = model(batch.src, batch.src_valid_lens, batch.tgt_in,
                               output_mask=tgt_real)  # (N, V)
                loss = F.cross_entropy(logits.float(), batch.tgt_out[tgt_real], reduction="sum")
                grads = torch.autograd.grad(loss, list(gates.values()))  # (B, heads) each
            real = {"enc-self": batch.src != PAD_ID, "dec-self": tgt_real,
                    "enc-dec": tgt_real}  # (B, queries)
            for layer, grad in zip(layers, grads):
                importance[layer.name] += grad.abs().sum(0).double().cpu()
                weights = layer.module.head_attention_weights.detach().float()  # (B, h, q, k)
                per_query = -torch.special.xlogy(weights, weights).sum(-1)  # (B, h, q)
                mask = real[layer.kind][:, None, :]  # (B, 1, q)
                entropy[layer.name] += (per_query * mask).sum((0, 2)).double().cpu()
                queries[layer.name] += int(mask.sum())
            sentences += len(batch)
    return ({name: value / max(sentences, 1) for name, value in importance.items()},
            {name: value / max(queries[name], 1) for name, value in entropy.items()})


@dataclass
class HeadScore:
    """One head's importance (see the module docstring)."""

    name: str  # attention layer, e.g. "decoder.blks.0.attention2"
    kind: str  # enc-self, dec-self, enc-dec
    layer: int
    head: int  # original head index (before any pruning)
    delta_loss: float  # masked minus unmasked validation loss (nats per token)
    delta_bleu: float  # masked minus unmasked BLEU
    gradient: float  # E_x |dL(x)/d xi_h|
    entropy: float  # mean attention entropy, nats


@dataclass
class HeadImportance:
    """Unmasked loss and BLEU, and every head's scores."""

    loss: float
    bleu: float
    heads: list[HeadScore]
    sentences: int
    search: str  # how the BLEU translations were made, e.g. "greedy"


def _bleu(translator: Translator, sources: Sequence[str], references: Sequence[str],
          beam_size: int) -> float:
    hypotheses = translator.translate(list(sources), beam_size=beam_size)
    return sacrebleu.corpus_bleu(hypotheses, [list(references)]).score


def head_importance(translator: Translator, sources: Sequence[str],
                    references: Sequence[str], *, beam_size: int = 1,
                    max_tokens: int = 4096,
                    on_head: Optional[Callable[[HeadScore], None]] = None) -> HeadImportance:
    """Mask each head alone (loss and BLEU change), plus gradient importance and attention
    entropy, on `sources`/`references`. BLEU decodes with `translator`'s beam search;
    `beam_size=1` is greedy search. `on_head` is called as each head is done."""
    model, tokenizers = translator.model, translator.tokenizers
    batches = teacher_forced_batches(tokenizers, sources, references, translator.device,
                                     max_tokens)
    loss = validation_loss(model, batches)
    bleu = _bleu(translator, sources, references, beam_size)
    gradient, entropy = gradient_importance(model, batches)
    scores = []
    for layer in attention_layers(model):
        for i, head in enumerate(layer.module.head_ids):
            mask = torch.ones(layer.module.num_heads, device=translator.device)
            mask[i] = 0.0
            with head_masks(model, {layer.name: mask}):
                masked_loss = validation_loss(model, batches)
                masked_bleu = _bleu(translator, sources, references, beam_size)
            score = HeadScore(layer.name, layer.kind, layer.layer, head, masked_loss - loss,
                              masked_bleu - bleu, float(gradient[layer.name][i]),
                              float(entropy[layer.name][i]))
            scores.append(score)
            if on_head is not None:
                on_head(score)
    search = "greedy" if beam_size == 1 else f"beam {beam_size}"
    return HeadImportance(loss, bleu, scores, len(sources), search)


# ---- pruning ------------------------------------------------------------------------------


def heads_to_prune(model: Transformer, importance: dict[str, Tensor], fraction: float,
                   normalize: bool = True) -> dict[str, list[int]]:
    """The `fraction` of the model's (remaining) heads with the lowest importance ->
    {layer name: original head indices}. With `normalize`, each layer's scores are divided
    by their L2 norm first (Michel et al., 2019). Every layer keeps at least one head, so
    fewer heads are returned when `fraction` asks for more."""
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction must be in [0, 1], got {fraction}")
    layers = attention_layers(model)
    candidates = []  # (score, layer position, current index, layer)
    for position, layer in enumerate(layers):
        scores = importance[layer.name].double()
        if normalize:
            scores = scores / scores.norm().clamp_min(1e-20)
        candidates += [(float(s), position, i, layer) for i, s in enumerate(scores)]
    wanted = round(fraction * len(candidates))
    remaining = {layer.name: layer.module.num_heads for layer in layers}
    chosen: dict[str, list[int]] = {}
    for _, _, i, layer in sorted(candidates, key=lambda c: c[:3]):
        if sum(map(len, chosen.values())) == wanted:
            break
        if remaining[layer.name] > 1:
            remaining[layer.name] -= 1
            chosen.setdefault(layer.name, []).append(layer.module.head_ids[i])
    return {name: sorted(heads) for name, heads in chosen.items()}


# ---- reporting ----------------------------------------------------------------------------

_COLUMNS = [("layer", "{}"), ("kind", "{}"), ("head", "{}"), ("delta_loss", "{:+.4f}"),
            ("delta_bleu", "{:+.2f}"), ("gradient", "{:.4f}"), ("entropy", "{:.3f}")]


def format_table(report: HeadImportance) -> str:
    """The scores as an aligned text table, one head per line."""
    head = [name for name, _ in _COLUMNS]
    rows = [[fmt.format(getattr(s, name)) for name, fmt in _COLUMNS] for s in report.heads]
    widths = [max(len(x) for x in column) for column in zip(head, *rows)]
    lines = [" ".join(x.rjust(w) for x, w in zip(row, widths)) for row in [head, *rows]]
    summary = (f"{report.sentences} sentences: loss {report.loss:.4f} nats/token, "
               f"BLEU {report.bleu:.2f} ({report.search}); deltas are masked minus unmasked")
    return "\n".join([summary, *lines])


def write_csv(report: HeadImportance, path: PathLike) -> None:
    """One row per head, the fields of `HeadScore`."""
    with open(path, "w", newline="", encoding="utf-8") as f:
        writer = csv.DictWriter(f, [field.name for field in fields(HeadScore)])
        writer.writeheader()
        writer.writerows(asdict(s) for s in report.heads)


def plot_importance(report: HeadImportance, path: PathLike) -> None:
    """Heatmaps (rows: attention layers, columns: heads) of the four scores, as a PNG."""
    layers = list(dict.fromkeys((s.kind, s.layer) for s in report.heads))
    num_heads = max(s.head for s in report.heads) + 1
    panels = [("delta_loss", "loss change when masked", "RdBu_r"),  # red: masking hurts
              ("delta_bleu", "BLEU change when masked", "RdBu"),
              ("gradient", "gradient importance", "Reds"),
              ("entropy", "attention entropy (nats)", "viridis")]
    figure = _new_figure(4 * (0.5 * num_heads + 1.6), 0.32 * len(layers) + 1.6)
    for ax, (key, title, cmap) in zip(figure.subplots(1, len(panels)), panels):
        grid = torch.full((len(layers), num_heads), math.nan)  # pruned heads stay blank
        for s in report.heads:
            grid[layers.index((s.kind, s.layer)), s.head] = getattr(s, key)
        limit = float(grid.nan_to_num().abs().max()) or 1.0
        scale = dict(vmin=-limit, vmax=limit) if key.startswith("delta") else {}  # 0 white
        image = ax.imshow(grid.numpy(), cmap=cmap, aspect="auto", **scale)
        for r, row in enumerate(grid.tolist()):
            for c, value in enumerate(row):
                if not math.isnan(value):
                    ax.text(c, r, f"{value:.2g}", ha="center", va="center", fontsize=6)
        ax.set_title(title, fontsize=8)
        ax.set_xticks(range(num_heads), [str(h) for h in range(num_heads)], fontsize=7)
        ax.set_yticks(range(len(layers)), [f"{k} {i}" for k, i in layers], fontsize=7)
        ax.set_xlabel("head", fontsize=7)
        figure.colorbar(image, ax=ax, shrink=0.8)
    figure.suptitle(f"head importance on {report.sentences} sentences "
                    f"(BLEU by {report.search} search)", fontsize=9)
    figure.savefig(path, dpi=150)
