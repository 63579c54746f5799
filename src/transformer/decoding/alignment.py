"""Word alignments from encoder-decoder attention, in the Pharaoh `i-j` form.

    0-0 1-2 2-1 3-3      (source word i, output word j, both from 0; pairs sorted)

Marian's `--alignment`, fairseq's `--print-alignment` and CTranslate2's `return_attention`
give the same: each output piece is aligned to the source piece it attends to most in the
encoder-decoder attention of one decoder layer (by default the last, averaged over its
heads). Here the weights come from one teacher-forced pass over the finished translation
(`attention_weights`), which equals what each decoding step computed, and pieces are merged
back into whitespace words (`word_alignment`): a SentencePiece piece that starts with "▁"
begins a word. The source's EOS is never an alignment point.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor

from ..data.batching import pad_rows, sorted_batches
from ..model.transformer import Transformer, eval_mode
from .request import AlignmentOptions

__all__ = ["attention_weights", "word_alignment", "format_alignment"]

WORD_START = "\u2581"  # SentencePiece's "▁": the piece begins a whitespace word


@torch.no_grad()
def attention_weights(model: Transformer, sources: Sequence[Sequence[int]],
                      outputs: Sequence[Sequence[int]], options: AlignmentOptions,
                      max_tokens: int) -> list[Tensor]:
    """Teacher-forced encoder-decoder attention of each output given its source: per pair
    (output pieces, source pieces + EOS) float32 on the CPU; row j is the attention of the
    step that produced output piece j. `sources` are ids with EOS, `outputs` without EOS;
    pairs are batched by length, at most `max_tokens` padded positions per side. The options
    name a layer and head of the model (`BaseTranslator.check` checks a request's)."""
    c = model.config
    module = model.decoder.blks[options.layer].attention2
    sizes = [max(len(s), len(o) + 1) for s, o in zip(sources, outputs, strict=True)]
    weights: list[Tensor] = [torch.empty(0)] * len(sources)
    with module.recording() as record, eval_mode(model):
        for batch in sorted_batches(range(len(sizes)), sizes, max_tokens):
            src, src_lens = pad_rows([sources[i] for i in batch], c.pad_id, model.device)
            tgt_in, _ = pad_rows([[c.start_id, *outputs[i]] for i in batch], c.pad_id,
                                model.device)
            model.decoder(tgt_in, model.encode(src, src_lens), src_lens)
            heads = record.weights  # (batch, heads, tgt_len, src_len)
            picked = (heads.mean(1) if options.head is None
                      else heads[:, module.head_ids.index(options.head)])
            for row, i in enumerate(batch):
                weights[i] = picked[row, :len(outputs[i]), :len(sources[i])].float().cpu()
    return weights


def _word_numbers(pieces: Sequence[str]) -> list[int]:
    """The whitespace word each piece belongs to, from 0."""
    numbers, word = [], -1
    for piece in pieces:
        if piece.startswith(WORD_START) or word < 0:
            word += 1
        numbers.append(word)
    return numbers


def word_alignment(weights: Tensor, src_pieces: Sequence[str],
                   out_pieces: Sequence[str]) -> list[tuple[int, int]]:
    """Attention (output pieces, source pieces [+ EOS]) -> sorted (source word, output
    word) pairs: each output piece aligns to the source piece it weighs most, EOS aside."""
    if not out_pieces or not src_pieces:
        return []
    src_words, out_words = _word_numbers(src_pieces), _word_numbers(out_pieces)
    best = weights[:len(out_pieces), :len(src_pieces)].argmax(-1).tolist()
    return sorted({(src_words[s], out_words[j]) for j, s in enumerate(best)})


def format_alignment(pairs: Sequence[tuple[int, int]]) -> str:
    """[(0, 0), (1, 2)] -> "0-0 1-2"."""
    return " ".join(f"{i}-{j}" for i, j in pairs)
