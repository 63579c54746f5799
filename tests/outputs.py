"""What tests compare translations by."""

from __future__ import annotations

from transformer.decoding.translator import Translation


def scored(results: list[list[Translation]]) -> list[list[tuple[str, float]]]:
    """`BaseTranslator.translations`' n-best lists as (text, score) pairs, best first."""
    return [[(t.text, t.score) for t in sentence] for sentence in results]
