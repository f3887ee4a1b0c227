"""`eval gsm8k` answers on the device a model runs on outside training (devices.default_device: the GPU where there
is one), as `generate` and `rm-eval` do, with the reference of its KL beside the policies."""

import json

import torch

from rlhfkit.config import Gsm8kEvalConfig
from rlhfkit.eval import gsm8k


def test_every_policy_and_the_reference_are_moved_to_the_default_device(monkeypatch, tiny_model_dir, tmp_path):
    asked = []
    monkeypatch.setattr(gsm8k, "default_device", lambda: asked.append(1) or torch.device("cpu"))
    moved = []
    to = torch.nn.Module.to
    monkeypatch.setattr(
        torch.nn.Module, "to", lambda module, *args, **kw: moved.append(args) or to(module, *args, **kw)
    )
    problems = tmp_path / "problems.jsonl"
    problems.write_text(
        "".join(json.dumps({"question": f"What is {a} * 3?", "answer": f"#### {3 * a}"}) + "\n" for a in (2, 4))
    )
    cfg = Gsm8kEvalConfig(
        data=[str(problems)],
        models=[f"a={tiny_model_dir}", f"b={tiny_model_dir}"],
        reference_model=str(tiny_model_dir),
        pass_k=2,
        max_response_length=2,
        generation_batch_size=4,
        out=str(tmp_path / "eval"),
    )
    assert gsm8k.run(cfg) == 0
    assert len(asked) == 3 and moved.count((torch.device("cpu"),)) >= 3  # the reference, then each policy
