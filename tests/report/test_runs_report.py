"""`rlhfkit report`: runs side by side."""

import json

from rlhfkit.cli import main as cli_main


def fake_run(folder, stage, rows, evaluation=None):
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text(f"stage: {stage}\nlearning_rate: 1.0e-05\n")
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    if evaluation:
        (folder / "eval.json").write_text(json.dumps(evaluation))
    return folder


def test_on_policy_runs_line_up_by_episodes_and_last_values_are_tabled(tmp_path, capsys):
    ppo = fake_run(
        tmp_path / "ppo",
        "ppo",
        [
            {"step": s, "episodes": 16 * s, "objective/scores": -0.5 + 0.1 * s, "val/explained_variance": 0.1}
            for s in (1, 2, 3)
        ],
        {"eval/ppo_rm_score": 0.2},
    )
    grpo = fake_run(
        tmp_path / "grpo",
        "grpo",
        [{"step": s, "episodes": 32 * s, "objective/scores": -0.4, "loss/kl_avg": 0.01} for s in (1, 2)],
    )
    out = tmp_path / "report"
    assert cli_main(["report", f"runs={ppo},{grpo}", f"out={out}"]) == 0
    assert "1 shared metrics against episodes" in capsys.readouterr().out
    assert (out / "plots" / "objective_scores.png").is_file()
    assert not (out / "plots" / "loss_kl_avg.png").exists()  # logged by one run only
    html = (out / "report.html").read_text()
    assert "<td>ppo</td><td>ppo</td>" in html and "<td>-0.200</td>" in html and "<td>64</td>" in html
    assert "eval/ppo_rm_score" in html


def test_runs_without_metrics_are_refused(tmp_path, capsys):
    assert cli_main(["report", f"runs={tmp_path}"]) == 2
    assert "has no metrics.jsonl" in capsys.readouterr().err


def test_runs_without_episodes_use_steps(tmp_path, capsys):
    a = fake_run(tmp_path / "a", "sft", [{"step": 1, "train/loss": 2.0}])
    b = fake_run(tmp_path / "b", "rm", [{"step": 1, "train/loss": 0.7}])
    assert cli_main(["report", f"runs={a},{b}", f"out={tmp_path / 'out'}"]) == 0
    assert "against step" in capsys.readouterr().out
