"""The learning-rate schedule fitted to a budget (schedule.py): its factor against the
formulas, the plan, the batch size, dropout and lr chosen by the budget, and training runs
limited by time (on a simulated clock whose speed changes mid-run), by target tokens and by
updates, killed and resumed in the cooldown."""

from __future__ import annotations

import logging
import math
import shutil
from itertools import pairwise

import pytest

from transformer import checkpoint as ckpt
from transformer.config import compose_config
from transformer.errors import ConfigError
from transformer.runtime import DistEnv
from transformer.schedule import (
    BUDGET_SETTINGS,
    Budget,
    Schedule,
    budget_settings,
    fit_to_budget,
    lr_lambda,
)
from transformer.training import Trainer, train

pytestmark = pytest.mark.usefixtures("one_thread")  # see conftest.py


@pytest.fixture
def small(multi30k_dir, spm_model) -> list[str]:
    """A run of a few seconds on a 2+2-layer d32 model, float32, a cooldown over the last
    20% of the budget (each test sets the budget)."""
    return [
        f"data.root={multi30k_dir}", f"data.spm_model={spm_model}", "data.vocab_size=500",
        "data.max_train_pairs=200", "data.max_tokens=512",
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


@pytest.mark.parametrize("override, message", [
    ("optim.cooldown=1.5", "optim.cooldown must be a share of the budget in [0, 1]"),
    ("optim.warmup_fraction=0", "optim.warmup_fraction must be in (0, 1] or null"),
    ("trainer.validate_after_budget=1", "trainer.validate_after_budget must be a share"),
    ("trainer.max_target_tokens=0", "trainer.max_target_tokens must be a positive integer"),
])
def test_bad_schedule_values_are_one_line_errors(override, message):
    with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace("[", r"\[")):
        compose_config(["experiment=smoke", override])


def test_a_share_of_the_budget_needs_a_budget_and_one_cooldown_at_a_time():
    with pytest.raises(ConfigError, match="optim.cooldown=0.2 is a share of the budget, but "
                                          "the run has none"):
        compose_config(["experiment=smoke", "trainer.max_epochs=null", "optim.cooldown=0.2"])
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
    with caplog.at_level(logging.INFO, logger="transformer.schedule"):
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
    assert plans[0].startswith("plan: budget 300 s; 300 updates expected (at update 10)")
    assert any("120 updates expected" in p for p in plans[1:])


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
    assert "plan: budget 20,000 target tokens;" in log_text
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


# ---- the settings chosen by the budget ---------------------------------------------------


@pytest.mark.parametrize("budget, speed, batch", [
    (Budget(max_target_tokens=5_500_000), None, 2048),
    (Budget(max_target_tokens=20_000_000), None, 4096),
    (Budget(max_target_tokens=61_000_000), None, 8192),
    (Budget(max_target_tokens=61_000_000, max_time=1800), 3_000, 2048),  # 5.4M tokens
    (Budget(max_target_tokens=61_000_000, max_time=1800), 8_000, 2048),  # 14.4M
    (Budget(max_target_tokens=61_000_000, max_time=1800), 12_000, 4096),  # 21.6M
    (Budget(max_target_tokens=61_000_000, max_time=5300), 8_000, 4096),  # 42.4M
    (Budget(max_target_tokens=61_000_000, max_time=5300), 12_000, 8192),  # 61M of 63.6M
    (Budget(max_time=5300), 8_000, 4096),
    (Budget(max_updates=1000), None, 2048),  # at most 4.1M tokens in 4,096-token batches
    (Budget(max_updates=8000), None, 8192),  # Wu et al.'s 8,000 updates
    (Budget(), None, 8192),  # no limit in tokens: the settings for the largest budgets
])
def test_the_budget_chooses_the_row_for_the_tokens_it_allows(budget, speed, batch):
    assert budget_settings(budget, speed).update_tokens == batch


def test_the_rows_grow_with_the_budget():
    rows = BUDGET_SETTINGS
    assert rows[0].from_tokens == 0
    for key in ("from_tokens", "update_tokens", "dropout", "lr"):
        values = [getattr(row, key) for row in rows]
        assert values == sorted(values) and len(set(values)) == len(values), key


@pytest.mark.parametrize("tokens, settings", [
    (5_500_000, ["data.max_tokens=2048", "model.dropout=0.1", "optim.lr=0.002",
                 "optim.warmup_fraction=0.15"]),
    (20_000_000, ["data.max_tokens=4096", "model.dropout=0.2", "optim.lr=0.003",
                  "optim.warmup_fraction=0.15"]),
    (61_000_000, ["data.max_tokens=8192", "model.dropout=0.3", "optim.lr=0.005"]),
])
def test_the_recipe_at_a_token_budget_is_the_run_measured_there(tokens, settings):
    """The rows are the runs of docs/RESULTS.md ("Budgets": bench/budget.py's small_2k and
    mid_4k arms, Wu et al.'s settings): the recipe filled in at their budgets is the config
    those runs trained with, key for key."""
    recipe = compose_config([f"trainer.max_target_tokens={tokens}"])
    measured = compose_config([f"trainer.max_target_tokens={tokens}", *settings])
    assert fit_to_budget(recipe, budget_settings(Budget.of(recipe))) == measured


def test_the_budget_fills_only_what_the_config_leaves_null():
    recipe = compose_config(["trainer.max_target_tokens=5500000"])
    assert (recipe.data.max_tokens, recipe.model.dropout, recipe.optim.lr) == (None,) * 3
    row = budget_settings(Budget.of(recipe))
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
    with caplog.at_level(logging.INFO, logger="transformer.training"):
        measured = Trainer(cfg, tmp_path / "measured", DistEnv())
    measured.close()
    speed = measured._tokens_per_second
    assert speed > 0 and measured.state.train_time > 0
    assert measured.budget_settings == budget_settings(Budget.of(cfg), speed)
    assert f"{speed:,.0f} target tokens/s measured" in caplog.text

    monkeypatch.setattr(Trainer, "_measure_speed", lambda self: 1e6)  # 300M tokens: Wu's
    first = simulated_trainer(cfg, tmp_path / "b", slows_down, stop_after=40)
    assert first.fit().stop_reason == "signal"
    first.close()
    large = BUDGET_SETTINGS[-1]
    assert first.budget_settings == large
    assert (first.cfg.data.max_tokens, first.cfg.model.dropout, first.cfg.optim.lr) == (
        large.update_tokens, large.dropout, large.lr)
    written = (tmp_path / "b/config.yaml").read_text()
    assert f"max_tokens: {large.update_tokens}" in written and f"lr: {large.lr}" in written
    saved = ckpt.load_checkpoint(tmp_path / "b/checkpoints/checkpoint_last.pt")
    assert saved["budget_settings"]["update_tokens"] == large.update_tokens

    def slower(self):
        raise AssertionError("a resumed run measures nothing")

    monkeypatch.setattr(Trainer, "_measure_speed", slower)
    shutil.copytree(tmp_path / "b", tmp_path / "older")  # as an older version saved it:
    del saved["budget_settings"]  # no row, only the config it trained with
    ckpt.save_checkpoint(saved, tmp_path / "older/checkpoints/checkpoint_last.pt")
    older = Trainer(cfg, tmp_path / "older", DistEnv())
    older.close()
    assert older.cfg == first.cfg
    second = simulated_trainer(cfg, tmp_path / "b", slows_down)
    assert second.budget_settings == large and second.cfg == first.cfg
    assert second.fit().stop_reason == "max_time"
    second.close()
