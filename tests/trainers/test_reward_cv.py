"""Post-disjoint K-fold cross-validation of reward models (`rlhfkit rm cross_validation_folds=K`)."""

import json
import shutil
from collections import Counter

import pytest

from rlhfkit.cli import main as cli_main
from rlhfkit.data.split import prompt_folds
from rlhfkit.errors import ConfigError
from rlhfkit.trainers import reward_cv

from ..support.data import data_file
from ..support.tiny import cli_args, stage_args

DATA = data_file("summarize-from-feedback-comparisons", "batch18.jsonl.gz")


def test_prompt_folds_keep_each_prompt_in_one_fold_and_balance_their_sizes():
    keys = [f"post-{i % 23}" for i in range(100)]
    folds = prompt_folds(keys, 5, seed=1)
    fold_of_prompt = {}
    for key, fold in zip(keys, folds, strict=True):
        assert fold_of_prompt.setdefault(key, fold) == fold
    sizes = Counter(fold_of_prompt.values())
    assert set(sizes) == set(range(5)) and max(sizes.values()) - min(sizes.values()) <= 1
    assert prompt_folds(keys[::-1], 5, seed=1) == folds[::-1]  # the keys decide, not the order
    assert prompt_folds(keys, 5, seed=2) != folds
    for bad in (1, 24):
        with pytest.raises(ConfigError, match="folds"):
            prompt_folds(keys, bad, seed=1)


def rm_args(model_dir, out, **extra) -> list[str]:
    """A tiny 3-fold cross-validated RM run on the first 36 pairs of batch 18."""
    options = {"max_steps": 2, "max_query_length": 96, "max_response_length": 48, "max_pairs": 36, "eval_pairs": 8,
               "cross_validation_folds": 3} | extra
    return [
        "rm",
        "--preset",
        "tldr-rm",
        *cli_args(stage_args("rm", {"policy": model_dir, "pairs": DATA}, out, **options)),
    ]


def interrupt_during_cross_validation(out) -> None:
    """Leave `out` as a run stopped while cross-validating leaves it: no final model, no checkpoint."""
    for folder in ("model", "checkpoints"):
        shutil.rmtree(out / folder)


@pytest.fixture
def recorded(monkeypatch):
    """Every fold: the prompts its model trained on and the prompts it scored."""
    calls = []
    real_train, real_fold = reward_cv.train, reward_cv.train_fold

    def train(cfg, stage, run_dir, checkpoint=None, resume=None):
        calls[-1]["trained"] = [
            getattr(e, "record", None) and e.record.prompt_id for e in stage.examples
        ]  # cached features: None
        return real_train(cfg, stage, run_dir, checkpoint, resume)

    def train_fold(cfg, initial, make_stage, score, examples, train_idx, held_idx, fold_dir):
        calls.append(
            {"fold": fold_dir.name, "held": [examples[i].record.prompt_id for i in held_idx], "pairs": len(examples)}
        )
        return real_fold(cfg, initial, make_stage, score, examples, train_idx, held_idx, fold_dir)

    monkeypatch.setattr(reward_cv, "train", train)
    monkeypatch.setattr(reward_cv, "train_fold", train_fold)
    return calls


def test_cross_validation_scores_every_pair_once_with_a_model_that_never_saw_its_prompt(
    tiny_model_dir, tmp_path, recorded
):
    out = tmp_path / "rm"
    assert cli_main([*rm_args(tiny_model_dir, out, validation_fraction=0.2)]) == 0
    assert [c["fold"] for c in recorded] == ["fold-0", "fold-1", "fold-2"]
    pairs = recorded[0]["pairs"]
    for call in recorded:
        assert not set(call["trained"]) & set(call["held"])  # post-disjoint
        assert len(call["trained"]) + len(call["held"]) == pairs  # every other pair trains the fold model
    assert sum(len(c["held"]) for c in recorded) == pairs
    evaluation = json.loads((out / "cross_validation" / "rm_eval.json").read_text())
    assert evaluation["pairs"] == pairs >= 24 and "cross-validation" in evaluation["protocol"]
    assert {"length_rule", "model_minus_rule_low", "chosen_shorter_accuracy"} <= set(evaluation["breakdown"]["overall"])
    assert not (out / "cross_validation" / "fold-0" / "checkpoints").exists()  # fold models are not kept
    assert (out / "model").is_dir() and (out / "rm_eval" / "rm_eval.json").is_file()  # then the final model, as usual
    assert "Cross-validation" in (out / "report.html").read_text()

    first = json.loads((out / "cross_validation" / "fold-1.json").read_text())
    interrupt_during_cross_validation(out)
    (out / "cross_validation" / "fold-1.json").unlink()
    recorded.clear()
    assert cli_main([*rm_args(tiny_model_dir, out, validation_fraction=0.2)]) == 0
    assert [c["fold"] for c in recorded] == ["fold-1"]  # finished folds are read back, not retrained
    again = json.loads((out / "cross_validation" / "fold-1.json").read_text())
    assert again["indices"] == first["indices"] and again["chosen"] == pytest.approx(first["chosen"], abs=1e-6)


def test_cross_validation_balances_only_the_fold_training_pairs_and_refuses_a_foreign_fold_file(
    tiny_model_dir, tmp_path, recorded
):
    out = tmp_path / "rm"
    args = rm_args(
        tiny_model_dir, out, validation_fraction=0, trainable_layers=0, length_balance="true", total_batch_size=4
    )
    assert cli_main(args) == 0
    for call in recorded:
        assert len(call["trained"]) + len(call["held"]) < call["pairs"]  # the majority side was subsampled for training
    evaluation = json.loads((out / "cross_validation" / "rm_eval.json").read_text())
    assert evaluation["pairs"] == recorded[0]["pairs"]  # but every pair is scored
    recorded.clear()
    assert cli_main([*args, "learning_rate=5e-4"]) == 2  # other options: the finished run is not written over
    assert cli_main([*args, "learning_rate=5e-4", "overwrite=true"]) == 0
    assert [c["fold"] for c in recorded] == [
        "fold-0",
        "fold-1",
        "fold-2",
    ]  # no fold file of the run moved aside is reused
    interrupt_during_cross_validation(out)
    fold = json.loads((out / "cross_validation" / "fold-0.json").read_text())
    fold["indices"] = fold["indices"][1:]
    (out / "cross_validation" / "fold-0.json").write_text(json.dumps(fold))
    assert cli_main([*args, "learning_rate=5e-4"]) == 2  # one line naming the file, no traceback
