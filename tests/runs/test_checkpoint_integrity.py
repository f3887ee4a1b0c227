"""Checkpoint manifests: a damaged newest checkpoint is reported and an older intact one resumed."""

import errno
import json
import os
import shutil

import pytest
import torch

from rlhfkit import checkpoint as ckpt_mod
from rlhfkit.checkpoint import MANIFEST, file_sha256, find_checkpoint, load_training_state, save_checkpoint
from rlhfkit.cli import main
from rlhfkit.errors import CheckpointError, DiskFullError
from rlhfkit.models import load_policy


def save_steps(run_dir, tiny_model, steps):
    """Checkpoints `steps` of a model that took one AdamW step, so state.pt holds optimizer moments."""
    model, tok = tiny_model
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    optimizer.step()
    for step in steps:
        save_checkpoint(run_dir, step, model, tok, optimizer, scheduler, {"examples_seen": step})
    return optimizer, scheduler


@pytest.fixture(scope="module")
def two_checkpoints(tmp_path_factory, tiny_model_dir):
    """A run folder with checkpoints 2 and 4, saved once and copied by `run` for each test."""
    run_dir = tmp_path_factory.mktemp("two-checkpoints")
    save_steps(run_dir, load_policy(str(tiny_model_dir)), [2, 4])
    return run_dir


@pytest.fixture
def run(two_checkpoints, tmp_path):
    return shutil.copytree(two_checkpoints, tmp_path / "run")


def truncate(path):
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flip_bytes(path):
    data = bytearray(path.read_bytes())
    middle = len(data) // 2
    data[middle : middle + 8] = bytes(b ^ 0xFF for b in data[middle : middle + 8])
    path.write_bytes(bytes(data))


def drop_manifest_and_state(folder):
    (folder / MANIFEST).unlink()
    (folder / "state.pt").unlink()


def warnings(capsys):
    """What rlhfkit wrote to stderr, without the progress bars of saving and loading."""
    return [line for line in capsys.readouterr().err.splitlines() if line.startswith("rlhfkit:")]


def test_manifest_lists_every_other_file_with_its_size_and_sha256(run):
    folder = run / "checkpoints" / "step-000004"
    listed = json.loads((folder / MANIFEST).read_text())["files"]
    files = [p for p in folder.rglob("*") if p.is_file() and p.name != MANIFEST]
    on_disk = {p.relative_to(folder).as_posix(): p for p in files}
    assert listed.keys() == on_disk.keys()  # so nothing was written after it
    assert {"model/model.safetensors", "state.pt", "rng.json", "trainer.json"} <= listed.keys()
    for name, path in on_disk.items():
        assert listed[name] == {"size": path.stat().st_size, "sha256": file_sha256(path)}


@pytest.mark.parametrize(
    ("damage", "damaged_file", "reason"),
    [
        (truncate, "model/model.safetensors", "bytes, manifest.json says"),
        (flip_bytes, "state.pt", "does not match its sha256"),
        (lambda path: path.unlink(), "rng.json", "is missing"),
        (truncate, MANIFEST, "is unreadable"),
        (lambda path: drop_manifest_and_state(path.parent), "state.pt", "there is no manifest.json"),
    ],
    ids=["truncated-weights", "flipped-state", "deleted-file", "truncated-manifest", "old-incomplete"],
)
def test_a_damaged_newest_checkpoint_is_reported_and_the_older_one_used(run, capsys, damage, damaged_file,
                                                                       reason):
    newest = run / "checkpoints" / "step-000004"
    damage(newest / damaged_file)
    assert find_checkpoint(run) == run / "checkpoints" / "step-000002"
    (line,) = warnings(capsys)
    assert line.startswith("rlhfkit: warning: skipping checkpoint step-000004:")
    assert f"step-000004/{damaged_file}" in line and reason in line


def test_flipped_bytes_of_unchanged_size_are_caught_by_the_hash(run, capsys):
    weights = run / "checkpoints" / "step-000004" / "model" / "model.safetensors"
    size = weights.stat().st_size
    flip_bytes(weights)
    assert weights.stat().st_size == size
    assert find_checkpoint(run) == run / "checkpoints" / "step-000002"
    (line,) = warnings(capsys)
    assert "step-000004/model/model.safetensors does not match its sha256 in manifest.json" in line


def test_a_checkpoint_saved_before_manifests_is_used_with_a_warning_when_complete(run, capsys):
    (run / "checkpoints" / "step-000004" / MANIFEST).unlink()
    assert find_checkpoint(run) == run / "checkpoints" / "step-000004"
    (line,) = warnings(capsys)
    assert "step-000004 has no manifest.json" in line and "unverified" in line


def test_a_checkpoint_named_directly_is_never_swapped_for_another(run):
    newest = run / "checkpoints" / "step-000004"
    assert find_checkpoint(newest) == newest
    truncate(newest / "state.pt")
    with pytest.raises(CheckpointError, match=r"step-000004 is damaged: .*state.pt has \d+ bytes"):
        find_checkpoint(newest)


@pytest.mark.parametrize(
    ("pointer", "expected", "warning"),
    [
        ({"checkpoint": "step-000006", "step": 6}, "step-000004", "step-000006 does not exist"),
        (None, "step-000004", "latest is missing"),
        ("{not json", "step-000004", "latest is unreadable"),
        ({"checkpoint": "step-000002", "step": 2}, "step-000002", None),  # step 4: left over, not resumed
    ],
    ids=["names-a-missing-folder", "missing", "unreadable", "names-an-older-one"],
)
def test_the_latest_pointer_is_followed_and_a_broken_one_reported(run, capsys, pointer, expected, warning):
    latest = run / "checkpoints" / "latest"
    if pointer is None:
        latest.unlink()
    else:
        latest.write_text(pointer if isinstance(pointer, str) else json.dumps(pointer))
    assert find_checkpoint(run) == run / "checkpoints" / expected
    lines = warnings(capsys)
    assert ([warning in line for line in lines] == [True]) if warning else lines == []


def test_a_checkpoint_newer_than_latest_is_a_leftover_never_resumed(run):
    (run / "checkpoints" / "latest").write_text(json.dumps({"checkpoint": "step-000002", "step": 2}))
    truncate(run / "checkpoints" / "step-000002" / "state.pt")
    with pytest.raises(CheckpointError, match=r"no intact checkpoint .*step-000002/state.pt has"):
        find_checkpoint(run)


def test_resume_with_every_checkpoint_damaged_exits_2_with_one_line(run, capsys):
    truncate(run / "checkpoints" / "step-000004" / "model" / "model.safetensors")
    flip_bytes(run / "checkpoints" / "step-000002" / "state.pt")
    capsys.readouterr()
    assert main(["sft", f"resume={run}"]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert all(line.startswith("rlhfkit: ") for line in lines)  # no traceback
    (error,) = [line for line in lines if line.startswith("rlhfkit: error:")]
    assert "no intact checkpoint" in error and "step-000004/model/model.safetensors" in error
    assert "step-000002/state.pt" in error


def test_a_save_that_fails_half_way_leaves_the_previous_checkpoint_usable(tiny_model, tmp_path, monkeypatch,
                                                                          capsys):
    optimizer, scheduler = save_steps(tmp_path, tiny_model, [2])
    model, tok = tiny_model

    def disk_full(obj, f):  # the model and tokenizer are written; state.pt only in part
        f.write(b"\0" * 100)
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(torch, "save", disk_full)
    with pytest.raises(DiskFullError, match="no space left on device in .*checkpoints while writing checkpoint "
                                            "step-000004"):
        save_checkpoint(tmp_path, 4, model, tok, optimizer, scheduler, {"examples_seen": 4})
    monkeypatch.undo()
    assert not list((tmp_path / "checkpoints").glob(".tmp-step-*"))  # the half-written folder gave its space back

    found = find_checkpoint(tmp_path)
    assert found == tmp_path / "checkpoints" / "step-000002" and warnings(capsys) == []
    fresh = torch.optim.AdamW(model.parameters(), lr=1e-3)
    state = load_training_state(found, fresh, torch.optim.lr_scheduler.LambdaLR(fresh, lambda s: 1.0))
    assert state == {"step": 2, "examples_seen": 2}
    moments = [opt.state_dict()["state"][0]["exp_avg"] for opt in (fresh, optimizer)]
    torch.testing.assert_close(*moments)
    loaded, _ = load_policy(str(found / "model"))
    torch.testing.assert_close(loaded.state_dict(), model.state_dict())


def test_verification_hashes_once_until_a_file_changes(run, monkeypatch, capsys):
    flip_bytes(run / "checkpoints" / "step-000004" / "state.pt")
    hashed = []
    monkeypatch.setattr(ckpt_mod, "file_sha256", lambda path: hashed.append(path) or file_sha256(path))
    assert find_checkpoint(run).name == "step-000002"
    first = len(hashed)
    assert find_checkpoint(run).name == "step-000002"
    assert len(hashed) == first and len(warnings(capsys)) == 1  # the warning once, too

    state = run / "checkpoints" / "step-000002" / "state.pt"
    before = state.stat()
    flip_bytes(state)
    # the same size, and a modification time later than the verdict's, as a write a moment later leaves
    os.utime(state, ns=(before.st_atime_ns, before.st_mtime_ns + 10**9))
    with pytest.raises(CheckpointError, match="no intact checkpoint"):
        find_checkpoint(run)


def test_a_run_killed_during_its_first_save_has_no_checkpoint(tmp_path):
    (tmp_path / "checkpoints" / ".tmp-step-000002-x" / "model").mkdir(parents=True)
    assert find_checkpoint(tmp_path) is None


def test_fault_points_fire_only_where_rlhfkit_fault_names_them(monkeypatch):
    from rlhfkit import faults

    killed = []
    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: killed.append((pid, sig)))
    monkeypatch.delenv(faults.ENV, raising=False)
    faults.fault_point("save", 1)
    monkeypatch.setenv(faults.ENV, "save:2")
    faults.fault_point("save", 1)
    faults.fault_point("publish", 2)
    assert killed == []
    faults.fault_point("save", 2)
    assert killed == [(faults.os.getpid(), faults.signal.SIGKILL)]


def test_a_misspelt_fault_point_is_refused_rather_than_never_firing(monkeypatch):
    from rlhfkit import faults

    monkeypatch.setattr(faults.os, "kill", lambda pid, sig: pytest.fail("no point may fire"))
    monkeypatch.setenv(faults.ENV, "sav:1")
    with pytest.raises(ValueError, match="RLHFKIT_FAULT: no fault point 'sav'; the points are save, publish"):
        faults.fault_point("save", 1)
    monkeypatch.delenv(faults.ENV)
    with pytest.raises(ValueError, match="fault_point: no fault point 'publsh'"):
        faults.fault_point("publsh", 1)
