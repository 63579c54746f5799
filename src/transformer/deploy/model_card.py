"""The model card of a Hugging Face export: the README.md that `hf.export_hf` writes and
the Hub shows for a model.

    model_card(translator, hf_config(...), license="mit", facts=checkpoint_facts(paths))

YAML front matter (the languages, the license, tags, metrics), then what the model is
(architecture, parameters, vocabulary), the data it was trained on and its budget (from the
checkpoint's stored training config; files by name only, never a local path), what it
trained (a training checkpoint's state), its scores and decoding settings where the
checkpoint stores them (`transformer tune-decoding`'s choice and its validation BLEU), how
to load it with `transformers` offline, the `transformer train` command with the run's
settings, and the license.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Union

from ..decoding.translator import Translator
from ..errors import ConfigError
from ..model.transformer import ModelConfig
from ..run.checkpoint import load_checkpoint, resolve_checkpoint
from ..run.config import DecodingSettings, TrainConfig

__all__ = ["DEFAULT_LICENSE", "check_license", "checkpoint_facts", "model_card"]

PathLike = Union[str, "os.PathLike[str]"]

DEFAULT_LICENSE = "mit"  # the package's own

_LICENSE_ID = re.compile(r"[a-z0-9][a-z0-9.+-]*")  # a Hub license id: mit, apache-2.0, other
_LICENSE_NAMES = {"mit": "MIT", "apache-2.0": "Apache 2.0", "cc-by-4.0": "CC BY 4.0"}
_FACTS = ("train_state", "budget_settings", "valid_bleu", "averaged_from", "pruned_from",
          "imported_from")  # what a checkpoint records beyond the model that a card reports


def check_license(license: str, name: str = "license") -> None:
    """A license id as the Hub's model cards take it (`mit`, `apache-2.0`, `cc-by-4.0`,
    `other`): lowercase letters, digits, `.`, `+` and `-`; else a `ConfigError` naming
    `name` (the option: `--license`)."""
    if not isinstance(license, str) or not _LICENSE_ID.fullmatch(license):
        raise ConfigError(f"{name} must be a license id such as mit, apache-2.0 or other "
                          f"(lowercase letters, digits, '.', '+' and '-'), got {license!r}")


def checkpoint_facts(checkpoints: PathLike | Sequence[PathLike]) -> dict[str, Any]:
    """What the checkpoint(s) record beyond the model, for its model card: the training
    state (`train_state`: updates, epochs, target tokens, time; of several checkpoints, the
    one trained longest), the settings chosen for the budget (`budget_settings`), the
    validation BLEU of `transformer tune-decoding`'s choice (`valid_bleu`) and where the
    weights come from (`averaged_from`: several checkpoints are averaged; `pruned_from`,
    `imported_from`). The tensors are mapped, not read."""
    paths = ([checkpoints] if isinstance(checkpoints, (str, os.PathLike))
             else list(checkpoints))
    states = [load_checkpoint(resolve_checkpoint(p), mmap=True) for p in paths]
    facts = {key: states[0][key] for key in _FACTS if states[0].get(key) is not None}
    trained = [s["train_state"] for s in states if isinstance(s.get("train_state"), dict)]
    if trained:
        facts["train_state"] = max(trained, key=lambda t: t.get("num_updates", 0))
    if len(paths) > 1:
        facts["averaged_from"] = [str(p) for p in paths]
    return facts


def model_card(translator: Translator, config: Mapping[str, Any], *,
               license: str = DEFAULT_LICENSE, facts: Mapping[str, Any] | None = None,
               source: str = "") -> str:
    """README.md of a Hugging Face export: YAML front matter (the languages, `license`,
    tags, metrics), then what the model is (architecture, parameters, vocabulary), the data
    it was trained on and its budget (from the checkpoint's training config), its scores
    and decoding settings, its use with `transformers` (offline), how it was trained, and
    its license. `config`: the export's config.json (`hf_config`); `facts`:
    `checkpoint_facts`; `source`: the checkpoint as given, named by its file only."""
    check_license(license)
    facts = facts or {}
    c, training = translator.model_config, translator.training_config
    src = translator.languages["src"]
    tgt = next(iter(translator.target_languages), None)
    pair = f"{src}-{tgt}" if src and tgt else None
    architecture = config["architectures"][0]
    front = ["---"]
    if src and tgt:
        front += ["language:", *(f"- {_yaml_text(lang)}" for lang in dict.fromkeys((src, tgt)))]
    front += [f"license: {license}", "library_name: transformers",
              "pipeline_tag: translation", "tags:", "- translation",
              *([f"- {_yaml_text(pair)}"] if pair else []), f"- {config['model_type']}",
              "- transformer", "metrics:", "- bleu", "- chrf", "---", ""]
    direction = (f"from {_language(src)} into {_language(tgt)}" if src and tgt
                 else "(its languages are not recorded)")
    made = ("trained with the `transformer` package" if training is not None else
             "read by the `transformer` package")
    lines = [f"# {pair + ': a' if pair else 'A'} Transformer for translation", "",
             f"A Transformer encoder-decoder (Vaswani et al. 2017) that translates "
             f"{direction}, {made} and exported for Hugging Face `transformers` as "
             f"`{architecture}`"
             + (f" (from `{Path(source.split()[0]).name}`)." if source else "."), "",
             "## Model", "", *_model_rows(translator), "",
             *_data_section(training, facts),
             *_scores_section(translator.decoding, facts),
             *_use_section(src, tgt),
             *_training_section(training, c),
             "## License", "",
             f"The model is released under the {_LICENSE_NAMES.get(license, license)} license "
             f"(`{license}`; the `transformer` package is MIT-licensed). Its training data "
             f"keeps its own terms.", ""]
    return "\n".join(front + lines)


def _yaml_text(text: str) -> str:
    """`text` as a YAML string: quoted where YAML would read another type (`no`, `on`, `1`)
    or a special character (a language name may hold `.`, `-` and digits)."""
    plain = re.fullmatch(r"[A-Za-z][A-Za-z0-9_-]*", text) and text.lower() not in {
        "y", "n", "yes", "no", "on", "off", "true", "false", "null"}
    return text if plain else json.dumps(text)


def _language(code: str) -> str:
    names = {"en": "English", "de": "German", "fr": "French", "cs": "Czech"}
    return f"{names[code]} (`{code}`)" if code in names else f"`{code}`"


def _model_rows(translator: Translator) -> list[str]:
    c, tokenizers = translator.model_config, translator.tokenizers
    norm = "pre-norm (layer norm before each sublayer)" if c.norm_first else \
        "post-norm (the paper's)"
    pruned = sum(len(heads) for heads in c.pruned_heads.values())
    rows = [("architecture", f"layers: {c.num_encoder_layers} encoder, {c.num_decoder_layers} "
                             f"decoder; model dimension {c.num_hiddens}, feed-forward "
                             f"{c.ffn_num_hiddens} ({c.activation}), {c.num_heads} attention "
                             f"heads, {norm}, sinusoidal positions up to {c.max_positions:,} "
                             f"tokens"),
            ("parameters", f"{translator.num_parameters:,}"),
            ("vocabulary", f"{c.tgt_vocab_size:,} SentencePiece pieces, one vocabulary for "
                           f"both languages"
                           + (", the output projection tied to the embeddings"
                              if c.tie_output else "")
                           + (", an output bias" if c.output_bias else "")),
            ("special tokens", f"`{tokenizers.tgt.vocabulary()[c.eos_id]}` ends a sentence "
                               f"(id {c.eos_id}), `{tokenizers.tgt.vocabulary()[c.pad_id]}` "
                               f"pads (id {c.pad_id})")]
    if pruned:
        rows.append(("pruned heads", f"{pruned} attention heads removed (transformer "
                                     f"prune-heads; their weights are zeros here)"))
    return ["| | |", "| --- | --- |", *(f"| {name} | {value} |" for name, value in rows)]


def _data_section(training: TrainConfig | None, facts: Mapping[str, Any]) -> list[str]:
    lines = ["## Training data", ""]
    if training is None:
        imported = facts.get("imported_from")
        return lines + [("Imported from the Hugging Face model "
                         f"`{Path(imported).name}`; " if imported else "")
                        + "the checkpoint records no training data.", ""]
    data = training.data
    for corpus in data.training_corpora():
        if data.name == "multi30k" and not data.corpora:
            what = ("Multi30k (Elliott et al. 2016), task 1, its training split"
                    + (" (lowercased, Moses-tokenized: `data.tokenized`)" if data.tokenized
                       else ""))
        else:
            what = (f"`{corpus.name}`: `{Path(str(corpus.src)).name}` / "
                    f"`{Path(str(corpus.tgt)).name}`")
        extras = [f"weight {corpus.weight:g}"] if data.corpora else []
        if corpus.tag:
            extras.append(f"tagged `{corpus.tag}`")
        if corpus.max_pairs:
            extras.append(f"its first {corpus.max_pairs:,} pairs")
        filters = corpus.filters if isinstance(corpus.filters, str) else "custom"
        extras.append(f"cleaning filters: {filters}")
        lines.append(f"- {what}, {corpus.src_lang} -> {corpus.tgt_lang} "
                     f"({', '.join(extras)})")
    valid = [e.name if data.valid_sets else
             ("Multi30k's validation split" if data.name == "multi30k"
              else f"`{Path(str(e.src)).name}` / `{Path(str(e.tgt)).name}`")
             for e in data.evaluation_sets("valid")]
    if valid:
        lines.append(f"- validation: {', '.join(valid)}")
    if training.init_from:
        lines.append(f"- fine-tuned from `{Path(training.init_from).name}` (`init_from`)")
    t = training.trainer
    limits = [f"{t.max_updates:,} updates" if t.max_updates else "",
              f"{t.max_target_tokens:,} target tokens" if t.max_target_tokens else "",
              f"{t.max_time:,.0f} s of training" if t.max_time else "",
              f"{t.max_epochs} epochs" if t.max_epochs else ""]
    limits = [limit for limit in limits if limit]
    if limits:
        first = ", whichever came first" if len(limits) > 1 else ""
        lines.append(f"- budget: {' or '.join(limits)}{first}")
    state = facts.get("train_state")
    if isinstance(state, dict):
        done = [f"{state.get('num_updates', 0):,} updates"]
        if state.get("target_tokens"):
            done.append(f"{state['target_tokens']:,} target tokens")
        if state.get("train_time"):
            done.append(f"{state['train_time'] / 60:,.1f} minutes of training")
        epoch = state.get("epoch", 1) - (1 if state.get("batches_done") == 0
                                         and state.get("epoch", 1) > 1 else 0)
        done.append(f"{epoch} epoch{'s' if epoch != 1 else ''}")
        lines.append(f"- trained: {', '.join(done)}")
    chosen = facts.get("budget_settings")
    if isinstance(chosen, dict) and chosen.get("update_tokens"):
        lines.append(f"- chosen for the budget: {chosen['update_tokens']:,} target tokens an "
                     f"update, peak learning rate {chosen['lr']:g}, dropout "
                     f"{chosen['dropout']:g}")
    return lines + [""]


def _scores_section(decoding: DecodingSettings, facts: Mapping[str, Any]) -> list[str]:
    lines = ["## Scores and decoding", "",
             f"- decoding defaults (`generation_config.json` carries the beam): beam "
             f"{decoding.beam_size}, length penalty alpha {decoding.alpha:g} (GNMT's, in "
             f"`transformer translate`), at most {decoding.max_len_a:g} x source length + "
             f"{decoding.max_len_b} tokens"]
    if facts.get("valid_bleu") is not None:
        averaged = facts.get("averaged_from") or []
        of = f", the average of {len(averaged)} checkpoints" if len(averaged) > 1 else ""
        lines.append(f"- validation BLEU {facts['valid_bleu']:.2f} (cased sacreBLEU) with "
                     f"these settings{of}, chosen by `transformer tune-decoding`")
    elif facts.get("averaged_from"):
        lines.append(f"- the average of {len(facts['averaged_from'])} checkpoints of one "
                     f"training run")
    state = facts.get("train_state")
    if isinstance(state, dict) and state.get("best_bleu", -1) >= 0:
        lines.append(f"- best validation BLEU during training: {state['best_bleu']:.2f} "
                     f"(cased sacreBLEU, greedy search)")
    lines.append("- beam search in `transformers` normalises length differently from "
                 "`transformer translate`, so its BLEU can differ slightly; greedy output is "
                 "the same token for token")
    return lines + [""]


def _use_section(src: str | None, tgt: str | None) -> list[str]:
    example = {"en": "A man rides a bike.", "de": "Ein Mann fährt Fahrrad.",
               "fr": "Un homme fait du vélo.", "cs": "Muž jede na kole."}.get(
                   src or "", "A sentence to translate.")
    return ["## Use with transformers", "",
            "Everything it needs is in this directory, so it loads offline:", "",
            "```python",
            "from transformers import AutoModelForSeq2SeqLM, AutoTokenizer", "",
            'model = AutoModelForSeq2SeqLM.from_pretrained("PATH_OR_HUB_ID")',
            'tokenizer = AutoTokenizer.from_pretrained("PATH_OR_HUB_ID")',
            f"batch = tokenizer([{json.dumps(example, ensure_ascii=False)}], "
            f"return_tensors=\"pt\", padding=True)",
            "print(tokenizer.batch_decode(model.generate(**batch), "
            "skip_special_tokens=True))",
            "```", "",
            "The tokenizer is `MarianTokenizer` (it needs `sentencepiece`). The `transformer` "
            "package reads it back with `transformer import-hf DIR --output RUN_DIR`.", ""]


def _training_section(training: TrainConfig | None, c: ModelConfig) -> list[str]:
    if training is None:
        return []
    data, optim, trainer = training.data, training.optim, training.trainer
    words = ["transformer", "train"]
    if data.corpora:
        words.append("'data.corpora=[...]'")  # the corpora listed above
    if data.name == "files" and not data.corpora:
        words += ["data=files", f"data.train_src={Path(str(data.train_src)).name}",
                  f"data.train_tgt={Path(str(data.train_tgt)).name}"]
    if data.name == "files" and not data.valid_sets:
        words += [f"data.valid_src={Path(str(data.valid_src)).name}",
                  f"data.valid_tgt={Path(str(data.valid_tgt)).name}"]
    if data.tokenized:
        words.append("data=multi30k_tok")
    if data.max_train_pairs:
        words.append(f"data.max_train_pairs={data.max_train_pairs}")
    words += [f"data.src_lang={data.src_lang}", f"data.tgt_lang={data.tgt_lang}",
              f"model.num_encoder_layers={c.num_encoder_layers}",
              f"model.num_decoder_layers={c.num_decoder_layers}",
              f"model.num_hiddens={c.num_hiddens}", f"model.ffn_num_hiddens={c.ffn_num_hiddens}",
              f"model.num_heads={c.num_heads}"]
    words += [f"model.{name}={_value(getattr(c, name))}"
              for name in ("activation", "norm_first", "output_bias", "tie_output")
              if getattr(c, name) != getattr(ModelConfig, name)]
    chosen = {"model.dropout": training.model.dropout, "data.vocab_size": c.tgt_vocab_size,
              "data.max_tokens": data.max_tokens, "optim.lr": optim.lr,
              "optim.warmup_updates": optim.warmup_updates, "optim.cooldown": optim.cooldown,
              "optim.label_smoothing": optim.label_smoothing, "seed": training.seed,
              **{f"trainer.{name}": getattr(trainer, name) for name in
                 ("max_updates", "max_target_tokens", "max_time", "max_epochs")}}
    words += [f"{key}={_value(value)}" for key, value in chosen.items() if value is not None]
    command, width = [], 0
    for word in words:  # wrapped as a shell command, continuation lines indented
        if command and width + len(word) + 1 > 88:
            command[-1] += " \\"
            command.append("    " + word)
            width = len(command[-1])
        elif command:
            command[-1] += " " + word
            width += len(word) + 1
        else:
            command.append(word)
            width = len(word)
    return ["## How it was trained", "",
            "With the `transformer` package (pure PyTorch), with these settings:", "",
            "```bash", *command, "```", "",
            "Settings a run leaves null (batch size, dropout, peak learning rate) are chosen "
            "for its budget and corpus; those shown are the ones this run used. The "
            "optimizer is "
            f"{'AdamW' if optim.name == 'adamw' else 'Adam'} (betas "
            f"{optim.betas[0]:g}, {optim.betas[1]:g}) with label-smoothed cross-entropy.", ""]


def _value(value: Any) -> str:
    """A config value as an override writes it."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):  # 5300.0 -> 5300, 0.005 -> 0.005 (never 1e+06)
        return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)
    return str(value)
