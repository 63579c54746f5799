"""Training configuration: Hydra composition of configs/ onto the typed schema, fail-fast
validation naming the key, presets."""

from __future__ import annotations

from dataclasses import fields, replace

import pytest
from conftest import MULTI30K_EPOCH_TOKENS  # tests/conftest.py
from omegaconf import OmegaConf

from transformer import cli
from transformer.errors import ConfigError
from transformer.model.transformer import Hyperparameters, ModelConfig
from transformer.run.compose import CONFIG_DIR, compose_config
from transformer.run.config import ModelSettings, OptimConfig, TrainConfig, TrainerConfig
from transformer.training.schedule import Budget, budget_settings, fit_to_budget


def test_default_is_wu_et_als_recipe_fitted_to_its_budget_with_automatic_precision():
    """The default recipe trains multi30k_paper's model (Wu et al. as published) on their
    token budget, with the batch size, dropout and lr left to the budget (at their budget:
    theirs) and their schedule fitted to it: their 2,000 warmup updates, then a cooldown
    over the last 20% of whichever limit comes first; precision auto (bf16 where the
    hardware has it), a 90-minute limit and a sparse validation curve."""
    cfg, paper = compose_config(), compose_config(["experiment=multi30k_paper"])
    assert isinstance(cfg, TrainConfig) and cfg.data.name == "multi30k"
    assert (cfg.data.max_tokens, cfg.model.dropout, cfg.optim.lr) == (None, None, None)
    at_their_budget = fit_to_budget(cfg, budget_settings(Budget.of(cfg), MULTI30K_EPOCH_TOKENS))
    assert (at_their_budget.model, at_their_budget.data, cfg.seed) == (
        paper.model, paper.data, paper.seed)
    assert at_their_budget.optim == replace(paper.optim, cooldown=0.2)
    t, p = cfg.trainer, paper.trainer
    assert (t.max_updates, t.max_target_tokens, t.keep_last, t.validate_every_epoch) == (
        None, 61_000_000, p.keep_last, p.validate_every_epoch)
    assert 0.99 < t.max_target_tokens / (p.max_updates * 8192 * 0.93) < 1.01  # ~8,000 updates
    assert (t.precision, t.max_time) == ("auto", 5300)  # 90 minutes with data preparation
    assert 0 < t.validate_every_updates < p.max_updates and t.validate_after_budget == 0.9


def test_paper_experiment_is_wu_et_al_as_published():
    """configs/experiment/multi30k_paper.yaml: Wu et al. (2021)'s Transformer-Tiny recipe."""
    cfg = compose_config(["experiment=multi30k_paper"])
    m, o, t, d = cfg.model, cfg.optim, cfg.trainer, cfg.data
    assert (m.name, m.num_hiddens, m.ffn_num_hiddens, m.num_heads, m.num_encoder_layers,
            m.num_decoder_layers, m.dropout, m.norm_first, m.tie_output) == (
        "tiny", 128, 256, 4, 4, 4, 0.3, False, True)
    assert d.joint_vocab and d.max_tokens * o.update_freq == 8192  # their 2 GPUs x 4,096
    assert (o.name, o.lr, list(o.betas), o.warmup_updates, o.schedule, o.cooldown_updates,
            o.label_smoothing) == ("adam", 0.005, [0.9, 0.98], 2000, "inverse_sqrt", 0, 0.1)
    assert (t.max_updates, t.max_time, t.keep_last) == (8000, None, 10)
    assert 0 < t.validate_after_updates < t.max_updates  # validation in the last epochs only


@pytest.mark.parametrize("name, dims", [
    ("tiny", (128, 256, 4, 4, 4, None)),  # the dropout: left to the budget
    ("small", (256, 1024, 4, 3, 3, None)),
    ("base", (512, 2048, 8, 6, 6, None)),
    ("big", (1024, 4096, 16, 6, 6, None)),
])
def test_model_presets(name, dims):
    m = compose_config([f"model={name}", "~experiment"]).model  # the preset, not the recipe's
    assert m.name == name
    assert (m.num_hiddens, m.ffn_num_hiddens, m.num_heads, m.num_encoder_layers,
            m.num_decoder_layers, m.dropout) == dims
    config = replace(m, dropout=0.1).to_model_config(1000, 1000, share_embeddings=True)
    assert config.num_hiddens == dims[0] and config.src_vocab_size == 1000


@pytest.mark.parametrize("group, schema", [("optim", OptimConfig), ("trainer", TrainerConfig)])
def test_yaml_files_spell_out_every_schema_key(group, schema):
    """Each option file of a group with one schema documents all its keys, in order, and
    (for the default option) the schema's defaults."""
    for path in sorted((CONFIG_DIR / group).glob("*.yaml")):
        assert list(OmegaConf.load(path).keys()) == [f.name for f in fields(schema)], path
    default = {"optim": "adam", "trainer": "default"}[group]
    yaml = OmegaConf.load(CONFIG_DIR / group / f"{default}.yaml")
    assert OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(schema), yaml)) == schema()


def test_model_schema_is_the_models_own_hyperparameters():
    """One source for each architectural hyperparameter: the `model` group's schema is
    model.Hyperparameters plus the preset's name, and presets set only what they choose."""
    architecture = [f.name for f in fields(Hyperparameters)]
    assert [f.name for f in fields(ModelSettings)] == architecture + ["name"]
    runtime = {"src_vocab_size", "tgt_vocab_size", "share_embeddings", "pad_id", "start_id",
               "eos_id", "pruned_heads"}
    assert {f.name for f in fields(ModelConfig)} == set(architecture) | runtime
    for path in sorted((CONFIG_DIR / "model").glob("*.yaml")):
        keys = list(OmegaConf.load(path).keys())
        assert keys[0] == "name" and set(keys[1:]) <= set(architecture), path
    config = ModelSettings(num_hiddens=64, norm_first=True, dropout=0.1).to_model_config(
        100, 100, share_embeddings=False)
    assert config == ModelConfig(num_hiddens=64, norm_first=True, src_vocab_size=100,
                                 tgt_vocab_size=100, share_embeddings=False)


@pytest.mark.parametrize("override, message", [
    ("optim.lr=-1", "optim.lr must be > 0 or null, got -1"),
    ("optim.betas=[0.9,1.5]", "optim.betas"),
    ("optim.label_smoothing=1.0", "optim.label_smoothing"),
    ("optim.update_freq=0", "optim.update_freq"),
    ("optim.cooldown_updates=-1", "optim.cooldown_updates must be >= 0"),
    ("optim.cooldown=0 optim.cooldown_updates=9000",
     "optim.cooldown_updates=9000 needs trainer.max_updates >= it"),
    ("optim.name=sgd", "optim.name"),
    ("model=tiny model.num_heads=3", "model.num_heads (3) must divide model.num_hiddens (128)"),
    ("model=tiny model.num_hiddens=null", "model.num_hiddens is null, which only model=auto"),
    ("model.dropout=1.5", "model.dropout"),
    ("model.num_encoder_layers=0", "model.num_encoder_layers"),
    ("trainer.max_updates=0", "trainer.max_updates"),
    ("trainer.precision=fp8", "trainer.precision"),
    ("trainer.device=tpu", "trainer.device"),
    ("trainer.max_time=-5", "trainer.max_time"),
    ("data.vocab_size=-5", "data.vocab_size"),
    ("data.max_train_pairs=0", "data.max_train_pairs"),
    ("data.max_len=2048", "data.max_len (2048) must be <= model.max_positions (1024)"),
    ("data.spm_max_sentences=0", "data.spm_max_sentences must be a positive integer"),
    ("trainer.save_every_updates=-1", "trainer.save_every_updates must be >= 0"),
    ("trainer.validate_every_epoch=false trainer.validate_every_updates=0",
     "trainer.validate_every_epoch=false needs trainer.validate_every_updates > 0"),
])
def test_bad_values_fail_naming_the_key(override, message):
    with pytest.raises(ConfigError) as info:
        compose_config(override.split())
    assert message in str(info.value)


@pytest.mark.parametrize("override, message", [
    ("model=unknown", "model=unknown is not a preset"),  # with the presets listed
    ("optim.lrr=1", "optim.lrr"),  # typo: not in the schema
    ("optim.lr=abc", "optim.lr"),  # wrong type
    ("trainer.max_updates=1.5", "trainer.max_updates"),
    ("+optim.lrr=1", "optim.lrr"),  # added with +: still not in the schema
    ("optim.lr=[1", "optim.lr"),  # not the override grammar
])
def test_unknown_names_and_wrong_types_fail_while_composing(override, message):
    """Hydra's and OmegaConf's errors become ConfigError, one line naming the key."""
    with pytest.raises(ConfigError) as info:
        compose_config([override])
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_cli_fails_fast_on_a_bad_value(tmp_path, capsys):
    """The command line reports the key and stops before loading data or training (in this
    process: test_training.py runs scripts/train.py itself)."""
    with pytest.raises(SystemExit) as exited:  # Hydra's app exits with the status
        cli.main(["train", "optim.lr=-1", f"hydra.run.dir={tmp_path / 'run'}",
                  "data.root=/nonexistent"])
    err = capsys.readouterr().err
    assert exited.value.code == 1
    assert err.splitlines()[-1] == "error: optim.lr must be > 0 or null, got -1.0"
    assert "Traceback" not in err
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_smoke_experiment_composes_with_data_files():
    """Experiment presets set data values, not the data option: data=files still applies."""
    cfg = compose_config(["experiment=smoke", "data=files", "data.train_src=a.en",
                          "data.train_tgt=a.de", "data.valid_src=v.en", "data.valid_tgt=v.de"])
    assert cfg.data.name == "files" and cfg.data.train_src == "a.en"
    assert cfg.data.max_train_pairs == 4000 and cfg.data.vocab_size == 1000  # from smoke
    assert cfg.model.name == "tiny" and cfg.trainer.max_epochs == 2


def test_command_line_overrides_beat_the_experiment():
    cfg = compose_config(["experiment=smoke", "model=small", "optim.lr=0.0001"])
    assert cfg.model.name == "small" and cfg.optim.lr == 0.0001


FILES = ["data=files", "data.train_src=a.en", "data.train_tgt=a.de", "data.valid_src=v.en",
         "data.valid_tgt=v.de"]


def test_data_files_takes_the_recipe_fitted_to_its_corpus():
    """With data=files and no experiment named (configs/experiment/files.yaml), the recipe's
    schedule and the settings the corpus and the budget choose (null here), without
    Multi30k's budget or vocabulary: no limit (the trainer's default budget) and a null
    vocabulary size (chosen by the corpus)."""
    cfg, recipe = compose_config(FILES), compose_config()
    assert cfg.optim == recipe.optim and cfg.optim == OptimConfig()
    assert (cfg.optim.lr, cfg.optim.warmup_updates, cfg.optim.cooldown) == (None, 2000, 0.2)
    assert (cfg.data.max_tokens, cfg.model.dropout, cfg.data.vocab_size) == (None,) * 3
    assert recipe.data.vocab_size == 8000
    t = cfg.trainer
    assert (t.max_updates, t.max_target_tokens, t.max_time, t.max_epochs) == (None,) * 4
    assert (t.validate_every_updates, t.validate_after_budget, t.keep_last) == (
        recipe.trainer.validate_every_updates, recipe.trainer.validate_after_budget,
        recipe.trainer.keep_last)


def test_large_experiment_counts_in_updates():
    cfg = compose_config(["experiment=large"] + FILES)
    m, o, t, d = cfg.model, cfg.optim, cfg.trainer, cfg.data
    assert (m.name, m.num_hiddens, m.num_heads, m.num_encoder_layers) == ("base", 512, 8, 6)
    assert (d.name, d.vocab_size, d.joint_vocab) == ("files", 32000, True)
    assert o.cooldown_updates == 0 and o.schedule == "inverse_sqrt"
    assert not t.validate_every_epoch and t.validate_every_updates == 5000
    assert t.save_every_updates == 1000 and t.bleu_max_sentences == 1000
