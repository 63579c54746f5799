"""The Transformer's layers: AddNorm, PositionWiseFFN, EncoderBlock, DecoderBlock.

Post-norm (`LayerNorm(X + Sublayer(X))`, the paper and the book) is the default; pre-norm
(`X + Sublayer(LayerNorm(X))`) trains deeper stacks stably and is an option.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from torch import Tensor, nn

from .attention import MultiHeadAttention
from .cache import KVCache
from .layers import Dropout, Linear

__all__ = ["FFN_ACTIVATIONS", "PositionWiseFFN", "AddNorm", "EncoderBlock", "DecoderBlock",
           "LayerCache"]


# The FFN's activation by name: ReLU (the paper), GELU (exact, erf), swish = SiLU
# (x * sigmoid(x), OPUS-MT's); the names Hugging Face's `activation_function` uses.
FFN_ACTIVATIONS: dict[str, type[nn.Module]] = {"relu": nn.ReLU, "gelu": nn.GELU,
                                               "swish": nn.SiLU}


class PositionWiseFFN(nn.Module):
    """The same two-layer MLP applied at every position: dense2(activation(dense1(X)))."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, activation: str = "relu"):
        super().__init__()
        self.dense1 = Linear(num_hiddens, ffn_num_hiddens)
        self.activation = FFN_ACTIVATIONS[activation]()
        self.dense2 = Linear(ffn_num_hiddens, num_hiddens)

    def forward(self, X: Tensor) -> Tensor:
        return self.dense2(self.activation(self.dense1(X)))


class AddNorm(nn.Module):
    """Residual connection with dropout, then layer normalization (the book's AddNorm)."""

    def __init__(self, num_hiddens: int, dropout: float, norm_first: bool = False):
        super().__init__()
        self.dropout = Dropout(dropout)
        self.ln = nn.LayerNorm(num_hiddens)
        self.norm_first = norm_first

    def forward(self, X: Tensor, Y: Tensor) -> Tensor:
        """The book's post-norm form: LayerNorm(X + dropout(Y))."""
        return self.ln(self.dropout(Y) + X)

    def residual(self, X: Tensor, sublayer: Callable[[Tensor], Tensor]) -> Tensor:
        """Wrap `sublayer` in this residual connection, post-norm or pre-norm."""
        if self.norm_first:
            return X + self.dropout(sublayer(self.ln(X)))
        return self(X, sublayer(X))


def _attention(num_hiddens: int, num_heads: int, attention_dropout: float) -> MultiHeadAttention:
    # Biases on, as in the paper and torch.nn.Transformer (the book's default is off).
    return MultiHeadAttention(num_hiddens, num_hiddens, num_hiddens, num_hiddens, num_heads,
                              attention_dropout, bias=True)


class EncoderBlock(nn.Module):
    """Self-attention over the source, then the position-wise FFN."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
                 dropout: float, attention_dropout: float = 0.0, norm_first: bool = False,
                 activation: str = "relu"):
        super().__init__()
        self.attention = _attention(num_hiddens, num_heads, attention_dropout)
        self.addnorm1 = AddNorm(num_hiddens, dropout, norm_first)
        self.ffn = PositionWiseFFN(num_hiddens, ffn_num_hiddens, activation)
        self.addnorm2 = AddNorm(num_hiddens, dropout, norm_first)

    def forward(self, X: Tensor, valid_lens: Tensor | None = None, *,
                key_mask: Tensor | None = None) -> Tensor:
        """X (batch, src_len, num_hiddens) -> same shape. The padding: valid_lens (batch,),
        or key_mask (batch, src_len) bool, True = a real token (the encoder builds it once
        for all its blocks, `masks.key_padding_mask`)."""
        Y = self.addnorm1.residual(
            X, lambda x: self.attention(x, x, x, valid_lens, key_mask=key_mask))
        return self.addnorm2.residual(Y, self.ffn)


@dataclass
class LayerCache:
    """One decoder block's cache: its self-attention grows, its cross-attention is fixed."""

    self_attention: KVCache = field(default_factory=KVCache)
    cross_attention: KVCache = field(default_factory=lambda: KVCache(static=True))

    def reorder(self, index: Tensor) -> None:
        """Select batch rows in place (beam search keeps the surviving hypotheses)."""
        self.self_attention.reorder(index)
        self.cross_attention.reorder(index)

    def release(self) -> None:
        """Empty both caches, their buffers given back for the next cache (`KVCache.release`)."""
        self.self_attention.release()
        self.cross_attention.release()


class DecoderBlock(nn.Module):
    """Causal self-attention, encoder-decoder attention, then the position-wise FFN."""

    def __init__(self, num_hiddens: int, ffn_num_hiddens: int, num_heads: int,
                 dropout: float, attention_dropout: float = 0.0, norm_first: bool = False,
                 activation: str = "relu"):
        super().__init__()
        self.attention1 = _attention(num_hiddens, num_heads, attention_dropout)
        self.addnorm1 = AddNorm(num_hiddens, dropout, norm_first)
        self.attention2 = _attention(num_hiddens, num_heads, attention_dropout)
        self.addnorm2 = AddNorm(num_hiddens, dropout, norm_first)
        self.ffn = PositionWiseFFN(num_hiddens, ffn_num_hiddens, activation)
        self.addnorm3 = AddNorm(num_hiddens, dropout, norm_first)

    def forward(self, X: Tensor, enc_outputs: Tensor, enc_valid_lens: Tensor | None = None,
                cache: LayerCache | None = None, *,
                enc_key_mask: Tensor | None = None) -> Tensor:
        """X (rows, tgt_len, num_hiddens), enc_outputs (batch, src_len, num_hiddens). The
        source's padding: enc_valid_lens (batch,), or enc_key_mask (batch, src_len) bool,
        True = a real token (the decoder builds it once for all its blocks).

        X may hold several rows per source sentence, sentence after sentence (beam search's
        hypotheses: rows = batch x beams): then each group of rows reads its sentence's
        encoder output, which is stored (and its keys/values projected) once per sentence.
        With `cache`, X holds only the new steps; earlier steps come from the cache.
        """
        self_cache = cache.self_attention if cache is not None else None
        cross_cache = cache.cross_attention if cache is not None else None
        Y = self.addnorm1.residual(
            X, lambda x: self.attention1(x, x, x, causal=True, cache=self_cache))
        Z = self.addnorm2.residual(
            Y, lambda y: self._cross_attention(y, enc_outputs, enc_valid_lens, enc_key_mask,
                                               cross_cache))
        return self.addnorm3.residual(Z, self.ffn)

    def _cross_attention(self, Y: Tensor, enc_outputs: Tensor, enc_valid_lens: Tensor | None,
                         enc_key_mask: Tensor | None, cache: KVCache | None) -> Tensor:
        """Encoder-decoder attention; a sentence's rows are read as one row of more queries."""
        rows, steps, d = Y.shape
        queries = Y.reshape(enc_outputs.shape[0], -1, d)  # (batch, rows / batch * steps, d)
        out = self.attention2(queries, enc_outputs, enc_outputs, enc_valid_lens,
                              key_mask=enc_key_mask, cache=cache)
        return out.reshape(rows, steps, d)
