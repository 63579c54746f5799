"""How does our package compare with Hugging Face `transformers` (MarianMTModel, what OPUS-MT
users run today), training and translating the same OPUS-MT-shaped model?

    python bench/hf.py [--size small|base] [--data-root DIR] [--threads 2] [--max-tokens 4096]
                       [--warmup 1] [--steps 2] [--rounds 4] [--sentences 128] [--beam 5]
                       [--max-len 64] [--decode-max-tokens 2048] [--repeats 3] [--profile]

On the CPU, in one run: a training step (target tokens/s) and beam search (sentences/s), each
ratio against Hugging Face measured in this run.

The model: transformers' `MarianConfig` with random weights (post-norm, swish FFN, scaled
and tied embeddings, `</s>` 0, `<pad>` = vocab - 1 = the decoder's start, 512 positions),
written with `save_pretrained` beside MarianTokenizer's files (SentencePiece models trained
here on Multi30k's English and German, one vocab.json padded with dummy pieces up to the
model's vocabulary), then imported with `transformer.deploy.hf.import_hf`: both sides run the
very same weights (checked: the largest logit difference on one batch is printed).
  base   OPUS-MT's shape: d_model 512, 8 heads, FFN 2048, 6+6 layers, 58,101 pieces (74M
         parameters); on 2 cores a training step takes ~25 s and a beam pass over 128
         sentences over a minute per side, so the defaults would take ~15 minutes:
         `--size base --sentences 32 --steps 1 --rounds 2 --repeats 2` takes ~6
  small  (the default: ~3 minutes on 2 cores) the same ratios at half the width and depth:
         d_model 256, 4 heads, FFN 1024, 3+3 layers, 16,000 pieces (9.6M parameters)

Training step, on the same Multi30k training batches (`batching.train_batches`, --max-tokens
per side, collated by `store.ParallelCorpus`), train mode with dropout 0.1, both at the
learning rate `LR` (5e-4) and the package's default clipping (`optim.clip_norm`: none, the
norm measured):
  ours  what `Trainer.train_step` does without DDP: `loss.LabelSmoothedLoss` (eps 0.1, the
        output projection fused into the loss on non-pad positions) / target tokens,
        backward, `clip_grad_norm_`, `optimizer.build_optimizer` (fused Adam), zero_grad
  HF    `MarianMTModel` with the batch's decoder inputs, `cross_entropy(label_smoothing=0.1,
        ignore_index=-100, reduction="sum")` / target tokens on its logits, backward,
        `clip_grad_norm_`, `torch.optim.AdamW(fused=True, weight_decay=0)`: the optimizer
        `Trainer` uses by default with torch >= 2.8 (`adamw_torch_fused`)
After --warmup steps each, --rounds rounds alternate ours and HF over the same --steps
batches; each side's figure is its best round: real (non-pad) target tokens per second.

Beam search on the first --sentences of test_2016_flickr (en), beam --beam, both in the
same batches (sorted longest first, packed to --decode-max-tokens source tokens, as our
`corpus.decode_batches` does), text in and text out:
  ours  `decoding.translator.Translator(...).translate(lines)`, `max_len_a=0, max_len_b=L`
  HF    `MarianTokenizer` + `model.generate(num_beams=B, max_new_tokens=L + 1,
        do_sample=False, bad_words_ids=[[pad]])` (OPUS-MT's generation settings) +
        `batch_decode`
A random model does not end its sentences, so both run to the limit: L tokens, then EOS
(forced by both): L + 1 decoder steps per sentence on either side. Output tokens count the
generated tokens, EOS included. The sides alternate --repeats times after a warm-up on 8
sentences; the best run counts.

`--profile` prints, for each target missed, where both sides' time goes (torch.profiler,
operators by self CPU time): one training step on the same batch, or one beam pass. All
runs share `torch.set_num_threads(--threads)`. On a shared machine, OMP_WAIT_POLICY=PASSIVE
keeps absolute numbers meaningful (a spinning OpenMP thread that loses its core stalls
every operation); the ratios are measured alternately either way.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import sentencepiece as spm
import torch
import transformers
from timing import load_average, operator_table, paired_passes, profiled
from torch import Tensor, nn
from torch.nn import functional as F
from transformers import MarianConfig, MarianMTModel, MarianTokenizer

from transformer.data.batching import pack, train_batches
from transformer.data.multi30k import DEFAULT_ROOT, download_multi30k
from transformer.data.store import Batch, ParallelCorpus
from transformer.data.text import ParallelText, read_lines
from transformer.data.tokenizer import TokenizerPair
from transformer.decoding.request import DecodingRequest
from transformer.decoding.search import Hypothesis
from transformer.decoding.translator import Translator
from transformer.deploy.hf import import_hf
from transformer.model.loss import LabelSmoothedLoss
from transformer.model.transformer import Transformer
from transformer.run.checkpoint import model_from_checkpoint, tokenizers_from_state
from transformer.run.config import DecodingSettings, TrainConfig
from transformer.training.optimizer import build_optimizer

TARGETS = {"train": 1.3, "beam": 1.5}  # ours / HF, measured in the same run
LR = 5e-4  # the learning rate both sides train at (the speed does not depend on it)


@dataclass(frozen=True)
class Size:
    """A Marian model's shape and the SentencePiece vocabulary of each side."""

    d_model: int
    heads: int
    ffn: int
    layers: int
    vocab: int  # the model's joint vocabulary (vocab.json), dummy pieces included
    spm_vocab: int  # pieces per SentencePiece model (Multi30k English: < 7,800)


SIZES = {"base": Size(512, 8, 2048, 6, 58_101, 6000),
         "small": Size(256, 4, 1024, 3, 16_000, 4000)}


# ---- the model --------------------------------------------------------------------------

def train_spm(lines: Sequence[str], vocab_size: int) -> bytes:
    """A SentencePiece model (unigram, SentencePiece's defaults) of `lines`, serialized."""
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(lines), model_writer=model,
                                   vocab_size=vocab_size, minloglevel=2)
    return model.getvalue()


def vocab_table(models: Sequence[bytes], vocab_size: int) -> dict[str, int]:
    """MarianTokenizer's vocab.json: `</s>` 0, `<unk>` 1, every normal piece of `models`
    once, dummy pieces up to `vocab_size - 1`, `<pad>` last."""
    pieces = ["</s>", "<unk>"]
    for model in models:
        sp = spm.SentencePieceProcessor(model_proto=model)
        pieces += [sp.id_to_piece(i) for i in range(sp.get_piece_size())
                   if not (sp.is_control(i) or sp.is_unknown(i))]
    pieces = list(dict.fromkeys(pieces))
    if len(pieces) >= vocab_size:
        raise SystemExit(f"{len(pieces)} pieces do not fit a vocabulary of {vocab_size}")
    pieces += [f"<extra_{i}>" for i in range(vocab_size - 1 - len(pieces))] + ["<pad>"]
    return {piece: i for i, piece in enumerate(pieces)}


def marian_config(size: Size) -> MarianConfig:
    """OPUS-MT's config.json at `size`."""
    pad = size.vocab - 1
    return MarianConfig(
        vocab_size=size.vocab, d_model=size.d_model, encoder_layers=size.layers,
        decoder_layers=size.layers, encoder_attention_heads=size.heads,
        decoder_attention_heads=size.heads, encoder_ffn_dim=size.ffn, decoder_ffn_dim=size.ffn,
        activation_function="swish", scale_embedding=True, max_position_embeddings=512,
        dropout=0.1, attention_dropout=0.0, activation_dropout=0.0, pad_token_id=pad,
        decoder_start_token_id=pad, eos_token_id=0, forced_eos_token_id=0,
        tie_word_embeddings=True, share_encoder_decoder_embeddings=True)


def write_marian(directory: Path, size: Size, src_lines: Sequence[str],
                 tgt_lines: Sequence[str]) -> None:
    """A Hugging Face Marian directory with random weights and MarianTokenizer's files."""
    models = [train_spm(lines, size.spm_vocab) for lines in (src_lines, tgt_lines)]
    for name, model in zip(("source.spm", "target.spm"), models, strict=True):
        (directory / name).write_bytes(model)
    (directory / "vocab.json").write_text(json.dumps(vocab_table(models, size.vocab)))
    (directory / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "MarianTokenizer", "model_max_length": 512}))
    torch.manual_seed(1)
    MarianMTModel(marian_config(size)).save_pretrained(directory)


def load_ours(directory: Path) -> tuple[Transformer, TokenizerPair]:
    """Our model and tokenizers, imported from the Hugging Face directory."""
    state = import_hf(directory)
    return model_from_checkpoint(state), tokenizers_from_state(state)


@torch.no_grad()
def max_logit_diff(ours: Transformer, hf: MarianMTModel, batch: Batch) -> float:
    """The largest |logit difference| of the two models on `batch`'s real target positions,
    in eval mode: ~1e-5 when they compute the same function."""
    ours.eval()
    hf.eval()
    mask = batch.tgt_out != ours.config.pad_id
    mine = ours(batch.src, batch.src_valid_lens, batch.tgt_in, output_mask=mask)
    theirs = hf(input_ids=batch.src, attention_mask=attention_mask(batch),
                decoder_input_ids=batch.tgt_in).logits[mask]
    return float((mine - theirs).abs().max())


# ---- training step ----------------------------------------------------------------------

def training_batches(corpus: ParallelCorpus, max_tokens: int, count: int) -> list[Batch]:
    """The first `count` batches of our training pipeline's epoch 1."""
    order = train_batches(corpus.src_lens, corpus.tgt_lens, max_tokens, seed=1, epoch=1)
    if len(order) < count:
        raise SystemExit(f"the corpus makes {len(order)} batches, fewer than {count}")
    return [corpus.collate(indices) for indices in order[:count]]


def attention_mask(batch: Batch) -> Tensor:
    """Hugging Face's source mask (1 = a real token) from the source lengths."""
    positions = torch.arange(batch.src.shape[1])
    return (positions[None] < batch.src_valid_lens[:, None]).long()


Step = Callable[[Batch], None]


def train_config() -> TrainConfig:
    """The package's training defaults at the learning rate `LR` (the package's own is
    chosen by a run's budget)."""
    cfg = TrainConfig()
    cfg.optim.lr = LR
    return cfg


def ours_step(model: Transformer, cfg: TrainConfig) -> Step:
    """One update as `Trainer.train_step` makes it (one batch, one process)."""
    loss_fn = LabelSmoothedLoss(model, cfg.optim.label_smoothing)
    optimizer = build_optimizer(model, cfg)
    clip = cfg.optim.clip_norm or math.inf

    def step(batch: Batch) -> None:
        model.train()
        loss = loss_fn(batch.src, batch.src_valid_lens, batch.tgt_in, batch.tgt_out)
        (loss / batch.num_tgt_tokens).backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def hf_step(model: MarianMTModel, cfg: TrainConfig) -> Step:
    """The same update through MarianMTModel: label-smoothed cross-entropy on its logits,
    fused AdamW (Hugging Face Trainer's default optimizer)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.optim.lr,
                                  betas=tuple(cfg.optim.betas), eps=cfg.optim.eps,
                                  weight_decay=0.0, fused=True)
    clip = cfg.optim.clip_norm or math.inf
    pad, epsilon = model.config.pad_token_id, cfg.optim.label_smoothing

    def step(batch: Batch) -> None:
        model.train()
        labels = batch.tgt_out.masked_fill(batch.tgt_out == pad, -100)
        logits = model(input_ids=batch.src, attention_mask=attention_mask(batch),
                       decoder_input_ids=batch.tgt_in).logits
        loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100,
                               label_smoothing=epsilon, reduction="sum")
        (loss / batch.num_tgt_tokens).backward()
        nn.utils.clip_grad_norm_(model.parameters(), clip)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return step


def bench_training(steps: dict[str, Step], warmup: list[Batch], batches: list[Batch],
                   rounds: int) -> dict[str, list[float]]:
    """Each side's target tokens/s per round: warm-up steps, then the sides alternate,
    each stepping through `batches` once per round."""
    for step in steps.values():
        for batch in warmup:
            step(batch)
    tokens = sum(b.num_tgt_tokens for b in batches)
    seconds, _ = paired_passes({name: lambda step=step: [step(b) for b in batches]
                                for name, step in steps.items()}, rounds, flip=False)
    return {name: [tokens / s for s in passes] for name, passes in seconds.items()}


# ---- beam search ------------------------------------------------------------------------

class CountingTranslator(Translator):
    """Our translator, counting the tokens its last search generated (EOS included)."""

    output_tokens = 0

    def _search(self, sources: list[list[int]], request: DecodingRequest,
                **options) -> list[list[Hypothesis]]:
        hyps = super()._search(sources, request, **options)
        self.output_tokens = sum(len(h[0].tokens) + 1
                                 for h, ids in zip(hyps, sources, strict=True) if ids)
        return hyps


def decode_groups(lines: Sequence[str], tokenizers: TokenizerPair,
                  max_tokens: int) -> list[list[str]]:
    """Our search's batches of `lines` (longest first, packed to `max_tokens` source tokens
    with EOS, padding included), for Hugging Face to decode the same groups."""
    sizes = [len(ids) + 1 for ids in tokenizers.src.encode_batch(lines)]
    order = sorted(range(len(lines)), key=lambda i: -sizes[i])
    return [[lines[i] for i in batch] for batch in pack(order, sizes, max_tokens)]


class HfTranslator:
    """MarianTokenizer + `generate` + `batch_decode` over fixed batches of sentences."""

    def __init__(self, model: MarianMTModel, tokenizer: MarianTokenizer, beam: int,
                 max_new_tokens: int):
        self.model, self.tokenizer = model.eval(), tokenizer
        self.options = dict(num_beams=beam, max_new_tokens=max_new_tokens, do_sample=False,
                            bad_words_ids=[[model.config.pad_token_id]])
        self.output_tokens = 0

    @torch.no_grad()
    def translate(self, groups: Sequence[Sequence[str]]) -> list[str]:
        """Translations, batch after batch; counts the generated tokens."""
        out, self.output_tokens = [], 0
        for group in groups:
            enc = self.tokenizer(list(group), return_tensors="pt", padding=True)
            ids = self.model.generate(**enc, **self.options)[:, 1:]  # without the start
            self.output_tokens += int((ids != self.model.config.pad_token_id).sum())
            out += self.tokenizer.batch_decode(ids, skip_special_tokens=True)
        return out


def bench_beam(ours: CountingTranslator, hf: HfTranslator, lines: list[str],
               groups: list[list[str]], max_tokens: int,
               repeats: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    """Each side's seconds per run over `repeats` alternating runs, after a warm-up on 8
    sentences, and the tokens each side generates; ours batches by `max_tokens`, HF decodes
    `groups` (the same batches)."""
    translators = {"ours": ours, "HF": hf}
    runs = {"ours": lambda: ours.translate(lines, max_tokens=max_tokens),
            "HF": lambda: hf.translate(groups)}
    ours.translate(lines[:8])
    hf.translate([lines[:8]])
    seconds, _ = paired_passes(runs, repeats, flip=False)
    return seconds, {name: t.output_tokens for name, t in translators.items()}


# ---- profile and report -----------------------------------------------------------------

def profile(label: str, fn: Callable[[], object], top: int = 12) -> list[str]:
    """Where `fn()`'s time goes: torch.profiler's operators by self CPU time."""
    wall, prof = profiled(fn)
    return [f"{label}: {wall:.2f}s wall (profiled); operators by self CPU time:",
            *operator_table(prof, top)]


def verdict(name: str, ratio: float, what: str) -> str:
    """A PASS/FAIL line for the target `TARGETS[name]`."""
    target = TARGETS[name]
    return (f"{'PASS' if ratio >= target else 'FAIL'}  {what}: ours {ratio:.2f}x HF's "
            f"(target >= {target:g}x), against HF measured in this run")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=SIZES, default="small")
    parser.add_argument("--data-root", default=DEFAULT_ROOT,
                        help="folder of the Multi30k files (default: the download cache)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096,
                        help="training batch size: tokens per side, padding included")
    parser.add_argument("--warmup", type=int, default=1, help="untimed training steps")
    parser.add_argument("--steps", type=int, default=2, help="training steps per round")
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--sentences", type=int, default=128)
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--max-len", type=int, default=64,
                        help="output tokens before the forced EOS (both sides)")
    parser.add_argument("--decode-max-tokens", type=int, default=2048,
                        help="source tokens per decoding batch, padding included")
    parser.add_argument("--repeats", type=int, default=3, help="beam search runs per side")
    parser.add_argument("--profile", action="store_true",
                        help="for each target missed, where both sides' time goes")
    return parser.parse_args()


def per_run_ratios(ours: list[float], hf: list[float]) -> list[float]:
    """ours / HF of each round (numbers where larger is faster), rounded for printing."""
    return [round(a / b, 2) for a, b in zip(ours, hf, strict=True)]


def setup(args: argparse.Namespace, size: Size) -> tuple[Transformer, TokenizerPair,
                                                          MarianMTModel, MarianTokenizer,
                                                          list[str], list[Batch]]:
    """Both sides' model and tokenizer (one set of random weights), the test sentences, and
    --warmup + --steps training batches."""
    download_multi30k(args.data_root, ("en", "de"))
    root = Path(args.data_root).expanduser()
    train_en, train_de = (read_lines(root / f"train.{lang}.gz") for lang in ("en", "de"))
    test_en = read_lines(root / "test_2016_flickr.en.gz")[:args.sentences]
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        write_marian(directory, size, train_en, train_de)
        ours, tokenizers = load_ours(directory)
        hf_model = MarianMTModel.from_pretrained(directory)
        hf_tokenizer = MarianTokenizer.from_pretrained(directory)
    text = ParallelText(train_en, train_de, list(range(len(train_en))))
    corpus = ParallelCorpus.encode(text, tokenizers)
    batches = training_batches(corpus, args.max_tokens, args.warmup + args.steps)
    return ours, tokenizers, hf_model, hf_tokenizer, test_en, batches


def run_beam(args: argparse.Namespace, ours: Transformer, tokenizers: TokenizerPair,
             hf_model: MarianMTModel, hf_tokenizer: MarianTokenizer,
             lines: list[str]) -> tuple[dict, list[str]]:
    """The beam search benchmark's numbers (JSON-ready) and, with --profile and the target
    missed, both sides' profiles."""
    translator = CountingTranslator(ours, tokenizers, "cpu", decoding=DecodingSettings(
        beam_size=args.beam, max_len_a=0, max_len_b=args.max_len))
    hf_translator = HfTranslator(hf_model, hf_tokenizer, args.beam, args.max_len + 1)
    groups = decode_groups(lines, tokenizers, args.decode_max_tokens)
    seconds, tokens = bench_beam(translator, hf_translator, lines, groups,
                                 args.decode_max_tokens, args.repeats)
    best = {name: min(s) for name, s in seconds.items()}
    result = {"beam": args.beam, "sentences": len(lines), "max_len": args.max_len,
              "batches": [len(g) for g in groups], "seconds": best, "seconds_per_run": seconds,
              "sent_s": {name: len(lines) / s for name, s in best.items()},
              "output_tokens": tokens,
              "output_tok_s": {name: tokens[name] / s for name, s in best.items()},
              "ratio": best["HF"] / best["ours"], "target": TARGETS["beam"]}
    profiles: list[str] = []
    if args.profile and result["ratio"] < TARGETS["beam"]:
        profiles += profile("ours, beam search", lambda: translator.translate(
            lines, max_tokens=args.decode_max_tokens))
        profiles += profile("HF, beam search", lambda: hf_translator.translate(groups))
    return result, profiles


def run_training(args: argparse.Namespace, ours: Transformer, hf_model: MarianMTModel,
                 batches: list[Batch]) -> tuple[dict, list[str]]:
    """The training step benchmark's numbers (JSON-ready) and, with --profile and the target
    missed, both sides' profiles of one step."""
    warmup, timed_batches = batches[:args.warmup], batches[args.warmup:]
    steps = {"ours": ours_step(ours, train_config()), "HF": hf_step(hf_model, train_config())}
    speeds = bench_training(steps, warmup, timed_batches, args.rounds)
    best = {name: max(s) for name, s in speeds.items()}
    result = {"max_tokens": args.max_tokens, "warmup": args.warmup, "steps": args.steps,
              "rounds": args.rounds,
              "tokens_per_round": sum(b.num_tgt_tokens for b in timed_batches),
              "tok_s": best, "tok_s_per_round": speeds, "ratio": best["ours"] / best["HF"],
              "target": TARGETS["train"]}
    profiles: list[str] = []
    if args.profile and result["ratio"] < TARGETS["train"]:
        for name, step in steps.items():
            profiles += profile(f"{name}, one training step",
                                lambda step=step: step(timed_batches[0]))
    return result, profiles


def report(args: argparse.Namespace, train: dict, beam: dict) -> None:
    """The table, the per-run ratios and the verdicts."""
    print(f"training: {args.steps} step(s)/round x {args.rounds} rounds after {args.warmup} "
          f"warm-up, {train['tokens_per_round']:,} target tokens/round (--max-tokens "
          f"{args.max_tokens}); beam {args.beam}: {beam['sentences']} sentences in batches of "
          f"{beam['batches']}, {args.max_len} tokens + EOS each, best of {args.repeats}")
    print(f"{'best of each side':<26}{'ours':>10}{'HF':>10}{'ours/HF':>9}{'target':>8}")
    out_tok_s = beam["output_tok_s"]
    rows = [("train target tokens/s", train["tok_s"], train["ratio"], train["target"]),
            ("beam sentences/s", beam["sent_s"], beam["ratio"], beam["target"]),
            ("beam output tokens/s", out_tok_s, out_tok_s["ours"] / out_tok_s["HF"], None)]
    for label, values, ratio, target in rows:
        print(f"{label:<26}{values['ours']:>10.1f}{values['HF']:>10.1f}{ratio:>8.2f}x"
              + (f"{target:>7g}x" if target else ""))
    speeds, seconds = train["tok_s_per_round"], beam["seconds_per_run"]
    print(f"training tokens/s per round: ours {[round(s) for s in speeds['ours']]}, "
          f"HF {[round(s) for s in speeds['HF']]}, ours/HF "
          f"{per_run_ratios(speeds['ours'], speeds['HF'])}")
    print(f"beam seconds per run: ours {[round(s, 2) for s in seconds['ours']]}, "
          f"HF {[round(s, 2) for s in seconds['HF']]}, ours/HF "
          f"{per_run_ratios(seconds['HF'], seconds['ours'])}")
    print(verdict("train", train["ratio"], "training step, target tokens/s"))
    print(verdict("beam", beam["ratio"], f"beam search (beam {args.beam}), sentences/s"))


def main() -> None:
    args = parse_args()
    torch.set_num_threads(args.threads)
    transformers.logging.set_verbosity_error()
    size = SIZES[args.size]
    ours, tokenizers, hf_model, hf_tokenizer, test_en, batches = setup(args, size)
    loads = [load_average()]
    print(f"torch {torch.__version__}, transformers {transformers.__version__}, "
          f"{args.threads} thread(s); size {args.size} {asdict(size)}: "
          f"{ours.num_parameters():,} parameters; HF attention: "
          f"{hf_model.config._attn_implementation}; max |logit difference| "
          f"{max_logit_diff(ours, hf_model, batches[-1]):.2e}")
    # beam search first, on the untrained (identical) weights
    beam, beam_profiles = run_beam(args, ours, tokenizers, hf_model, hf_tokenizer, test_en)
    train, train_profiles = run_training(args, ours, hf_model, batches)
    loads.append(load_average())
    report(args, train, beam)
    print(f"load average before/after: {loads[0]:.1f}/{loads[1]:.1f}"
          + ("  -- other processes were using the CPU" if max(loads) > args.threads - 0.5
             else ""))
    if args.profile:
        print("\n".join(beam_profiles + train_profiles) or "all targets met: no profile")
    print(json.dumps({"size": args.size, "shape": asdict(size),
                      "parameters": ours.num_parameters(), "threads": args.threads,
                      "torch": torch.__version__, "transformers": transformers.__version__,
                      "train": train, "beam": beam, "load_average": loads}))


if __name__ == "__main__":
    main()
