"""Remove the least important attention heads of a model for good.

    transformer prune-heads --checkpoint RUN_DIR_OR_PT --fraction 0.3 --output PRUNED.pt
        [--data valid|test] [--data-root DIR | --src FILE --ref FILE]
        [--max-sentences N] [--no-normalize] [--device auto] [--threads N]

Criterion: gradient importance (Michel, Levy & Neubig, 2019), the expected absolute gradient
of the loss w.r.t. a gate on each head, measured on the given data (validation by default);
each layer's scores are divided by their L2 norm (unless --no-normalize), and the
round(fraction x all heads) lowest-scoring heads go, keeping at least one head per layer.
Their rows of W_q, W_k, W_v and columns of W_o are deleted; the new checkpoint records the
pruned heads in its model config, so it loads and translates like any other
(`transformer translate`). It keeps the tokenizer, the training config and the decoding
settings (e.g. those chosen by `transformer tune-decoding`), not the optimizer.
`python scripts/prune_heads.py` is the same command.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

from ..errors import ConfigError
from ..run.checkpoint import inference_checkpoint, save_checkpoint
from ..tools.heads import gradient_importance, heads_to_prune, teacher_forced_batches
from . import command_parser, report_errors
from .options import add_evaluation_options, check_counts, load_for_evaluation


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__doc__)
    p.add_argument("--checkpoint", required=True, metavar="RUN_DIR_OR_PT",
                   help="checkpoint file or run directory (its best checkpoint)")
    p.add_argument("--fraction", type=float, required=True,
                   help="fraction of all heads to remove, in [0, 1)")
    p.add_argument("--output", type=Path, required=True, help="the pruned checkpoint (.pt)")
    p.add_argument("--no-normalize", action="store_true",
                   help="rank raw importance scores, not scores divided by their layer's norm")
    add_evaluation_options(p)
    return p


def run(args: argparse.Namespace) -> None:
    check_counts(args)
    if not 0.0 <= args.fraction < 1.0:
        raise ConfigError(f"--fraction must be in [0, 1), got {args.fraction}")
    evaluation = load_for_evaluation(args)
    translator, text = evaluation.translator, evaluation.text
    model = translator.model
    batches = teacher_forced_batches(translator.tokenizers, text.src, text.tgt,
                                     translator.device, args.max_tokens)
    importance = gradient_importance(model, batches).importance
    heads = heads_to_prune(model, importance, args.fraction, normalize=not args.no_normalize)
    before = model.num_parameters()
    model.prune_heads(heads)
    for name in model.config.attention_names():
        if name in heads:
            print(f"{name}: pruned heads {heads[name]}")
    print(f"pruned {sum(map(len, heads.values()))} heads (importance from {len(text)} "
          f"sentences); parameters {before:,} -> {model.num_parameters():,}")
    save_checkpoint(inference_checkpoint(
        model, translator.tokenizers, training_config=translator.training_config,
        decoding=translator.decoding, run_id=translator.run_id,
        head_importance={k: v.tolist() for k, v in importance.items()},
        pruned_from=str(args.checkpoint)), args.output)
    print(f"wrote {args.output}")


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return report_errors(lambda: run(args))
