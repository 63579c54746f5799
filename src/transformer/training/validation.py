"""Validation during training: the loss on every validation set and the BLEU and chrF of
greedy translations (`corpus.search_corpus`, as the Translator decodes), a few sample
translations and, for TensorBoard, the encoder-decoder attention of the first validation
sentence. Several sets: each set's metrics, and their means, which select the best
checkpoint. The decoding caches' memory is freed after it (`cache.release_cache_buffers`):
training does not keep it.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

import sacrebleu
import torch

from ..decoding.corpus import parallel_searches, search_corpus
from ..decoding.request import DecodingRequest
from ..model.cache import release_cache_buffers
from ..model.loss import evaluate_loss
from ..model.transformer import Transformer, eval_mode
from ..run.config import TrainConfig
from ..run.data import Data
from ..tools.attention_maps import encoder_decoder_figure
from .log import ValidationMetrics

if TYPE_CHECKING:
    from matplotlib.figure import Figure

__all__ = ["ValidationReport", "validate"]


@dataclass
class ValidationReport:
    """What `validate` returns."""

    metrics: ValidationMetrics
    samples: list[tuple[str, str, str]]  # (source, reference, greedy translation)
    figure: Figure | None  # encoder-decoder attention of the first sentence


@torch.no_grad()
def validate(model: Transformer, data: Data, cfg: TrainConfig,
             autocast: Callable[[], AbstractContextManager], *,
             figure: bool = False) -> ValidationReport:
    """Loss/perplexity on every validation set of `data` and BLEU/chrF of greedy
    translations, under the run's `autocast`; a few sample translations and, with `figure`,
    the encoder-decoder attention of the first validation sentence."""
    start = time.perf_counter()
    sets = {}
    # Validation is random-free, but fork anyway so it can never shift dropout masks.
    devices = [model.device] if model.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices), autocast(), eval_mode(model):
        for name, corpus in data.valid_sets.items():
            sets[name], hyps = _validate_set(model, data, cfg, name, corpus)
            if len(sets) == 1:  # the first set's samples and figure
                srcs, refs = corpus.src_text[:len(hyps)], corpus.tgt_text[:len(hyps)]
                k = cfg.trainer.num_samples
                samples = list(zip(srcs[:k], refs[:k], hyps[:k], strict=True))
                drawn = (encoder_decoder_figure(model, data.tokenizers, srcs[0], refs[0])
                         if figure and hyps and not corpus.src_prefix
                         else None)  # one fixed sentence
    metrics = ValidationMetrics.mean(sets)
    metrics.seconds = time.perf_counter() - start
    release_cache_buffers()  # the decoding caches' memory is not kept while training
    return ValidationReport(metrics, samples, drawn)


def _validate_set(model: Transformer, data: Data, cfg: TrainConfig, name: str,
                  corpus) -> tuple[ValidationMetrics, list[str]]:
    """One validation set's metrics and greedy translations."""
    start = time.perf_counter()
    losses = evaluate_loss(model, (corpus.collate(idx).to(model.device)
                                   for idx in data.eval_batches("valid", name=name)),
                           cfg.optim.label_smoothing)
    hyps = _translate(model, data, cfg, corpus)
    refs = corpus.tgt_text[:len(hyps)]
    return ValidationMetrics(losses.loss, losses.nll,
                             sacrebleu.corpus_bleu(  # tokenized data: scored as is
                                 hyps, [refs], tokenize="none" if cfg.data.tokenized
                                 else "13a").score,
                             sacrebleu.corpus_chrf(hyps, [refs]).score,
                             time.perf_counter() - start), hyps


def _translate(model: Transformer, data: Data, cfg: TrainConfig, corpus) -> list[str]:
    """Greedy translations of the first `trainer.bleu_max_sentences` sentences of a
    validation set, detokenized, in file order (the set's tags in front of each source).
    Batches of `trainer.decode_max_tokens` source tokens; by default the training batch's
    `data.max_tokens` shared by the batches searched at once (one per CPU thread): each
    search holds its decoding caches, so that validation holds no more than one batch of
    training's size would, whatever the threads."""
    t = cfg.trainer
    n = min(len(corpus), t.bleu_max_sentences or len(corpus))
    sources = [corpus.pair(i)[0] + [model.config.eos_id] for i in range(n)]
    request = replace(DecodingRequest(), beam_size=1, max_len_a=t.decode_max_len_a,
                      max_len_b=t.decode_max_len_b)  # greedy, as the trainer config says
    max_tokens = t.decode_max_tokens or max(
        1, cfg.data.max_tokens // parallel_searches(model.device))
    hyps = search_corpus(model, sources, request, max_tokens=max_tokens)
    return [data.tokenizers.tgt.decode(h[0].tokens) for h in hyps]
