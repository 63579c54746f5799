"""The engine's decoding step: one new token per row through the decoder, in few operators.

Beam search and sampling feed the decoder one token per row and step. The decoder's
`forward` with a cache (`blocks.LayerCache`) computes that step as the book writes the
model, in some 440 PyTorch operators for four blocks, and at a few rows (one sentence's
beams) the operators' fixed costs are most of a step's time. `DecoderState` computes the
same, bit for bit (the tests compare the two), in fewer:

- the rows are 2-D, (rows, num_hiddens): no views around each product;
- a self-attention layer's keys and values share one cache (`cache.StepCache`), its
  buffers sized for the whole search: one gather of the rows beam search kept and one copy
  of the new step, for keys and values together, into the buffer the layer before just
  freed (`cache.SpareBuffer`: L + 1 buffers for L layers);
- the encoder-decoder keys and values are projected once, when the search starts, and the
  source's padding mask is made once (None where no source is padded);
- a step's embeddings are the embedding's rows gathered along its contiguous axis (a tied
  weight stored transposed, `layers.transpose_linear_weights`, holds a row's values a
  vocabulary apart), scaled and given their position's row, without the modules' calls;
- W_q, W_k and W_v of self-attention are one product where all three are float `Linear`s
  (their weights joined when the search starts);
- each layer is called through its `forward`, without `nn.Module`'s call machinery; a float
  product MKL takes is the `addmm` `F.linear` makes of 2-D rows, called directly.

A decoder with hooks (`MultiHeadAttention.masking_heads`, `recording`, a user's forward
hooks) decodes through its `forward` and `LayerCache`s instead, where the hooks run.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from torch import Tensor, nn

from . import kernels
from .attention import MultiHeadAttention, _split_heads
from .blocks import DecoderBlock, LayerCache
from .cache import SpareBuffer, StepCache
from .int8 import joined_int8
from .layers import Linear, linear, may_take_onednn
from .masks import key_padding_mask
from .transformer import PositionalEncoding

if TYPE_CHECKING:
    from .transformer import TransformerDecoder

__all__ = ["DecoderState"]


def _has_hooks(decoder: nn.Module) -> bool:
    """Whether calling a module of `decoder` would run forward hooks besides its `forward`
    (its own or global ones: the test `nn.Module.__call__` makes), or one of its attention
    layers is keeping its weights (`MultiHeadAttention.recording`)."""
    hooks = torch.nn.modules.module
    if hooks._global_forward_hooks or hooks._global_forward_pre_hooks:
        return True
    return any(module._forward_hooks or module._forward_pre_hooks
               or (isinstance(module, MultiHeadAttention) and module.is_recording)
               for module in decoder.modules())


def _joined_qkv(attention: MultiHeadAttention) -> Callable[[Tensor], Tensor] | None:
    """One product for W_q, W_k and W_v (rows, d) -> (rows, 3 * inner), their weights
    joined; None unless all three are float `Linear`s with biases alike, or int8 layers
    that `int8.joined_int8` joins."""
    layers = (attention.W_q, attention.W_k, attention.W_v)
    int8 = joined_int8(layers)
    if int8 is not None:
        return int8.forward
    if not all(type(layer) is Linear for layer in layers) or len(
            {layer.bias is None for layer in layers}) > 1:
        return None
    return _bound_linear(_joined(*(layer.weight for layer in layers)),
                         None if layers[0].bias is None
                         else torch.cat([layer.bias for layer in layers]))


def _joined(*weights: Tensor) -> Tensor:
    """Weights (out_i, in) -> (sum out_i, in), in the layout of the first: stored
    transposed (`layers.transpose_linear_weights`), the joined one is too, so the product
    takes the same kernel as the separate ones."""
    if weights[0].t().is_contiguous() and not weights[0].is_contiguous():
        return torch.cat([weight.t() for weight in weights], dim=1).t()
    return torch.cat(weights)


def _bound_linear(weight: Tensor, bias: Tensor | None) -> Callable[[Tensor], Tensor]:
    """`layers.linear` for the step's rows X (rows, in) with its parameters bound: where
    `linear` takes `F.linear` for any input (`may_take_onednn`), the product `F.linear`
    makes of 2-D rows itself (`addmm` with the bias, else `mm`, by the weight's transpose,
    taken once), without `linear`'s tests or `F.linear`'s dispatch at every call."""
    if not may_take_onednn(weight):
        weight_t = weight.t()  # (in, out)
        if bias is None:
            return lambda X: torch.mm(X, weight_t)
        return lambda X: torch.addmm(bias, X, weight_t)
    return lambda X: linear(X, weight, bias)


def _direct(module: nn.Module) -> Callable[[Tensor], Tensor]:
    """What calling `module` computes (no hooks: `_has_hooks`), with the least Python per
    call: a float `Linear`'s product and a `LayerNorm` with their parameters bound (read
    once per search), any other module's own `forward`."""
    if type(module) is Linear:
        return _bound_linear(module.weight, module.bias)
    if type(module) is nn.LayerNorm:  # as `F.layer_norm` calls it
        shape, weight, bias, eps = (module.normalized_shape, module.weight, module.bias,
                                    module.eps)
        return lambda X: torch.layer_norm(X, shape, weight, bias, eps,
                                          torch.backends.cudnn.enabled)
    return module.forward


def _embedding_rows(embedding: nn.Module) -> Callable[[Tensor], Tensor] | None:
    """`embedding(tokens)` for tokens (rows,) -> (rows, d) by one `index_select` along the
    weight's contiguous axis: a weight stored transposed (d, V) gives a strided (rows, d)
    view of the same values. None unless `embedding` is a plain `nn.Embedding` (no
    `max_norm`, which rewrites the weight as it reads it)."""
    if type(embedding) is not nn.Embedding or embedding.max_norm is not None:
        return None
    weight = embedding.weight  # (V, d)
    if weight.t().is_contiguous() and not weight.is_contiguous():
        return lambda tokens: weight.t().index_select(1, tokens).t()  # (d, rows) -> (rows, d)
    return lambda tokens: weight.index_select(0, tokens)


def _step_inputs(decoder: TransformerDecoder) -> Callable[[Tensor, int], Tensor]:
    """What the decoder's embedding and positions give a step: `inputs(tokens, position)`,
    tokens (rows,) -> embedding(tokens) * sqrt(d) + P[position], (rows, d) (the positions'
    dropout is off in decoding). With a plain embedding (`_embedding_rows`) and sinusoidal
    positions: the rows gathered, scaled into a fresh contiguous tensor and the position's
    row added in place, the same operations on the same values as the modules' (one
    position's row, read once per search); else the modules' `forward`s."""
    rows_of, positions = _embedding_rows(decoder.embedding), decoder.pos_encoding
    scale = math.sqrt(decoder.num_hiddens)
    if rows_of is None or type(positions) is not PositionalEncoding:
        return lambda tokens, position: positions.forward(
            decoder.embedding.forward(tokens[:, None]) * scale, position)[:, 0]
    P = positions.P[0].to(decoder.embedding.weight.dtype)  # (max_len, d)

    def inputs(tokens: Tensor, position: int) -> Tensor:
        E = rows_of(tokens)  # (rows, d)
        X = torch.mul(E, scale, out=E.new_empty(E.shape))  # contiguous, whatever E's layout
        if position >= len(P):  # past the model's positions: PositionalEncoding says so
            return positions.forward(X[:, None], position)[:, 0]
        return X.add_(P[position])

    return inputs


def _memory(attention: MultiHeadAttention, enc_outputs: Tensor) -> tuple[Tensor, Tensor]:
    """The keys and values of encoder-decoder attention over `enc_outputs` (batch, src_len,
    d) -> each (batch, heads, src_len, head_dim), contiguous: what its static `KVCache`
    keeps."""
    return tuple(_split_heads(W(enc_outputs), attention.num_heads).contiguous()
                 for W in (attention.W_k, attention.W_v))


class _BlockStep:
    """One `DecoderBlock`'s step over the state of a search: its sublayers' `forward`s."""

    def __init__(self, block: DecoderBlock):
        a1, a2 = block.attention1, block.attention2
        self.heads1, self.dropout1 = a1.num_heads, a1.attention.dropout
        self.heads2, self.dropout2 = a2.num_heads, a2.attention.dropout
        self.qkv = _joined_qkv(a1)
        self.W_q1, self.W_k1, self.W_v1, self.W_o1 = map(_direct, (a1.W_q, a1.W_k, a1.W_v,
                                                                   a1.W_o))
        self.W_q2, self.W_o2 = _direct(a2.W_q), _direct(a2.W_o)
        ffn = block.ffn
        self.dense1, self.activation, self.dense2 = map(_direct, (ffn.dense1, ffn.activation,
                                                                  ffn.dense2))
        self.norm1, self.norm2, self.norm3 = (_direct(addnorm.ln) for addnorm in (
            block.addnorm1, block.addnorm2, block.addnorm3))
        self.norm_first = block.addnorm1.norm_first

    def __call__(self, X: Tensor, cache: StepCache, memory: tuple[Tensor, Tensor],
                 memory_mask: Tensor | None) -> Tensor:
        """X (rows, d) -> (rows, d): what `DecoderBlock.forward` computes for X (rows, 1, d)
        with a cache, dropout off (`AddNorm.residual`, post-norm or pre-norm)."""
        if self.norm_first:
            Y = X + self._self_attention(self.norm1(X), cache)
            Z = Y + self._memory_attention(self.norm2(Y), *memory, memory_mask)
            return Z + self._ffn(self.norm3(Z))
        Y = self.norm1(self._self_attention(X, cache) + X)
        Z = self.norm2(self._memory_attention(Y, *memory, memory_mask) + Y)
        return self.norm3(self._ffn(Z) + Z)

    def _ffn(self, X: Tensor) -> Tensor:
        """The position-wise FFN."""
        return self.dense2(self.activation(self.dense1(X)))

    def _self_attention(self, X: Tensor, cache: StepCache) -> Tensor:
        """Causal self-attention of one new step per row over the cached ones."""
        rows, h = X.shape[0], self.heads1
        if self.qkv is not None:
            qkv = self.qkv(X).view(rows, 3, h, -1)
            q = qkv.select(1, 0)  # (rows, h, head_dim)
            kv = qkv.narrow(1, 1, 2).transpose(0, 1)  # (2, rows, h, head_dim)
        else:
            q = self.W_q1(X).view(rows, h, -1)
            kv = torch.stack([W(X).view(rows, h, -1) for W in (self.W_k1, self.W_v1)])
        keys, values = cache.append(kv)  # each (rows, h, steps, head_dim)
        q = q.unsqueeze(2)  # (rows, h, 1, head_dim)
        output, _ = kernels.attend(q, keys, values, None, self.dropout1)
        return self.W_o1(output.reshape(rows, -1))  # (rows, h * head_dim)

    def _memory_attention(self, Y: Tensor, keys: Tensor, values: Tensor,
                          mask: Tensor | None) -> Tensor:
        """Encoder-decoder attention, a sentence's rows read as one row of queries over its
        keys and values (batch, h, src_len, head_dim), as `DecoderBlock` reads them."""
        rows = Y.shape[0]
        batch, h, _, head_dim = keys.shape
        q = self.W_q2(Y).view(batch, rows // batch, h, head_dim).transpose(1, 2)
        output, _ = kernels.attend(q, keys, values, mask, self.dropout2)
        return self.W_o2(output.transpose(1, 2).reshape(rows, -1))  # (rows, h * head_dim)


class DecoderState:
    """A search's decoder: `state(tokens)` feeds the newest token of each row (rows,) and
    returns the decoder's output after it (rows, num_hiddens), the output projection's
    input; `reorder` keeps beam search's surviving rows and sentences; `release` gives the
    caches' buffers back when the search ends.

    Made when the search starts, over a batch's encoder outputs (batch, src_len,
    num_hiddens) and their `enc_valid_lens`, for at most `max_rows` rows (sentences x beams,
    each sentence's rows one after another) and `max_steps` steps. The decoder must be in
    eval mode and no gradient recorded (decoding).
    """

    def __init__(self, decoder: TransformerDecoder, enc_outputs: Tensor,
                 enc_valid_lens: Tensor | None, max_rows: int, max_steps: int):
        if decoder.training or torch.is_grad_enabled():
            raise RuntimeError("DecoderState decodes: eval mode, without gradients")
        self.decoder = decoder
        self.length = 0  # steps decoded
        self._layer_caches: list[LayerCache] | None = None
        if _has_hooks(decoder):
            # the book's path, where the hooks run: the decoder's forward with its caches
            self._layer_caches = [LayerCache() for _ in decoder.blks]
            self._enc_outputs, self._enc_valid_lens = enc_outputs, enc_valid_lens
            return
        src_len = enc_outputs.shape[1]
        self.memory_mask = None  # (batch, 1, 1, src_len)
        if enc_valid_lens is not None and bool((enc_valid_lens < src_len).any()):
            self.memory_mask = key_padding_mask(enc_valid_lens, src_len)[:, None, None, :]
        self.blocks = [_BlockStep(block) for block in decoder.blks]
        self.spare = SpareBuffer()  # the layers' caches pass one free buffer along
        self.caches = [StepCache(max_rows, max_steps, spare=self.spare)
                       for _ in decoder.blks]
        self.memory = [_memory(block.attention2, enc_outputs) for block in decoder.blks]
        self._inputs, self._final_ln = _step_inputs(decoder), _direct(decoder.final_ln)

    def __call__(self, tokens: Tensor) -> Tensor:
        """The newest token of each row (rows,) -> the decoder's output after it (rows,
        num_hiddens); the caches grow by the step."""
        if self._layer_caches is not None:
            X = self.decoder(tokens[:, None], self._enc_outputs, self._enc_valid_lens,
                             self._layer_caches)[:, 0]
            self.length += 1
            return X
        X = self._inputs(tokens, self.length)  # (rows, num_hiddens)
        for block, cache, memory in zip(self.blocks, self.caches, self.memory, strict=True):
            X = block(X, cache, memory, self.memory_mask)
        self.length += 1
        return self._final_ln(X)

    def reorder(self, rows: Tensor, sentences: Tensor | None = None) -> None:
        """Keep the decoder rows `rows` (beam search's surviving hypotheses, in their new
        order), and where given the sentences `sentences` (those still searched)."""
        if self._layer_caches is not None:
            for layer in self._layer_caches:
                layer.self_attention.reorder(rows)
                if sentences is not None:
                    layer.cross_attention.reorder(sentences)
            if sentences is not None:
                self._enc_outputs = self._enc_outputs.index_select(0, sentences)
                if self._enc_valid_lens is not None:
                    self._enc_valid_lens = self._enc_valid_lens.index_select(0, sentences)
            return
        for cache in self.caches:
            cache.reorder(rows)
        if sentences is not None:
            self.memory = [(k.index_select(0, sentences), v.index_select(0, sentences))
                           for k, v in self.memory]
            if self.memory_mask is not None:
                self.memory_mask = self.memory_mask.index_select(0, sentences)

    def release(self) -> None:
        """Give the caches' buffers back for the next search."""
        for cache in self._layer_caches or self.caches:
            cache.release()
        if self._layer_caches is None:
            self.spare.release()
