"""Attention's masks, True = may attend: from the book's `valid_lens` (`valid_lens_mask`),
the padding of a batch of sentences (`key_padding_mask`, built once per forward pass and
handed to every layer), and every kind together with the causal mask (`attention_mask`).
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["valid_lens_mask", "key_padding_mask", "attention_mask"]


def valid_lens_mask(valid_lens: Tensor, num_queries: int, num_keys: int) -> Tensor:
    """Boolean mask (batch, num_queries or 1, num_keys) from 1-D or 2-D `valid_lens`."""
    keys = torch.arange(num_keys, device=valid_lens.device)
    if valid_lens.dim() == 1:  # (batch,): the same length for every query
        return keys[None, None, :] < valid_lens[:, None, None]
    if valid_lens.dim() == 2:  # (batch, queries): one length per query
        if valid_lens.shape[1] != num_queries:
            raise ValueError(
                f"2-D valid_lens must have shape (batch, {num_queries}), "
                f"got {tuple(valid_lens.shape)}"
            )
        return keys[None, None, :] < valid_lens[:, :, None]
    raise ValueError(f"valid_lens must be 1-D or 2-D, got shape {tuple(valid_lens.shape)}")


def key_padding_mask(valid_lens: Tensor, num_keys: int) -> Tensor:
    """(batch, num_keys) bool from `valid_lens` (batch,): True for the first valid_lens[i]
    keys of row i (real tokens), False for padding. A model builds it once per forward pass
    and hands it to every layer as `key_mask`."""
    return valid_lens_mask(valid_lens, 1, num_keys)[:, 0]


def attention_mask(
    batch_size: int,
    num_queries: int,
    num_keys: int,
    *,
    valid_lens: Tensor | None = None,
    key_mask: Tensor | None = None,
    causal: bool = False,
    device: torch.device | None = None,
) -> Tensor | None:
    """Combine every kind of mask into one boolean mask, True = may attend.

    Returns None when nothing is masked, else a tensor broadcastable to
    (batch, num_heads, num_queries, num_keys) of shape (batch or 1, 1, queries or 1, keys).
    With `causal`, query i sees keys <= i + (num_keys - num_queries): the queries are the
    last `num_queries` positions of the key sequence (as when a cache holds the past).
    """
    if valid_lens is not None and key_mask is not None:
        raise ValueError("pass either valid_lens or key_mask, not both")
    mask = None
    if valid_lens is not None:
        mask = valid_lens_mask(valid_lens, num_queries, num_keys)  # (batch, q or 1, keys)
    elif key_mask is not None:
        if key_mask.shape != (batch_size, num_keys):
            raise ValueError(
                f"key_mask must have shape (batch, keys) = {(batch_size, num_keys)}, "
                f"got {tuple(key_mask.shape)}"
            )
        mask = key_mask.bool()[:, None, :]  # (batch, 1, keys)
    if causal and num_queries > 1:  # a single (newest) query may see every key
        q = torch.arange(num_queries, device=device)[:, None] + (num_keys - num_queries)
        future = torch.arange(num_keys, device=device)[None, :] <= q  # (queries, keys)
        mask = future[None] if mask is None else mask & future
    return None if mask is None else mask.unsqueeze(1)  # insert the heads axis
