"""The learning-rate schedule fitted to a budget (schedule.py): its factor against the
formulas, the plan, the batch size, dropout and lr chosen by the budget, and training runs
limited by time (on a simulated clock whose speed changes mid-run), by target tokens and by
updates, killed and resumed in the cooldown."""

from __future__ import annotations

import logging
import math
import shutil
from dataclasses import replace
from itertools import pairwise

import pytest
import torch
from conftest import MULTI30K_EPOCH_TOKENS  # tests/conftest.py

from transformer.errors import ConfigError
from transformer.run import checkpoint as ckpt
from transformer.run.compose import CONFIG_DIR, compose_config, model_preset
from transformer.run.config import SHAPE
from transformer.runtime import DistEnv
from transformer.training.log import RunProgress
from transformer.training.schedule import (
    BATCH_ROWS,
    DEFAULT_EPOCHS,
    DEFAULT_MAX_TIME,
    DEFAULT_MAX_TOKENS,
    DROPOUT_ROWS,
    MODEL_ROWS,
    Budget,
    Schedule,
    batch_row,
    budget_settings,
    default_budget,
    dropout_for,
    explain_settings,
    fit_to_budget,
    lr_lambda,
    null_settings,
)
from transformer.training.trainer import Trainer, train

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture
def small(multi30k_dir, spm_model) -> list[str]:
    """A run of a few seconds on a 2+2-layer d32 model, float32, a cooldown over the last
    20% of the budget (each test sets the budget)."""
    return [
        "model=tiny", f"data.root={multi30k_dir}", f"data.spm_model={spm_model}",
        "data.vocab_size=500", "data.max_train_pairs=200", "data.max_tokens=512",
        "model.num_hiddens=32", "model.ffn_num_hiddens=64", "model.num_encoder_layers=2",
        "model.num_decoder_layers=2", "model.num_heads=2", "model.dropout=0.1",
        "optim.lr=0.002", "optim.warmup_updates=10", "optim.schedule=inverse_sqrt",
        "optim.cooldown_updates=0", "optim.cooldown=0.2", "optim.warmup_fraction=null",
        "trainer.max_updates=null", "trainer.max_time=null", "trainer.max_target_tokens=null",
        "trainer.precision=fp32",
        "trainer.bleu_max_sentences=8", "trainer.log_every_updates=1", "trainer.keep_last=2",
        "trainer.validate_every_updates=0", "trainer.validate_after_updates=0",
        "trainer.validate_every_epoch=true", "trainer.prefetch_batches=0",
    ]


# ---- the factor and the plan, without training ------------------------------------------


def schedule_of(*overrides: str) -> Schedule:
    return Schedule(compose_config(["experiment=smoke", "trainer.max_epochs=null",
                                    *overrides]))


def test_progress_is_the_largest_share_of_any_limit():
    budget = Budget(max_updates=100, max_target_tokens=1000, max_time=60.0)
    assert budget.progress(10, 500, 6.0) == 0.5  # tokens run out first
    assert budget.progress(90, 0, 0.0) == 0.9
    assert Budget().progress(10, 10, 10.0) == 0.0 and not Budget().limited
    # 40 updates, 600 tokens, 30 s left: 100 tokens and 1 s an update -> 6 more
    assert budget.updates_left(60, 400, 30.0, 100.0, 1.0) == 6.0
    assert budget.updates_left(60, 400, 30.0, None, None) == 40.0  # speed not known yet


def test_cooldown_multiplies_the_schedule_by_the_budget_left():
    s = schedule_of("optim.schedule=inverse_sqrt", "optim.warmup_updates=4",
                    "optim.cooldown=0.25", "trainer.max_updates=100")
    plain = lr_lambda("inverse_sqrt", 4)
    for n, p in ((0, 0.0), (3, 0.03), (50, 0.5), (74, 0.75)):
        assert s.factor(n, p) == plain(n)  # before the cooldown: the schedule itself
    for n, p in ((80, 0.8), (90, 0.9), (99, 0.99)):
        assert s.factor(n, p) == pytest.approx(plain(n) * (1 - p) / 0.25)
    assert s.factor(100, 1.0) == 0.0
    # constant + cooldown 1.0: linear decay from the peak to zero over the whole budget
    linear = schedule_of("optim.schedule=constant", "optim.warmup_updates=1",
                         "optim.cooldown=1.0", "trainer.max_updates=100")
    assert [linear.factor(n, n / 100) for n in (1, 25, 50, 99)] == \
        pytest.approx([0.99, 0.75, 0.5, 0.01])


def test_warmup_fraction_of_an_update_budget_is_planned_before_the_first_update():
    s = schedule_of("optim.warmup_updates=2000", "optim.warmup_fraction=0.25",
                    "trainer.max_updates=700")
    assert (s.plan.warmup_updates, s.plan.planned_updates) == (175, 700)
    assert s.factor(174, 0.25) == 1.0 and s.factor(86, 0.12) == pytest.approx(87 / 175)
    long = schedule_of("optim.warmup_updates=2000", "optim.warmup_fraction=0.25",
                       "trainer.max_updates=80000")
    assert long.plan.warmup_updates == 2000  # the fraction caps the warmup, never lengthens it


def test_a_time_budget_plans_from_the_measured_speed():
    s = schedule_of("optim.warmup_updates=2000", "optim.warmup_fraction=0.25",
                    "trainer.max_time=1000")
    assert s.plan.planned_updates is None  # nothing measured yet
    for n in range(1, 11):  # 2 s an update, 100 target tokens each
        s.observe(n, 100 * n, 2.0 * n)
    assert s.plan.planned_updates == 10 + round((1000 - 20) / 2)  # 500
    assert s.plan.warmup_updates == 125
    for n in range(11, 51):  # the machine slows down to 4 s an update
        s.observe(n, 100 * n, 20 + 4.0 * (n - 10))
    assert s.plan.planned_updates == 50 + round((1000 - 180) / 4)  # 255
    assert s.plan.warmup_updates == 64  # still in the warmup: planned again


def test_the_plan_is_logged_again_only_when_it_stays_changed(caplog):
    """A plan that moves for one interval (a validation's seconds) is not logged; one that
    stays moved (the machine became slower) is, once."""
    s = schedule_of("trainer.max_time=10000")
    seconds = 0.0
    with caplog.at_level(logging.INFO, logger="transformer.training.schedule"):
        for n in range(1, 1001):
            s.observe(n - 1, 100.0 * (n - 1), seconds)
            seconds += (1.0 if n <= 600 else 2.0) + (20.0 if n == 300 else 0.0)
    plans = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan:")]
    assert len(plans) == 2, plans
    assert plans[0].startswith("plan: at update 10, budget 10,000 s = ~10,000 updates;")
    assert plans[1].startswith("plan: at update 700, budget 10,000 s = ~5,290 updates;")


@pytest.mark.parametrize("override, message", [
    ("optim.cooldown=1.5", "optim.cooldown must be a share of the budget in [0, 1]"),
    ("optim.warmup_fraction=0", "optim.warmup_fraction must be in (0, 1] or null"),
    ("trainer.validate_after_budget=1", "trainer.validate_after_budget must be a share"),
    ("trainer.max_target_tokens=0", "trainer.max_target_tokens must be a positive integer"),
])
def test_bad_schedule_values_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        compose_config(["experiment=smoke", override])


def test_a_time_limit_needs_a_cooldown_and_one_cooldown_at_a_time():
    """A time limit stops wherever the machine's speed puts it: without a cooldown the run
    would end at the learning rate of that moment, so it is refused in one line (Wu et al.'s
    preset as published has none)."""
    for overrides in (["experiment=smoke", "optim.cooldown=0"],
                      ["experiment=multi30k_paper", "trainer.max_updates=null"]):
        with pytest.raises(ConfigError, match=r"optim.cooldown=0 with trainer.max_time=90"):
            compose_config([*overrides, "trainer.max_time=90"])
    assert compose_config(["experiment=smoke", "optim.cooldown=0"]).optim.cooldown == 0
    with pytest.raises(ConfigError, match="set one of them"):
        compose_config(["experiment=smoke", "trainer.max_updates=10", "optim.cooldown=0.2",
                        "optim.cooldown_updates=5"])


# ---- training runs on a simulated clock ------------------------------------------------


class SimulatedClock:
    """Training time that a test advances: `seconds(update)` after each update, so that the
    machine's speed changes where the test says (the trainer reads nothing else)."""

    def __init__(self, offset: float = 0.0) -> None:
        self.now = offset

    def start(self) -> None:
        pass

    def elapsed(self) -> float:
        return self.now


def simulated_trainer(cfg, run_dir, seconds, stop_after: int | None = None) -> Trainer:
    """A Trainer whose clock advances by `seconds(update)` per update, recording each
    update's lr and progress; with `stop_after`, stopped as by SIGTERM after that update."""
    trainer = Trainer(cfg, run_dir, DistEnv())
    trainer.clock = SimulatedClock(trainer.state.train_time)
    trainer.record = []
    step = trainer.train_step

    def timed_step(batches):
        reason = step(batches)
        if reason is None:
            n = trainer.state.num_updates
            trainer.clock.now += seconds(n)
            trainer.record.append((n, trainer.optimizer.param_groups[0]["lr"],
                                   trainer.progress))
            if n == stop_after:
                trainer.stop_requested = "SIGTERM"
        return reason

    trainer.train_step = timed_step
    return trainer


def ten_seconds(update: int) -> float:
    """10 s an update: a budget of 300 s in 30 updates."""
    return 10.0


def slows_down(update: int) -> float:
    """1 s an update for the first 30, then 3 s (a machine three times slower)."""
    return 1.0 if update <= 30 else 3.0


def test_a_time_budget_ends_its_cooldown_on_time_when_the_machine_slows_down(tmp_path, small,
                                                                          caplog):
    """300 s of training: 30 updates at 1 s, then 3 s each. A plan in updates made at the
    first speed (300 updates) would be cut at 120 updates, at a high lr; the cooldown on the
    budget's axis ends when the time does, at an lr near zero."""
    cfg = compose_config(small + ["trainer.max_time=300"])
    trainer = simulated_trainer(cfg, tmp_path, slows_down)
    with caplog.at_level(logging.INFO, logger="transformer.training.schedule"):
        result = trainer.fit()
    trainer.close()
    assert result.stop_reason == "max_time"
    updates, lrs, progress = zip(*trainer.record, strict=True)
    assert updates[-1] == 120 == result.state.num_updates  # 30 + (300 - 30) / 3
    assert progress[-1] >= 0.98  # the last update started within 2% of the budget's end
    assert lrs[-1] == pytest.approx(cfg.optim.lr * math.sqrt(10 / 120) * 0.01 / 0.2)
    assert lrs[-1] <= 0.1 * max(lrs)
    start = next(i for i, p in enumerate(progress) if p >= 0.8)
    assert updates[start] == 101  # it starts at 240 s (30 + 70 updates of 3 s): 0.8
    assert all(a > b for a, b in pairwise(lrs[start - 1:]))  # falling to the end
    assert trainer.schedule.plan.planned_updates == 120  # the last plan saw the new speed
    plans = [r.getMessage() for r in caplog.records if r.getMessage().startswith("plan:")]
    assert plans[0].startswith("plan: at update 10, budget 300 s = ~300 updates;")
    assert any("budget 300 s = ~120 updates" in p for p in plans[1:])
    assert len(plans) <= 4  # logged when it changes by more than a tenth, not every 50


def test_killed_and_resumed_in_the_cooldown_ends_with_the_same_plan_and_losses(tmp_path,
                                                                             small):
    cfg = compose_config(small + ["trainer.max_time=300", "optim.warmup_fraction=0.25",
                                  "optim.warmup_updates=1000"])
    straight = simulated_trainer(cfg, tmp_path / "a", slows_down)
    whole = straight.fit()
    straight.close()
    first = simulated_trainer(cfg, tmp_path / "b", slows_down, stop_after=105)
    assert first.fit().stop_reason == "signal"
    first.close()
    assert first.record[-1][2] > 0.8  # stopped inside the cooldown
    saved = ckpt.load_checkpoint(tmp_path / "b/checkpoints/checkpoint_last.pt")
    assert saved["train_state"]["train_time"] == 30 + 75 * 3
    second = simulated_trainer(cfg, tmp_path / "b", slows_down)
    assert second.schedule.plan == first.schedule.plan  # restored from the checkpoint
    rest = second.fit()
    second.close()
    assert rest.stop_reason == "max_time" and rest.state.num_updates == 120
    assert first.losses + rest.losses == whole.losses
    assert first.record + second.record == straight.record
    warmup = straight.schedule.plan.warmup_updates
    assert warmup < 1000 and second.schedule.plan.warmup_updates == warmup
    assert max(lr for _, lr, _ in straight.record) == pytest.approx(cfg.optim.lr, rel=0.1)


def test_a_token_budget_stops_at_its_tokens_with_the_lr_near_zero(tmp_path, small):
    result = train(compose_config(small + ["trainer.max_target_tokens=20000"]), tmp_path)
    assert result.stop_reason == "max_target_tokens"
    s = result.state
    assert s.target_tokens >= 20000 > s.target_tokens - 600  # stopped by the first past it
    log_text = (tmp_path / "train.log").read_text()
    assert "budget 20,000 target tokens = ~" in log_text
    lrs = [float(line.split("| lr ")[1].split(" |")[0])
           for line in log_text.splitlines() if "| lr " in line]
    assert len(lrs) == s.num_updates and lrs[-1] <= 0.1 * max(lrs)
    again = train(compose_config(small + ["trainer.max_target_tokens=20000"]), tmp_path / "b")
    assert again.losses == result.losses  # a token budget plans alike every time


def test_validation_waits_for_the_share_of_the_budget(tmp_path, small):
    """trainer.validate_after_budget: epoch-end validations (and the numbered checkpoints
    that are averaged) come from the end of the budget, here its last 40%."""
    result = train(compose_config(small + ["trainer.max_updates=60",
                                           "trainer.validate_after_budget=0.6",
                                           "trainer.keep_last=20"]), tmp_path)
    numbered = sorted(int(p.stem.split("_")[1])
                      for p in (tmp_path / "checkpoints").glob("checkpoint_[0-9]*.pt"))
    assert numbered and numbered[-1] == 60 == result.state.num_updates
    assert min(numbered) >= 36  # epochs ending before 60% of 60 updates only saved last
    assert len(numbered) >= 2


# ---- the settings chosen by the budget and the corpus -----------------------------------


@pytest.mark.parametrize("budget, speed, batch", [
    (Budget(max_target_tokens=3_000_000), None, 1024),
    (Budget(max_target_tokens=5_500_000), None, 2048),
    (Budget(max_target_tokens=20_000_000), None, 4096),
    (Budget(max_target_tokens=61_000_000), None, 8192),
    (Budget(max_target_tokens=61_000_000, max_time=1800), 3_000, 1024),  # 5.4M tokens
    (Budget(max_target_tokens=61_000_000, max_time=1800), 8_000, 2048),  # 14.4M
    (Budget(max_target_tokens=61_000_000, max_time=1800), 12_000, 4096),  # 21.6M
    (Budget(max_target_tokens=61_000_000, max_time=5300), 8_000, 4096),  # 42.4M
    (Budget(max_target_tokens=61_000_000, max_time=5300), 12_000, 8192),  # 61M of 63.6M
    (Budget(max_time=5300), 8_000, 4096),
    (Budget(max_updates=1000), None, 1024),  # at most 2M tokens in 2,048-token batches
    (Budget(max_updates=3000), None, 2048),  # 6.1M in 2,048-token batches
    (Budget(max_updates=8000), None, 8192),  # Wu et al.'s 8,000 updates
    (Budget(), None, 8192),  # no limit in tokens: the settings for the largest budgets
])
def test_the_budget_chooses_the_batch_for_the_tokens_it_allows(budget, speed, batch):
    assert budget_settings(budget, MULTI30K_EPOCH_TOKENS, speed).update_tokens == batch


@pytest.mark.parametrize("epochs, dropout", [
    (0.3, 0.1), (3.0, 0.1), (39.9, 0.1), (40.0, 0.2), (124.9, 0.2), (125.0, 0.3), (900, 0.3)])
def test_the_dropout_follows_the_epochs_the_budget_makes(epochs, dropout):
    assert dropout_for(epochs) == dropout
    tokens = round(epochs * 100_000)
    settings = budget_settings(Budget(max_target_tokens=tokens), 100_000)
    assert settings.dropout == dropout and settings.epochs == pytest.approx(epochs)


def test_the_same_budget_on_corpora_of_other_sizes():
    """10M target tokens: the same batches and peak on any corpus (the updates they make),
    the dropout by the passes over it: 10 epochs of the news corpus of bench/own_data.py, 21
    of Multi30k, 51 of its Tatoeba corpus of short sentences, 400 of a tiny one."""
    budget = Budget(max_target_tokens=10_000_000)
    chosen = {tokens: budget_settings(budget, tokens)
              for tokens in (964_037, MULTI30K_EPOCH_TOKENS, 196_723, 25_000)}
    assert {(s.update_tokens, s.lr) for s in chosen.values()} == {(2048, 0.002)}
    assert [s.dropout for s in chosen.values()] == [0.1, 0.1, 0.2, 0.3]


def test_the_log_explains_only_what_the_budget_chose():
    settings = budget_settings(Budget(max_target_tokens=30_000_000), 200_000)  # 150 epochs
    assert explain_settings(settings, ["model.dropout"]) == "dropout 0.3 (for 125 epochs or more)"
    assert explain_settings(settings, ["data.max_tokens", "optim.lr"]) == (
        "batches of 4,096 tokens an update (for budgets of 20,000,000 to 61,000,000 target "
        "tokens), lr 0.003 and a warmup of 15% of the planned updates (for budgets of "
        "20,000,000 to 61,000,000 target tokens)")
    cfg = compose_config(["data.max_tokens=1024"])
    assert null_settings(cfg) == ["model", "optim.lr", "model.dropout"]
    assert null_settings(compose_config(["model=tiny", "model.dropout=0.1"])) == [
        "data.max_tokens", "optim.lr"]
    small = budget_settings(Budget(max_target_tokens=3_000_000), MULTI30K_EPOCH_TOKENS)
    assert explain_settings(small, ["model", "optim.lr"]) == (
        "the small model (for budgets under 5,500,000 target tokens), lr 0.0007 and a warmup "
        "of 15% of the planned updates (for budgets under 5,500,000 target tokens)")


@pytest.mark.parametrize("tokens, model, lr", [
    (1_000_000, "small", 0.0007), (5_499_999, "small", 0.0007), (5_500_000, "tiny", 0.002),
    (61_000_000, "tiny", 0.005)])
def test_model_auto_trains_the_model_of_the_budget_at_its_share_of_the_peak(tokens, model, lr):
    """Under model=auto (the default) a budget under 5.5M target tokens trains the small
    model at half the batch row's peak lr, a larger one Transformer-Tiny at the row's; a
    preset the config names is kept, at its own share of the peak (1 for a model the rows
    do not name)."""
    budget = Budget(max_target_tokens=tokens)
    settings = budget_settings(budget, MULTI30K_EPOCH_TOKENS)
    assert (settings.model, settings.lr) == (model, pytest.approx(lr))
    row = batch_row(budget)
    for named, share in (("tiny", 1.0), ("small", 0.5), ("base", 1.0)):
        fixed = budget_settings(budget, MULTI30K_EPOCH_TOKENS, model=named)
        assert (fixed.model, fixed.lr) == (None, pytest.approx(row.lr * share))


def test_model_auto_becomes_the_preset_with_what_the_config_sets_on_top():
    """fit_to_budget turns model=auto into the chosen preset, exactly as `model=NAME` composes
    it, and keeps the fields set on top of auto; a named preset is never replaced. The
    presets auto chooses set the shape and nothing else, so nothing set on top of auto is
    lost."""
    for row in MODEL_ROWS:
        preset = (CONFIG_DIR / "model" / f"{row.model}.yaml").read_text(encoding="utf-8")
        keys = {line.split(":")[0] for line in preset.splitlines() if line[:1].isalpha()}
        assert keys == {"name", *SHAPE}, row.model
    settings = budget_settings(Budget(max_target_tokens=3_000_000), MULTI30K_EPOCH_TOKENS)
    auto = fit_to_budget(compose_config(["trainer.max_target_tokens=3000000"]), settings)
    named = compose_config(["model=small", "model.dropout=0.1"])
    assert auto.model == named.model == replace(model_preset("small"), dropout=0.1)
    assert (auto.model.num_hiddens, auto.model.num_encoder_layers) == (256, 3)
    over = fit_to_budget(compose_config(["trainer.max_target_tokens=3000000",
                                         "model.norm_first=true", "model.num_heads=8",
                                         "model.dropout=0.3"]), settings)
    assert over.model == replace(named.model, norm_first=True, num_heads=8, dropout=0.3)
    with pytest.raises(ConfigError, match=r"model.num_heads \(3\) must divide model.num_hiddens "
                       r"\(256\)"):  # checked once the shape is known
        fit_to_budget(compose_config(["model.num_heads=3"]), settings)
    kept = fit_to_budget(compose_config(["trainer.max_target_tokens=3000000", "model=tiny"]),
                         budget_settings(Budget(max_target_tokens=3_000_000),
                                         MULTI30K_EPOCH_TOKENS, model="tiny"))
    assert (kept.model.name, kept.model.num_hiddens, kept.optim.lr) == ("tiny", 128, 0.0014)


def test_the_tables_grow_with_the_budget():
    assert BATCH_ROWS[0].from_tokens == MODEL_ROWS[0].from_tokens == DROPOUT_ROWS[0][0] == 0
    starts = [row.from_tokens for row in MODEL_ROWS]
    assert starts == sorted(starts) and set(starts) <= {row.from_tokens for row in BATCH_ROWS}
    for key in ("from_tokens", "update_tokens", "lr"):
        values = [getattr(row, key) for row in BATCH_ROWS]
        assert values == sorted(values) and len(set(values)) == len(values), key
    for column in zip(*DROPOUT_ROWS, strict=True):
        assert list(column) == sorted(column) and len(set(column)) == len(column)


@pytest.mark.parametrize("tokens, settings", [
    (3_000_000, ["model=small", "data.max_tokens=1024", "model.dropout=0.1", "optim.lr=0.0007",
                 "optim.warmup_fraction=0.15"]),
    (5_500_000, ["model=tiny", "data.max_tokens=2048", "model.dropout=0.1", "optim.lr=0.002",
                 "optim.warmup_fraction=0.15"]),
    (12_300_000, ["model=tiny", "data.max_tokens=2048", "model.dropout=0.1", "optim.lr=0.002",
                  "optim.warmup_fraction=0.15"]),
    (20_000_000, ["model=tiny", "data.max_tokens=4096", "model.dropout=0.2", "optim.lr=0.003",
                  "optim.warmup_fraction=0.15"]),
    (61_000_000, ["model=tiny", "data.max_tokens=8192", "model.dropout=0.3", "optim.lr=0.005"]),
])
def test_the_recipe_at_a_token_budget_is_the_run_measured_there(tokens, settings):
    """On Multi30k the plan is the runs of docs/results.md ("Quality by budget": bench/budget.py's
    small_2k and mid_4k arms, Wu et al.'s settings; the 30-minute command's 12.3M tokens;
    bench/own_data.py's small_1k_d0.1 arm at 3M, "Your own data"):
    the recipe filled in at their budgets is the config those runs trained with, key for
    key."""
    recipe = compose_config([f"trainer.max_target_tokens={tokens}"])
    measured = compose_config([f"trainer.max_target_tokens={tokens}", *settings])
    chosen = budget_settings(Budget.of(recipe), MULTI30K_EPOCH_TOKENS)
    assert fit_to_budget(recipe, chosen) == measured


def test_multi30k_has_the_epoch_tokens_the_tests_count_on(full_multi30k, tmp_path):
    """MULTI30K_EPOCH_TOKENS, measured: the recipe's tokenizer on the whole training set."""
    from transformer.run.data import load_data

    cfg = compose_config([f"data.root={full_multi30k}", "trainer.max_target_tokens=5500000"])
    data = load_data(cfg.data, tmp_path)
    draw = data.train.draw(cfg.data.seed, 1)
    assert int(data.train.tgt_lens[draw].sum()) + len(draw) == MULTI30K_EPOCH_TOKENS


def test_the_default_budget_is_epochs_of_the_corpus_capped_in_tokens_and_time():
    assert default_budget(50_000) == Budget(max_target_tokens=DEFAULT_EPOCHS * 50_000,
                                            max_time=DEFAULT_MAX_TIME)
    assert default_budget(10_000_000) == Budget(max_target_tokens=DEFAULT_MAX_TOKENS,
                                                max_time=DEFAULT_MAX_TIME)


def test_the_budget_fills_only_what_the_config_leaves_null():
    recipe = compose_config(["trainer.max_target_tokens=5500000"])
    assert (recipe.data.max_tokens, recipe.model.dropout, recipe.optim.lr) == (None,) * 3
    row = budget_settings(Budget.of(recipe), MULTI30K_EPOCH_TOKENS)
    cfg = fit_to_budget(recipe, row)
    assert (cfg.data.max_tokens, cfg.model.dropout, cfg.optim.lr,
            cfg.optim.warmup_fraction) == (2048, 0.1, 0.002, 0.15)
    assert cfg.optim.warmup_updates == 2000 and cfg.trainer == recipe.trainer
    given = compose_config(["trainer.max_target_tokens=5500000", "data.max_tokens=4096",
                            "optim.warmup_fraction=0.3", "optim.update_freq=2"])
    cfg = fit_to_budget(given, row, world_size=2)
    assert (cfg.data.max_tokens, cfg.model.dropout, cfg.optim.lr,
            cfg.optim.warmup_fraction) == (4096, 0.1, 0.002, 0.3)
    split = fit_to_budget(compose_config(["trainer.max_target_tokens=5500000",
                                          "optim.update_freq=2", "data.max_len=128"]),
                          row, world_size=2)
    assert split.data.max_tokens == 512  # 2,048 tokens an update over 2 ranks x 2 batches
    tiny = fit_to_budget(compose_config(["trainer.max_target_tokens=5500000",
                                         "optim.update_freq=4"]), row, world_size=4)
    assert tiny.data.max_tokens == tiny.data.max_len == 256  # never below the longest pair


def test_a_time_budget_measures_the_speed_then_keeps_its_settings_when_resumed(
        tmp_path, small, monkeypatch, caplog):
    """Leaving the batch size, dropout and lr to a time budget: the trainer measures its
    speed (on this machine; the probe's seconds count against the budget), chooses the row,
    writes it in config.yaml and the checkpoints; resumed on a machine that measures
    otherwise, it keeps the row it started with."""
    leave = ["data.max_tokens=null", "model.dropout=null", "optim.lr=null",
             "optim.warmup_updates=2000"]
    cfg = compose_config(small + leave + ["trainer.max_time=300"])
    with caplog.at_level(logging.INFO, logger="transformer.training.trainer"):
        measured = Trainer(cfg, tmp_path / "measured", DistEnv())
    measured.close()
    speed = measured._tokens_per_second
    assert speed > 0 and measured.state.train_time > 0
    assert measured.budget_settings == budget_settings(Budget.of(cfg), measured.epoch_tokens,
                                                       speed, model="tiny")
    assert f"{speed:,.0f} target tokens/s measured" in caplog.text

    monkeypatch.setattr(Trainer, "_measure_speed", lambda self, cfg: 1e6)  # 300M tokens
    first = simulated_trainer(cfg, tmp_path / "b", ten_seconds, stop_after=10)
    assert first.fit().stop_reason == "signal"
    first.close()
    large = budget_settings(Budget.of(cfg), first.epoch_tokens, 1e6, model="tiny")
    assert (large.update_tokens, large.dropout) == (BATCH_ROWS[-1].update_tokens,
                                                    DROPOUT_ROWS[-1][1])
    assert first.budget_settings == large
    assert (first.cfg.data.max_tokens, first.cfg.model.dropout, first.cfg.optim.lr) == (
        large.update_tokens, large.dropout, large.lr)
    written = (tmp_path / "b/config.yaml").read_text()
    assert f"max_tokens: {large.update_tokens}" in written and f"lr: {large.lr}" in written
    saved = ckpt.load_checkpoint(tmp_path / "b/checkpoints/checkpoint_last.pt")
    assert saved["budget_settings"]["update_tokens"] == large.update_tokens

    def slower(self, cfg):
        raise AssertionError("a resumed run measures nothing")

    monkeypatch.setattr(Trainer, "_measure_speed", slower)
    shutil.copytree(tmp_path / "b", tmp_path / "older")  # as an older version saved it:
    del saved["budget_settings"]  # no row, only the config it trained with
    ckpt.save_checkpoint(saved, tmp_path / "older/checkpoints/checkpoint_last.pt")
    older = Trainer(cfg, tmp_path / "older", DistEnv())
    older.close()
    assert older.cfg == first.cfg
    second = simulated_trainer(cfg, tmp_path / "b", ten_seconds)
    assert second.budget_settings == large and second.cfg == first.cfg
    assert second.fit().stop_reason == "max_time"
    second.close()



def test_the_speed_probe_measures_again_at_the_model_and_batch_it_chooses(tmp_path, small,
                                                                           monkeypatch):
    """The smallest row's model is probed first; where its speed chooses another model or
    batch, those are probed too; a choice its own speed confirms is followed by a probe one
    row up, kept where that row's speed confirms it (the most tokens), else the lower. A
    model and batch the config fixes are probed once."""
    speeds = {}
    probed = []

    def measure(self, cfg):
        probed.append((cfg.model.name, cfg.data.max_tokens))
        return speeds[cfg.model.name]

    monkeypatch.setattr(Trainer, "_measure_speed", measure)
    cfg = compose_config(small + ["model=auto", "data.max_tokens=null", "model.dropout=null",
                                  "optim.lr=null", "trainer.max_time=1800"])

    def chosen(small_speed: float, tiny_speed: float, name: str):
        speeds.update(small=small_speed, tiny=tiny_speed)
        probed.clear()
        trainer = Trainer(cfg, tmp_path / name, DistEnv())
        trainer.close()
        return trainer

    # 1,800 s: 7.2M tokens at the small model's speed, then 16.2M at Tiny's: Tiny, 2,048-token
    # batches; the 20M row's batches, at Tiny's speed, fall back to them
    trainer = chosen(4000.0, 9000.0, "fast")
    assert probed == [("small", 1024), ("tiny", 2048), ("tiny", 4096)]
    assert trainer.budget_settings == budget_settings(Budget.of(cfg), trainer.epoch_tokens,
                                                      9000.0, model="auto")
    assert trainer.budget_settings.model == "tiny" and trainer.cfg.data.max_tokens == 2048
    # a slow CPU: 3.6M tokens at the small model's speed confirm the small model, but Tiny's
    # speed (8.1M) confirms Tiny too, which trains more tokens
    trainer = chosen(2000.0, 4500.0, "slow")
    assert probed == [("small", 1024), ("tiny", 2048), ("tiny", 4096)]
    assert trainer.budget_settings == budget_settings(Budget.of(cfg), trainer.epoch_tokens,
                                                      4500.0, model="auto")
    assert trainer.budget_settings.model == "tiny" and trainer.cfg.data.max_tokens == 2048
    # slower still: Tiny's speed (5.0M tokens) chooses the small model again, which stays
    trainer = chosen(2000.0, 2800.0, "slower")
    assert probed == [("small", 1024), ("tiny", 2048)]
    assert trainer.budget_settings == budget_settings(Budget.of(cfg), trainer.epoch_tokens,
                                                      2000.0, model="auto")
    assert trainer.budget_settings.model == "small" and trainer.cfg.data.max_tokens == 1024
    probed.clear()
    fixed = compose_config(small + ["model.dropout=null", "trainer.max_time=1800"])
    Trainer(fixed, tmp_path / "fixed", DistEnv()).close()
    assert probed == [("tiny", 512)]  # the fixture's model=tiny and data.max_tokens=512


def test_the_speed_probe_times_the_second_pass_over_its_batches(tmp_path, small, monkeypatch):
    """Each probe batch is stepped twice (a batch's first step makes its shapes' kernels);
    the speed is the batches' target tokens over the second pass's seconds."""
    from contextlib import nullcontext

    from transformer.model.transformer import Transformer
    from transformer.run.data import load_data
    from transformer.training import speed

    cfg = compose_config(small + ["trainer.max_time=60"])
    data = load_data(cfg.data, tmp_path)
    vocab = data.tokenizers.src.vocab_size
    model = Transformer(cfg.model.to_model_config(vocab, vocab, share_embeddings=True))
    sources = []
    model.encoder.register_forward_pre_hook(lambda module, args: sources.append(args[0]))
    clock = iter([0.0, 100.0, 102.5])  # the first pass 100 s, the second 2.5 s
    monkeypatch.setattr(speed, "perf_counter", lambda: next(clock))
    tokens_per_second = speed.measure_speed(model, data, cfg, nullcontext)
    n = speed.SPEED_PROBE_STEPS
    batches = [data.train.collate(i) for i in data.train_batches(epoch=1)[:n]]
    assert len(sources) == 2 * n
    assert all(torch.equal(a, b.src) for a, b in zip(sources, batches + batches, strict=True))
    assert tokens_per_second == pytest.approx(sum(b.num_tgt_tokens for b in batches) / 2.5)


# ---- every run has a budget, ends annealed and says when ---------------------------------


def experiment_presets() -> list[str]:
    from transformer.run.compose import CONFIG_DIR

    return sorted(path.stem for path in (CONFIG_DIR / "experiment").glob("*.yaml"))


@pytest.mark.parametrize("preset", experiment_presets())
def test_a_time_limit_alone_ends_at_a_tenth_of_the_peak_under_every_preset(preset):
    """`trainer.max_time` as the only limit (90 s, an update a second): each preset's
    schedule (its lr, warmup and cooldown) ends at most a tenth of its peak; a preset
    without a cooldown (Wu et al.'s as published) is refused at once instead of ending at
    the lr of the moment."""
    overrides = [f"experiment={preset}", "trainer.max_epochs=null", "trainer.max_updates=null",
                 "trainer.max_target_tokens=null", "trainer.max_time=90"]
    if compose_config([f"experiment={preset}"]).optim.cooldown == 0:
        with pytest.raises(ConfigError, match="optim.cooldown=0 with trainer.max_time=90"):
            compose_config(overrides)
        return
    cfg = compose_config(overrides)
    cfg = fit_to_budget(cfg, budget_settings(Budget.of(cfg), MULTI30K_EPOCH_TOKENS, 3000.0))
    schedule, seconds, lrs, n = Schedule(cfg), 0.0, [], 0
    while seconds < cfg.trainer.max_time:  # the trainer's stop: before an update
        schedule.observe(n, 2000.0 * n, seconds)
        lrs.append(cfg.optim.lr * schedule.factor(n, schedule.budget.progress(n, 0, seconds)))
        n, seconds = n + 1, seconds + 1.0
    assert lrs[-1] <= 0.1 * cfg.optim.lr and lrs[-1] <= 0.1 * max(lrs), preset


def test_smoke_limited_by_time_alone_ends_annealed(tmp_path, multi30k_dir):
    """The smoke preset's schedule, trained for 90 s (an update a second) and nothing else:
    the last update's lr is at most a tenth of the peak. (A smaller model and no validation
    along the way, so that the test is quick: neither changes the schedule.)"""
    cfg = compose_config(["experiment=smoke", f"data.root={multi30k_dir}",
                          "data.max_train_pairs=300", "trainer.max_epochs=null",
                          "trainer.max_time=90", "trainer.precision=fp32",
                          "model.num_hiddens=32", "model.ffn_num_hiddens=64",
                          "model.num_heads=2", "model.num_encoder_layers=1",
                          "model.num_decoder_layers=1", "trainer.validate_every_epoch=false",
                          "trainer.validate_every_updates=1000", "trainer.bleu_max_sentences=8",
                          "trainer.prefetch_batches=0"])
    trainer = simulated_trainer(cfg, tmp_path, lambda update: 1.0)
    result = trainer.fit()
    trainer.close()
    assert result.stop_reason == "max_time" and result.state.num_updates == 90
    lrs = [lr for _, lr, _ in trainer.record]
    assert lrs[-1] <= 0.1 * cfg.optim.lr and lrs[-1] < 0.1 * max(lrs)


SMALL_MODEL = ["model.num_hiddens=32", "model.ffn_num_hiddens=64", "model.num_heads=2",
               "model.num_encoder_layers=1", "model.num_decoder_layers=1",
               "trainer.precision=fp32", "trainer.prefetch_batches=0"]


@pytest.fixture
def own_files(multi30k_lines, tmp_path) -> list[str]:
    """A tiny corpus of one's own: 40 training pairs, 8 validation pairs, as plain files."""
    paths = {}
    en, de = multi30k_lines("train.en.gz"), multi30k_lines("train.de.gz")
    for split, (src, tgt) in (("train", (en[:40], de[:40])), ("valid", (en[40:48], de[40:48]))):
        for lang, lines in (("en", src), ("de", tgt)):
            path = tmp_path / f"{split}.{lang}"
            path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
            paths[f"data.{split}_{'src' if lang == 'en' else 'tgt'}"] = path
    return ["data=files", *(f"{key}={path}" for key, path in paths.items())]


def test_own_files_with_no_limit_train_for_the_default_budget_and_say_when_they_end(
        tmp_path, own_files):
    """`data=files` with the four paths and nothing else (the model shrunk, so the test is
    quick): the run gets the default budget, 100 epochs of its corpus, logs it, its
    settings and their reasons, a plan with the time it will take within its first updates,
    and stops by itself, annealed. Killed and started again with the same command, a run
    keeps the budget, vocabulary and settings it chose, and ends with the same losses."""
    cfg = compose_config(own_files + SMALL_MODEL)
    result = train(cfg, tmp_path / "run")
    first = simulated_trainer(cfg, tmp_path / "killed", lambda update: 0.0, stop_after=20)
    assert first.fit().stop_reason == "signal"
    first.close()
    second = Trainer(cfg, tmp_path / "killed", DistEnv())
    assert second.cfg == first.cfg and second.cfg.trainer.max_target_tokens is not None
    rest = second.fit()
    second.close()
    assert rest.stop_reason == "max_target_tokens"
    assert first.losses + rest.losses == result.losses
    log_text = (tmp_path / "run/train.log").read_text()
    budget = next(line for line in log_text.splitlines() if "| budget: " in line)
    epoch_tokens = int(budget.split("corpus's ")[1].split(" target")[0].replace(",", ""))
    assert result.stop_reason == "max_target_tokens"
    assert result.state.target_tokens >= DEFAULT_EPOCHS * epoch_tokens
    assert f"{DEFAULT_EPOCHS} epochs of this corpus's" in budget
    assert "data.vocab_size: 1,000, chosen for the ~" in log_text
    vocab = int(log_text.split("data.vocab_size: ")[-1].split(",")[0].split(" ")[0])
    assert 100 < vocab < 1000  # 40 pairs: the largest vocabulary SentencePiece can build
    settings = next(line for line in log_text.splitlines() if "settings for a budget" in line)
    assert "dropout 0.2 (for 40 to 125 epochs)" in settings  # 100 epochs
    assert "batches of 1,024 tokens an update" in settings and "lr 0.0007 and a warmup" in settings
    assert "the small model (for budgets under 5,500,000 target tokens)" in settings
    assert "(model=auto, data.max_tokens, optim.lr, model.dropout in the config" in settings
    model = next(line for line in log_text.splitlines() if "| model small: " in line)
    assert "num_hiddens=32, ffn_num_hiddens=64, num_heads=2, num_encoder_layers=1" in model
    plans = [line for line in log_text.splitlines() if "| plan: " in line]
    assert plans[0].split("| plan: ")[1].startswith("at update 10, budget ")
    assert "to go, ending about" in plans[0] and len(plans) <= 3
    lrs = [float(line.split("| lr ")[1].split(" |")[0])
           for line in log_text.splitlines() if "| lr " in line]
    assert lrs[-1] <= 0.1 * max(lrs)
    written = (tmp_path / "run/config.yaml").read_text()
    assert f"max_target_tokens: {DEFAULT_EPOCHS * epoch_tokens}" in written
    assert f"vocab_size: {vocab}" in written


def test_a_tiny_corpus_gets_the_vocabulary_sentencepiece_can_build(tmp_path, own_files):
    """40 pairs cannot fill the smallest vocabulary the rule chooses (1,000): the run takes
    the largest SentencePiece can build, and says so, instead of stopping."""
    from transformer.run.data import load_data

    cfg = compose_config(own_files)
    data = load_data(cfg.data, tmp_path)
    assert 100 < data.tokenizers.src.vocab_size < 1000


def test_an_epoch_limit_before_the_budget_says_the_run_ends_uncooled(tmp_path, multi30k_dir,
                                                                    caplog):
    cfg = compose_config(["experiment=smoke", f"data.root={multi30k_dir}",
                          "data.max_train_pairs=200", "trainer.max_epochs=1",
                          "trainer.precision=fp32"])
    with caplog.at_level(logging.INFO, logger="transformer.training.trainer"):
        Trainer(cfg, tmp_path, DistEnv()).close()
    assert "trainer.max_epochs=1 ends the run first, at ~1% of its budget" in caplog.text
    assert "the learning rate is not cooled down" in caplog.text


def test_the_progress_bar_spans_the_whole_run_with_the_time_left(monkeypatch):
    """One bar for the run: its share done never goes back (epochs do not restart it), and
    the time left is the time so far per share done times the share left."""
    from transformer.training.log import Meter

    now = [100.0]
    monkeypatch.setattr("transformer.training.log.time.monotonic", lambda: now[0])
    bar = RunProgress(enabled=True, progress=0.25)
    assert bar.left(0.25) is None  # nothing measured yet
    shown = []
    for step, (progress, epoch) in enumerate([(0.30, 3), (0.40, 4), (0.55, 1)], 1):
        now[0] += 10.0
        bar.update(progress, 60.0 + now[0], step, epoch, Meter())
        shown.append((round(bar.bar.n, 6), bar.bar.desc))
    bar.close()
    assert [n for n, _ in shown] == [30.0, 40.0, 55.0]
    assert bar.left(0.55) == pytest.approx(30.0 / 0.30 * 0.45)  # 45 s
    assert "elapsed, 45 s left | update 3 | epoch 1" in shown[-1][1]
