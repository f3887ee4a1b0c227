import json
import random
import sys
import types

import numpy as np
import pytest
import torch

from rlhfkit.checkpoint import find_checkpoint, load_training_state, rng_state, save_checkpoint, set_rng_state
from rlhfkit.stages import resolve
from rlhfkit.tracking import Tracker, read_metrics
from rlhfkit.trainers.supervised import batch_indices, plan_schedule


def optimizer_and_scheduler(model):
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, eps=1e-5)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 / (1 + s))
    return optimizer, scheduler


def test_rng_state_round_trip_restores_python_numpy_and_torch():
    state = rng_state()
    expected = (random.random(), np.random.rand(), torch.rand(1).item())
    set_rng_state(json.loads(json.dumps(state)))
    assert (random.random(), np.random.rand(), torch.rand(1).item()) == expected


def test_checkpoint_restores_optimizer_and_scheduler_and_survives_a_crash_mid_save(tiny_model, tmp_path):
    model, tok = tiny_model
    optimizer, scheduler = optimizer_and_scheduler(model)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    scheduler.step()
    save_checkpoint(tmp_path, 1, model, tok, optimizer, scheduler, {"examples_seen": 4})
    # A crash while writing step 2 leaves only a temporary folder: the latest stays step 1.
    (tmp_path / "checkpoints" / ".tmp-step-000002-abc").mkdir()
    ckpt = find_checkpoint(tmp_path)
    assert ckpt.name == "step-000001"
    fresh_opt, fresh_sched = optimizer_and_scheduler(model)
    state = load_training_state(ckpt, fresh_opt, fresh_sched)
    assert state == {"step": 1, "examples_seen": 4}
    assert fresh_sched.last_epoch == 1
    saved = optimizer.state_dict()["state"][0]["exp_avg"]
    torch.testing.assert_close(fresh_opt.state_dict()["state"][0]["exp_avg"], saved)
    assert (ckpt / "model" / "model.safetensors").is_file() and not list(ckpt.glob("**/*.bin"))


def test_old_checkpoints_are_pruned_and_stale_temporaries_removed(tiny_model, tmp_path):
    model, tok = tiny_model
    optimizer, scheduler = optimizer_and_scheduler(model)
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / ".tmp-step-000009-x").mkdir()
    for step in (1, 2, 3):
        save_checkpoint(tmp_path, step, model, tok, optimizer, scheduler, {}, keep=2)
    names = sorted(p.name for p in (tmp_path / "checkpoints").iterdir())
    assert names == ["latest", "step-000002", "step-000003"]


def test_data_order_is_a_function_of_seed_and_step_and_reshuffles_each_epoch():
    cfg = resolve("sft", None, None, {"total_batch_size": 4, "micro_batch_size": 2})
    schedule = plan_schedule(cfg, examples=8, processes=1)
    assert schedule.steps_per_epoch == 2 and schedule.accumulation == 2
    epoch0 = batch_indices(schedule, 1, 0, 0) + batch_indices(schedule, 1, 1, 0)
    epoch1 = batch_indices(schedule, 1, 2, 0) + batch_indices(schedule, 1, 3, 0)
    assert sorted(sum(epoch0, [])) == list(range(8)) == sorted(sum(epoch1, []))  # without replacement
    assert epoch0 != epoch1
    # a schedule planned afresh, with the global random streams moved on, draws the same order: it depends on
    # nothing but the seed and the step (no state kept between calls, no global stream read)
    random.random(), np.random.random(), torch.rand(1)
    again = plan_schedule(resolve("sft", None, None, {"total_batch_size": 4, "micro_batch_size": 2}), 8, 1)
    assert batch_indices(again, 1, 3, 0) == batch_indices(schedule, 1, 3, 0)
    assert batch_indices(again, 1, 0, 0) + batch_indices(again, 1, 1, 0) == epoch0
    two = plan_schedule(cfg, examples=8, processes=2)
    ranks = batch_indices(two, 1, 0, 0) + batch_indices(two, 1, 0, 1)
    assert sorted(sum(ranks, [])) == sorted(sum(batch_indices(schedule, 1, 0, 0), []))


def test_length_bucketed_micro_batches_hold_the_same_examples_with_less_padding():
    cfg = resolve("sft", None, None, {"total_batch_size": 8, "micro_batch_size": 2})
    schedule = plan_schedule(cfg, examples=32, processes=1)
    lengths = [(i * 37) % 500 + 20 for i in range(32)]
    for step in range(4):
        plain, bucketed = batch_indices(schedule, 1, step, 0), batch_indices(schedule, 1, step, 0, lengths)
        assert sorted(sum(plain, [])) == sorted(sum(bucketed, []))  # the optimizer step sees the same examples
        flat = sum(bucketed, [])
        assert [lengths[i] for i in flat] == sorted(lengths[i] for i in flat)

        def padded(micro_batches):
            return sum(len(m) * max(lengths[i] for i in m) for m in micro_batches)

        assert padded(bucketed) <= padded(plain)


def test_a_batch_that_does_not_divide_is_refused_with_the_config_and_by_the_schedule_on_more_processes():
    from rlhfkit.errors import ConfigError

    with pytest.raises(ConfigError, match="total_batch_size=6"):
        resolve("sft", None, None, {"total_batch_size": 6, "micro_batch_size": 4})
    cfg = resolve("sft", None, None, {"total_batch_size": 6, "micro_batch_size": 2})
    with pytest.raises(ConfigError, match="total_batch_size=6"):
        plan_schedule(cfg, examples=100, processes=2)


def test_tracker_writes_jsonl_and_tensorboard_and_forgets_metrics_after_resume_step(tmp_path):
    tracker = Tracker(tmp_path, ["tensorboard"], {})
    for step in (1, 2, 3):
        tracker.log(step, {"train/loss": 1.0 / step})
    tracker.close()
    assert list((tmp_path / "tb").glob("events.out.tfevents.*"))
    Tracker(tmp_path, [], {}, resume_step=2).close()
    assert [r["step"] for r in read_metrics(tmp_path)] == [1, 2]


def test_tracker_sends_metrics_to_wandb_when_asked(tmp_path, monkeypatch):
    logged = []
    run = types.SimpleNamespace(
        log=lambda metrics, step: logged.append((step, metrics)), finish=lambda: logged.append("finished")
    )
    fake = types.ModuleType("wandb")
    fake.init = lambda **kwargs: run
    monkeypatch.setitem(sys.modules, "wandb", fake)
    tracker = Tracker(tmp_path, ["wandb"], {"lr": 1})
    tracker.log(5, {"train/loss": 0.5})
    tracker.close()
    assert logged == [(5, {"train/loss": 0.5}), "finished"]


def test_unknown_tracker_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="unknown tracker"):
        Tracker(tmp_path, ["mlflow"], {})
