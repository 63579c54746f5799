"""The encoder-decoder Transformer of "Attention Is All You Need" (Vaswani et al., 2017).

    src ids -> embedding * sqrt(d) + positions -> EncoderBlock x N -> enc_outputs
    tgt ids -> embedding * sqrt(d) + positions -> DecoderBlock x N (attending to enc_outputs)
            -> output projection (tied to the embedding, optional bias) -> logits

The model is built from a `ModelConfig`, which travels with the weights in checkpoints
(`config.to_dict()` / `ModelConfig.from_dict`), so a saved model can be rebuilt without the
training configuration. That includes attention heads removed by `Transformer.prune_heads`
(`ModelConfig.pruned_heads`, as HuggingFace's `pruned_heads`).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, field, fields, replace
from typing import Any

import torch
from torch import Tensor, nn

from ..data.tokenizer import BOS_ID, EOS_ID, PAD_ID
from ..errors import ConfigError
from .blocks import FFN_ACTIVATIONS, DecoderBlock, EncoderBlock, LayerCache
from .layers import Dropout, Linear
from .masks import key_padding_mask

__all__ = ["Hyperparameters", "ModelConfig", "PositionalEncoding", "TransformerEncoder",
           "TransformerDecoder", "Transformer", "eval_mode"]


@dataclass
class Hyperparameters:
    """The architecture, as a `model` preset chooses it (configs/model/*.yaml); the defaults
    are the paper's base model. `ModelConfig` adds what the data decides."""

    num_hiddens: int = 512
    """The model dimension: the width of the embeddings and of every block's input and
    output."""
    ffn_num_hiddens: int = 2048
    """The inner width of each block's position-wise feed-forward network."""
    num_heads: int = 8
    """Attention heads per attention layer; must divide num_hiddens."""
    num_encoder_layers: int = 6
    """Encoder blocks."""
    num_decoder_layers: int = 6
    """Decoder blocks."""
    dropout: float = 0.1
    """Dropout on the embeddings (with their positions) and on each sublayer's output before
    its residual connection."""
    attention_dropout: float = 0.0
    """Dropout on the attention weights; > 0 disables PyTorch's fused attention kernel on
    CPU."""
    norm_first: bool = False
    """False: post-norm (the paper's and the book's); true: pre-norm (LayerNorm before each
    sublayer)."""
    tie_output: bool = True
    """The output projection is the target embedding matrix."""
    max_positions: int = 1024
    """The longest sequence the sinusoidal position table covers (data.max_len must not
    exceed it)."""
    activation: str = "relu"
    """The feed-forward network's activation: relu (the paper's), gelu, or swish
    (OPUS-MT's)."""
    output_bias: bool = False
    """A bias on the output projection (Marian's final_logits_bias)."""


@dataclass
class ModelConfig(Hyperparameters):
    """Everything needed to build a `Transformer`: the architecture plus the vocabulary
    sizes and embedding sharing that come from the tokenizer, and any pruned heads."""

    src_vocab_size: int = 8000
    tgt_vocab_size: int = 8000
    share_embeddings: bool = True  # one matrix for source, target and output (joint vocab)
    # The tokenizer's ids with a role in the model and the search (`tokenizer.SpecialIds`).
    pad_id: int = PAD_ID  # its embedding row stays zero and untrained
    start_id: int = BOS_ID  # the decoder's first input (Marian models: pad_id)
    eos_id: int = EOS_ID
    # Heads removed after training: attention module name (see `attention_names`) ->
    # sorted original head indices. Written to checkpoints only when not empty.
    pruned_heads: dict[str, list[int]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        """Raise ConfigError naming the first bad field (`model.<field>`)."""
        for name in ("src_vocab_size", "tgt_vocab_size", "num_hiddens", "ffn_num_hiddens",
                     "num_heads", "num_encoder_layers", "num_decoder_layers", "max_positions"):
            value = getattr(self, name)
            if not _is_int(value) or value <= 0:
                raise ConfigError(f"model.{name} must be a positive integer, got {value!r}")
        for name in ("dropout", "attention_dropout"):
            value = getattr(self, name)
            if not 0.0 <= value < 1.0:
                raise ConfigError(f"model.{name} must be in [0, 1), got {value!r}")
        if self.num_hiddens % self.num_heads != 0:
            raise ConfigError(f"model.num_heads ({self.num_heads}) must divide "
                             f"model.num_hiddens ({self.num_hiddens})")
        if self.share_embeddings and self.src_vocab_size != self.tgt_vocab_size:
            raise ConfigError(
                "model.share_embeddings needs one joint vocabulary, but src_vocab_size="
                f"{self.src_vocab_size} != tgt_vocab_size={self.tgt_vocab_size}")
        for name in ("pad_id", "start_id", "eos_id"):
            value = getattr(self, name)
            if not _is_int(value) or not 0 <= value < min(self.src_vocab_size,
                                                          self.tgt_vocab_size):
                raise ConfigError(f"model.{name} must be a valid token id, got {value!r}")
        if self.activation not in FFN_ACTIVATIONS:
            raise ConfigError(f"model.activation must be one of {', '.join(FFN_ACTIVATIONS)}, "
                              f"got {self.activation!r}")
        if not isinstance(self.output_bias, bool):
            raise ConfigError(f"model.output_bias must be true or false, got "
                              f"{self.output_bias!r}")
        self._validate_pruned_heads()

    def _validate_pruned_heads(self) -> None:
        if not isinstance(self.pruned_heads, dict):
            raise ConfigError(f"model.pruned_heads must be a dict, got {self.pruned_heads!r}")
        names = self.attention_names()
        for name, heads in self.pruned_heads.items():
            if name not in names:
                raise ConfigError(f"model.pruned_heads: {name!r} is not an attention module "
                                 f"of this model (e.g. {names[0]!r})")
            if (not isinstance(heads, list) or not heads
                    or not all(isinstance(h, int) and not isinstance(h, bool) for h in heads)
                    or heads != sorted(set(heads)) or not 0 <= heads[0] <= heads[-1]
                    < self.num_heads):
                raise ConfigError(f"model.pruned_heads[{name!r}] must be a sorted list of "
                                 f"distinct head indices in [0, {self.num_heads}), got {heads!r}")
            if len(heads) == self.num_heads:
                raise ConfigError(f"model.pruned_heads[{name!r}] removes every head; at "
                                 "least one must remain")

    def attention_names(self) -> list[str]:
        """The MultiHeadAttention modules' names (as in `named_modules()`): encoder
        self-attention, decoder self-attention, then encoder-decoder attention, by layer."""
        return ([f"encoder.blks.{i}.attention" for i in range(self.num_encoder_layers)]
                + [f"decoder.blks.{i}.attention1" for i in range(self.num_decoder_layers)]
                + [f"decoder.blks.{i}.attention2" for i in range(self.num_decoder_layers)])

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not self.pruned_heads:  # unpruned checkpoints stay as before the field existed
            del d["pruned_heads"]
        return d

    @classmethod
    def normalized(cls, d: dict[str, Any]) -> dict[str, Any]:
        """`d` as this version writes it (fields it lacks get their defaults), for
        comparing a stored config with a new one."""
        return cls.from_dict(d).to_dict()

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelConfig:
        """Rebuild from `to_dict()`; unknown keys are an error, not silently dropped."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ConfigError(f"unknown model config keys: {unknown}")
        return cls(**d)


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class PositionalEncoding(nn.Module):
    """Sinusoidal positions added to the embeddings, then dropout (the book's version)."""

    def __init__(self, num_hiddens: int, dropout: float, max_len: int = 1024):
        super().__init__()
        self.dropout = Dropout(dropout)
        position = torch.arange(max_len, dtype=torch.float32)[:, None]  # (max_len, 1)
        div = torch.pow(10000, torch.arange(0, num_hiddens, 2, dtype=torch.float32) / num_hiddens)
        P = torch.zeros(1, max_len, num_hiddens)
        P[0, :, 0::2] = torch.sin(position / div)
        P[0, :, 1::2] = torch.cos(position / div[: num_hiddens // 2])
        self.register_buffer("P", P, persistent=False)  # derived, so not in the state dict

    def forward(self, X: Tensor, offset: int = 0) -> Tensor:
        """X (batch, seq, num_hiddens); positions start at `offset` (cached decoding)."""
        end = offset + X.shape[1]
        if end > self.P.shape[1]:
            raise ValueError(f"sequence of {end} positions exceeds model.max_positions="
                             f"{self.P.shape[1]}")
        return self.dropout(X + self.P[:, offset:end].to(X.dtype))


class TransformerEncoder(nn.Module):
    """Embedding and positions, then a stack of `EncoderBlock`s."""

    def __init__(self, config: ModelConfig, embedding: nn.Embedding):
        super().__init__()
        c = config
        self.num_hiddens = c.num_hiddens
        self.embedding = embedding
        self.pos_encoding = PositionalEncoding(c.num_hiddens, c.dropout, c.max_positions)
        self.blks = nn.ModuleList(
            EncoderBlock(c.num_hiddens, c.ffn_num_hiddens, c.num_heads, c.dropout,
                         c.attention_dropout, c.norm_first, c.activation)
            for _ in range(c.num_encoder_layers))
        # Pre-norm leaves the residual stream unnormalized: normalize it once at the end.
        self.final_ln = nn.LayerNorm(c.num_hiddens) if c.norm_first else nn.Identity()

    def forward(self, src: Tensor, valid_lens: Tensor | None) -> Tensor:
        """src (batch, src_len) ids -> (batch, src_len, num_hiddens)."""
        X = self.pos_encoding(self.embedding(src) * math.sqrt(self.num_hiddens))
        key_mask = None if valid_lens is None else key_padding_mask(valid_lens, src.shape[1])
        for blk in self.blks:  # the (batch, src_len) padding mask is built once, above
            X = blk(X, key_mask=key_mask)
        return self.final_ln(X)


class TransformerDecoder(nn.Module):
    """Embedding and positions, then a stack of `DecoderBlock`s (no output projection)."""

    def __init__(self, config: ModelConfig, embedding: nn.Embedding):
        super().__init__()
        c = config
        self.num_hiddens = c.num_hiddens
        self.embedding = embedding
        self.pos_encoding = PositionalEncoding(c.num_hiddens, c.dropout, c.max_positions)
        self.blks = nn.ModuleList(
            DecoderBlock(c.num_hiddens, c.ffn_num_hiddens, c.num_heads, c.dropout,
                         c.attention_dropout, c.norm_first, c.activation)
            for _ in range(c.num_decoder_layers))
        self.final_ln = nn.LayerNorm(c.num_hiddens) if c.norm_first else nn.Identity()

    def forward(self, tgt: Tensor, enc_outputs: Tensor, enc_valid_lens: Tensor | None,
                cache: list[LayerCache] | None = None) -> Tensor:
        """tgt (batch, tgt_len) ids -> (batch, tgt_len, num_hiddens).

        With `cache` (one `LayerCache` per block), `tgt` holds only the new steps.
        """
        offset = cache[0].self_attention.length if cache is not None else 0
        X = self.pos_encoding(self.embedding(tgt) * math.sqrt(self.num_hiddens), offset)
        key_mask = (None if enc_valid_lens is None else
                    key_padding_mask(enc_valid_lens, enc_outputs.shape[1]))  # (batch, src_len)
        for i, blk in enumerate(self.blks):
            X = blk(X, enc_outputs, cache=cache[i] if cache is not None else None,
                    enc_key_mask=key_mask)
        return self.final_ln(X)


class Transformer(nn.Module):
    """The sequence-to-sequence Transformer."""

    def __init__(self, config: ModelConfig):
        super().__init__()
        config.validate()
        self.config = c = config
        src_embedding = nn.Embedding(c.src_vocab_size, c.num_hiddens, padding_idx=c.pad_id)
        tgt_embedding = (src_embedding if c.share_embeddings else
                         nn.Embedding(c.tgt_vocab_size, c.num_hiddens, padding_idx=c.pad_id))
        self.encoder = TransformerEncoder(c, src_embedding)
        self.decoder = TransformerDecoder(c, tgt_embedding)
        for name, heads in c.pruned_heads.items():
            self.get_submodule(name).prune_heads(heads)
        self.output_projection = Linear(c.num_hiddens, c.tgt_vocab_size, bias=c.output_bias)
        self.reset_parameters()
        if c.tie_output:
            self.output_projection.weight = tgt_embedding.weight

    def reset_parameters(self) -> None:
        """Xavier-uniform linear layers (as the paper's code), N(0, d^-1/2) embeddings."""
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.xavier_uniform_(module.weight)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)
            elif isinstance(module, nn.Embedding):
                # With the sqrt(d) scale the embedded tokens have unit variance.
                nn.init.normal_(module.weight, std=self.config.num_hiddens ** -0.5)
                with torch.no_grad():
                    module.weight[self.config.pad_id].zero_()

    def prune_heads(self, heads: dict[str, Iterable[int]]) -> None:
        """Remove attention heads for good: {module name: original head indices}, e.g.
        {"decoder.blks.0.attention2": [1, 3]}. `config.pruned_heads` records them, so a
        checkpoint of the pruned model rebuilds its smaller shapes by itself."""
        pruned = {name: set(hs) for name, hs in self.config.pruned_heads.items()}
        for name, hs in heads.items():
            pruned[name] = pruned.get(name, set()) | {int(h) for h in hs}
        order = {name: i for i, name in enumerate(self.config.attention_names())}
        names = sorted((n for n in pruned if pruned[n]), key=lambda n: order.get(n, -1))
        # replace() validates (names, indices, a head left per layer) before anything changes.
        config = replace(self.config, pruned_heads={n: sorted(pruned[n]) for n in names})
        for name, hs in heads.items():
            self.get_submodule(name).prune_heads(hs)
        self.config = config

    @property
    def device(self) -> torch.device:
        """Where the model's parameters are (read from the target embedding, which stays a
        float tensor where the linear layers are quantized, `int8.quantize_int8`)."""
        return self.decoder.embedding.weight.device

    def num_parameters(self) -> int:
        """Parameters, trainable or frozen (a loaded translator's); a matrix shared by
        several layers counts once."""
        return sum(p.numel() for p in self.parameters())

    def forward(self, src: Tensor, src_valid_lens: Tensor, tgt_in: Tensor, *,
                output_mask: Tensor | None = None) -> Tensor:
        """src (batch, src_len), src_valid_lens (batch,), tgt_in (batch, tgt_len) -> logits.

        Logits are (batch, tgt_len, tgt_vocab_size); with `output_mask` (batch, tgt_len) bool
        they are (num_true, tgt_vocab_size) for the selected positions only, which saves the
        output projection's work on padding (validation loss, head importance; training
        fuses the projection into its loss instead, see `hidden_states`).
        """
        hidden = self.hidden_states(src, src_valid_lens, tgt_in)  # (batch, tgt_len, d)
        if output_mask is not None:
            hidden = hidden[output_mask]  # (num_true, d)
        return self.output_projection(hidden)

    def hidden_states(self, src: Tensor, src_valid_lens: Tensor, tgt_in: Tensor) -> Tensor:
        """The decoder's last states, the output projection's input: (batch, tgt_len, d).
        Training feeds them to `layers.linear_label_smoothed_cross_entropy` with the projection's
        weight, which never materializes the logits."""
        return self.decoder(tgt_in, self.encode(src, src_valid_lens), src_valid_lens)

    def encode(self, src: Tensor, src_valid_lens: Tensor) -> Tensor:
        """(batch, src_len) ids -> encoder outputs (batch, src_len, num_hiddens)."""
        return self.encoder(src, src_valid_lens)

    def new_cache(self) -> list[LayerCache]:
        """An empty key/value cache for `decode_step`, one entry per decoder block."""
        return [LayerCache() for _ in self.decoder.blks]

    def decode_step(self, tokens: Tensor, enc_outputs: Tensor, src_valid_lens: Tensor,
                    cache: list[LayerCache]) -> Tensor:
        """Feed the newest target tokens (batch, steps) -> logits (batch, steps, vocab).

        Earlier steps come from `cache`, which this call extends; encoder keys/values are
        projected on the first call only.
        """
        hidden = self.decoder(tokens, enc_outputs, src_valid_lens, cache)
        return self.output_projection(hidden)


@contextlib.contextmanager
def eval_mode(model: nn.Module) -> Iterator[None]:
    """Run the block in eval mode (no dropout), then restore the caller's mode, also when
    the block raises."""
    if not any(module.training for module in model.modules()):
        yield  # in eval mode already: switching costs a walk over every module, per batch
        return
    was_training = model.training
    model.eval()
    try:
        yield
    finally:
        model.train(was_training)
