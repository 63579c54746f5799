"""How much each attention head matters, and removing the ones that matter least.

The layers are those of `attention_maps.attention_layers` (encoder self, decoder self,
encoder-decoder attention, by layer).

- Head importance (Michel, Levy & Neubig, 2019, "Are Sixteen Heads Really Better than
  One?"), per head, on a validation set (`head_importance`):
  (a) masking: validation loss (token-level cross-entropy, no label smoothing:
      `loss.evaluate_loss`) and BLEU with that one head's output zeroed, minus the unmasked
      values;
  (b) gradient importance: I_h = E_x |dL(x)/d xi_h|, the expected absolute gradient of a
      sentence's loss L(x) (summed token cross-entropy) w.r.t. a gate xi_h = 1 on the head's
      output. One gate row per sentence makes it per sentence in one backward pass;
  (c) entropy (nats) of the head's attention distribution, averaged over real queries.
  Masks and gates are `MultiHeadAttention.masking_heads`, which scales each head's output
  before W_o; nothing is copied.
- Pruning: `heads_to_prune` picks the heads with the lowest gradient importance, each
  layer's scores divided by their L2 norm first (as Michel et al. 2019 do, after Molchanov
  et al. 2017), keeping at least one head per layer. `Transformer.prune_heads` then removes
  them for good and records them in `ModelConfig.pruned_heads`.
"""

from __future__ import annotations

import contextlib
import csv
import math
import os
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, fields
from typing import Union

import sacrebleu
import torch
from torch import Tensor

from ..data.batching import eval_batches
from ..data.store import Batch, ParallelCorpus
from ..data.text import ParallelText
from ..data.tokenizer import TokenizerPair
from ..decoding.translator import Translator
from ..files import atomic_write
from ..model.loss import evaluate_loss, teacher_forced_loss
from ..model.transformer import Transformer
from .attention_maps import attention_layers, recording_attention
from .plots import new_figure, save_png

__all__ = ["head_masks", "teacher_forced_batches", "GradientScores", "gradient_importance",
           "HeadScore", "HeadImportance", "head_importance", "heads_to_prune", "format_table",
           "write_csv", "plot_importance"]

PathLike = Union[str, "os.PathLike[str]"]


@contextlib.contextmanager
def head_masks(model: Transformer, masks: dict[str, Tensor]) -> Iterator[None]:
    """Mask the heads of the named attention layers ({name: (num_heads,) or (batch,
    num_heads)}) for the duration (`MultiHeadAttention.masking_heads`); the previous masks
    are restored on exit."""
    with contextlib.ExitStack() as stack:
        for name, mask in masks.items():
            stack.enter_context(model.get_submodule(name).masking_heads(mask))
        yield


# ---- teacher-forced evaluation batches -----------------------------------------------


def teacher_forced_batches(tokenizers: TokenizerPair, sources: Sequence[str],
                           references: Sequence[str], device: str | torch.device,
                           max_tokens: int = 4096) -> list[Batch]:
    """The sentence pairs encoded and batched (length-sorted) on `device`."""
    text = ParallelText(list(sources), list(references), list(range(len(sources))))
    corpus = ParallelCorpus.encode(text, tokenizers)
    return [corpus.collate(idx).to(device)
            for idx in eval_batches(corpus.src_lens, corpus.tgt_lens, max_tokens)]


# ---- head importance ----------------------------------------------------------------------


@dataclass
class GradientScores:
    """Per layer name, one value per head, on the CPU (see `gradient_importance`)."""

    importance: dict[str, Tensor]  # mean over sentences of |dL(x)/d xi_h|
    entropy: dict[str, Tensor]  # mean attention entropy over real queries, nats


def gradient_importance(model: Transformer, batches: Sequence[Batch]) -> GradientScores:
    """Gradient importance and attention entropy of every head.

    Importance: mean over sentences of |dL(x)/d xi_h|, with L(x) the sentence's summed token
    cross-entropy and xi a gate of ones on each head's output (a head mask of shape
    (batch, num_heads), so each sentence gets its own gradient). Entropy: mean over real
    (non-padding) queries of -sum_k p_k log p_k, in nats.
    """
    layers = attention_layers(model)
    device = model.device
    importance = {layer.name: torch.zeros(layer.module.num_heads, dtype=torch.float64)
                  for layer in layers}
    entropy = {name: torch.zeros_like(value) for name, value in importance.items()}
    queries = dict.fromkeys(importance, 0)
    sentences = 0
    with recording_attention(model) as records, torch.enable_grad():
        for batch in batches:
            gates = {layer.name: torch.ones(len(batch), layer.module.num_heads, device=device,
                                            requires_grad=True) for layer in layers}
            with head_masks(model, gates):
                nll = teacher_forced_loss(model, batch).nll
                grads = torch.autograd.grad(nll, list(gates.values()))  # (B, heads) each
            pad = model.config.pad_id
            tgt_real = batch.tgt_out != pad
            real = {"enc-self": batch.src != pad, "dec-self": tgt_real,
                    "enc-dec": tgt_real}  # (B, queries)
            for layer, grad in zip(layers, grads, strict=True):
                importance[layer.name] += grad.abs().sum(0).double().cpu()
                weights = records[layer.name].weights.detach().float()  # (B, h, q, k)
                per_query = -torch.special.xlogy(weights, weights).sum(-1)  # (B, h, q)
                mask = real[layer.kind][:, None, :]  # (B, 1, q)
                entropy[layer.name] += (per_query * mask).sum((0, 2)).double().cpu()
                queries[layer.name] += int(mask.sum())
            sentences += len(batch)
    return GradientScores({name: value / max(sentences, 1) for name, value in importance.items()},
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
                    on_head: Callable[[HeadScore], None] | None = None) -> HeadImportance:
    """Mask each head alone (loss and BLEU change), plus gradient importance and attention
    entropy, on `sources`/`references`. BLEU decodes with `translator`'s beam search;
    `beam_size=1` is greedy search. `on_head` is called as each head is done."""
    model, tokenizers = translator.model, translator.tokenizers
    batches = teacher_forced_batches(tokenizers, sources, references, translator.device,
                                     max_tokens)
    loss = evaluate_loss(model, batches).nll
    bleu = _bleu(translator, sources, references, beam_size)
    gradient = gradient_importance(model, batches)
    scores = []
    for layer in attention_layers(model):
        for i, head in enumerate(layer.module.head_ids):
            mask = torch.ones(layer.module.num_heads, device=translator.device)
            mask[i] = 0.0
            with head_masks(model, {layer.name: mask}):
                masked_loss = evaluate_loss(model, batches).nll
                masked_bleu = _bleu(translator, sources, references, beam_size)
            score = HeadScore(layer.name, layer.kind, layer.layer, head, masked_loss - loss,
                              masked_bleu - bleu, float(gradient.importance[layer.name][i]),
                              float(gradient.entropy[layer.name][i]))
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
    widths = [max(len(x) for x in column) for column in zip(head, *rows, strict=True)]
    lines = [" ".join(x.rjust(w) for x, w in zip(row, widths, strict=True))
             for row in [head, *rows]]
    summary = (f"{report.sentences} sentences: loss {report.loss:.4f} nats/token, "
               f"BLEU {report.bleu:.2f} ({report.search}); deltas are masked minus unmasked")
    return "\n".join([summary, *lines])


def write_csv(report: HeadImportance, path: PathLike) -> None:
    """One row per head, the fields of `HeadScore`."""
    with atomic_write(path, text=True) as f:
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
    figure = new_figure(4 * (0.5 * num_heads + 1.6), 0.32 * len(layers) + 1.6)
    for ax, (key, title, cmap) in zip(figure.subplots(1, len(panels)), panels, strict=True):
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
    save_png(figure, path)
