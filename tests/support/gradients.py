"""One update's gradient, however the batch is split: gloo processes, synthetic and sampled rollouts."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from .tiny import PRESETS, stage_args


class GlooProcesses:
    """What the on-policy update asks of an accelerator, over an initialised gloo process group."""

    device = torch.device("cpu")

    def __init__(self) -> None:
        self.process_index, self.num_processes = torch.distributed.get_rank(), torch.distributed.get_world_size()
        self.is_main_process = self.process_index == 0

    def reduce(self, tensor: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
        out = tensor.clone()
        torch.distributed.all_reduce(
            out, torch.distributed.ReduceOp.MAX if reduction == "max" else torch.distributed.ReduceOp.SUM
        )
        return out

    def gather(self, tensor: torch.Tensor) -> torch.Tensor:
        parts = [torch.empty_like(tensor) for _ in range(self.num_processes)]
        torch.distributed.all_gather(parts, tensor)
        return torch.cat(parts)

    def wait_for_everyone(self) -> None:
        torch.distributed.barrier()


def collected(models, prompts: list[list[int]], cfg, update: int, kl_coef: float, texts=None, stream=None, counts=None):
    """Update `update`'s rollout with its advantages, as `OnPolicySteps.step` collects it in one process
    without autocast; dynamic sampling's tallies go to `counts`."""
    from rlhfkit.onpolicy.advantages import compute_advantages
    from rlhfkit.onpolicy.collect import RolloutSetup, collect
    from rlhfkit.onpolicy.trainer import scoring_plan

    scoring = scoring_plan(models, cfg)
    setup = RolloutSetup(models, prompts, cfg.rollout_options, scoring, "no", texts=texts)
    batch = collect(setup, update, {}, stream=stream, counts=counts)
    return compute_advantages(batch, cfg.advantage_options, kl_coef, scoring.old_logprobs)


def run_update(models, optimizers, batch, cfg, accelerator=None, update: int = 1):
    """`update_on_rollout` on `batch` as the trainer runs it, under `cfg`'s plan in fp32: its `UpdateResult`."""
    from rlhfkit.distributed import ONE_PROCESS
    from rlhfkit.onpolicy.trainer import update_plan
    from rlhfkit.onpolicy.update import update_on_rollout

    return update_on_rollout(
        models=models, optimizers=optimizers, batch=batch, plan=update_plan(models, cfg, "no"), update=update,
        kl_coef=cfg.kl_coef, accelerator=accelerator or ONE_PROCESS,
    )


def synthetic_rollout(policy, pad_id: int, temperature: float, seed: int = 0, group: int = 2):
    """8 episodes, `group` samples of each prompt, with responses of 1 to 6 tokens (three cut at 6
    without EOS), a left-padded first query, rollout log-probabilities a little off the policy's
    (ratios != 1, some clipped), a reference further off, and per-sequence advantages with per-token
    noise."""
    from rlhfkit.onpolicy.scoring import policy_logprobs
    from rlhfkit.rollout import RolloutBatch

    g = torch.Generator().manual_seed(seed)
    rows, width = 8, 6
    lengths = torch.tensor([6, 1, 3, 6, 2, 5, 4, 6])
    query_ids = torch.randint(10, policy.config.vocab_size - 1, (rows // group, 4), generator=g)
    query_ids = query_ids.repeat_interleave(group, dim=0)
    query_mask = torch.ones(rows, 4, dtype=torch.long)
    query_mask[:group, :2] = 0
    query_ids[:group, :2] = pad_id
    mask = torch.arange(width).unsqueeze(0) < lengths.unsqueeze(1)
    responses = torch.randint(10, policy.config.vocab_size - 1, (rows, width), generator=g).masked_fill(~mask, pad_id)
    batch = RolloutBatch(torch.arange(rows) // group, query_ids, query_mask, responses, mask, lengths < width)
    with torch.no_grad():
        current = policy_logprobs(policy, batch, temperature)[0]
    noise = lambda scale: scale * torch.randn(rows, width, generator=g)  # noqa: E731
    advantages = torch.randn(rows, 1, generator=g) + noise(0.3)
    batch.logprobs = (current + noise(0.15)) * mask
    batch.ref_logprobs = (current + noise(0.3)) * mask
    batch.advantages = advantages * mask
    return batch


def one_update_gradient(
    model_dir: Path, options: dict[str, Any], micro_batch_size: int, accelerator=None, lora_rank: int = 0
) -> dict[str, torch.Tensor]:
    """The gradient of one update's loss on `synthetic_rollout` under the GRPO config with `options`:
    the weights' change under SGD at learning rate 1, with `micro_batch_size` rows per pass and the
    rows of the processes of `accelerator` (None: one process). With `lora_rank`, of a LoRA adapter
    (seeded values, its B not zero, as after some training) on the frozen policy: the adapter's change."""
    import dataclasses

    from rlhfkit.config import GRPOConfig
    from rlhfkit.models import load_policy
    from rlhfkit.onpolicy.scoring import OnPolicyModels
    from rlhfkit.onpolicy.update import Optimizers

    # the rollout's own old log-probabilities, a little off the policy's: none from the update's forward
    defaults = {"num_minibatches": 1, "update_epochs": 1, "kl_coef": 0.1, "kl_placement": "loss", "entropy_coef": 0.01,
                "reuse_update_forward": False}
    cfg = dataclasses.replace(
        GRPOConfig(), **(defaults | options), micro_batch_size=micro_batch_size, max_response_length=6
    )
    policy, tokenizer = load_policy(str(model_dir))
    if lora_rank:
        from rlhfkit.adapters import add_adapter
        from rlhfkit.config import LoraOptions

        policy = add_adapter(policy, LoraOptions(rank=lora_rank, alpha=2 * lora_rank, dropout=0.0, target_modules=[]))
        generator = torch.Generator().manual_seed(0)
        for name, param in policy.named_parameters():
            if "lora_" in name:  # the same adapter in every call, its B not zero
                param.data = 0.1 * torch.randn(param.shape, generator=generator)
    policy.train()
    batch = synthetic_rollout(policy, tokenizer.pad_token_id, cfg.temperature, group=cfg.samples_per_prompt)
    before = {k: v.detach().clone() for k, v in policy.named_parameters() if v.requires_grad}
    optimizers = Optimizers(torch.optim.SGD(policy.parameters(), lr=1.0), None, None, None)
    models = OnPolicyModels(policy, policy, None, None, tokenizer)
    run_update(models, optimizers, batch, cfg, accelerator)
    return {k: before[k] - v.detach() for k, v in policy.named_parameters() if k in before}


def k1_update(model_dir: Path, reuse: bool, options: dict[str, Any] | None = None, accelerator=None):
    """(gradient, metrics, old log-probabilities) of one K = 1 GRPO update (SGD at learning rate 1) on
    `synthetic_rollout` with old log-probabilities that are the policy's own: from a separate pass, or
    (`reuse`) from the update's forward, summed across the processes of `accelerator`."""
    import dataclasses

    from rlhfkit.config import GRPOConfig
    from rlhfkit.models import load_policy
    from rlhfkit.onpolicy.scoring import OnPolicyModels, policy_logprobs
    from rlhfkit.onpolicy.update import Optimizers

    cfg = dataclasses.replace(
        GRPOConfig(), update_epochs=1, num_minibatches=1, micro_batch_size=4, kl_coef=0.1, max_response_length=6,
        reuse_update_forward=reuse, **(options or {}),
    )
    policy, tokenizer = load_policy(str(model_dir))
    policy.train()
    batch = synthetic_rollout(policy, tokenizer.pad_token_id, cfg.temperature, group=cfg.samples_per_prompt)
    with torch.no_grad():
        batch.logprobs = policy_logprobs(policy, batch, cfg.temperature)[0] * batch.mask
    if reuse:
        batch.logprobs = None
    before = {k: v.detach().clone() for k, v in policy.named_parameters()}
    optimizers = Optimizers(torch.optim.SGD(policy.parameters(), lr=1.0), None, None, None)
    models = OnPolicyModels(policy, policy, None, None, tokenizer)
    result = run_update(models, optimizers, batch, cfg, accelerator)
    gradient = {k: before[k] - v.detach() for k, v in policy.named_parameters()}
    return gradient, result.metrics, result.old_logprobs if reuse else batch.logprobs


def k1_reuse_worker(rank: int, world: int, port: int, model_dir: str, out: str) -> None:
    """A gloo process of `world`: `k1_update` with reuse; process 0 saves (gradient, old log-probabilities)."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        gradient, _, old = k1_update(Path(model_dir), reuse=True, accelerator=GlooProcesses())
        if rank == 0:
            torch.save((gradient, old), out)
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def assert_same_gradient(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor], what: str) -> None:
    """Two `one_update_gradient`s agree up to float32 summation order, and the update moved something."""
    scale = max(float(w.abs().max()) for w in want.values())
    assert scale > 1e-4, "the update moved nothing: the comparison would prove nothing"
    for key in want:
        torch.testing.assert_close(got[key], want[key], atol=1e-6 * max(1.0, scale), rtol=1e-4, msg=f"{what}: {key}")


def split_invariance_worker(
    rank: int, world: int, port: int, model_dir: str, cases: list[dict[str, Any]], micro: int, out: str
) -> None:
    """A gloo process of `world`: the gradient of every case in `cases`; process 0 saves them to `out`."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        gradients = [one_update_gradient(Path(model_dir), case, micro, GlooProcesses()) for case in cases]
        if rank == 0:
            torch.save(gradients, out)
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def rollout_setup(stage: str, inputs: dict[str, Any], out: Path, preset: str | None = None, **extra: Any):
    """(config, models, training prompts' ids, PromptTexts) of a tiny `stage` run on `inputs`
    (`stage_args`), loaded as the trainer loads them, on the CPU."""
    from rlhfkit.onpolicy import evaluation, trainer
    from rlhfkit.stages import resolve

    cfg = resolve(stage, preset or PRESETS[stage], None, stage_args(stage, inputs, out, **extra))
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    trainer.prepare_for_training(models, cfg)
    return cfg, models, [e.query.ids for e in train], trainer.PromptTexts.of(train)


def sampled_rollout(setup, update: int = 0, accelerator=None):
    """Update `update`'s rollout (sampled, scored, gathered across `accelerator`'s processes) of
    `rollout_setup`'s run, in fp32."""
    from rlhfkit.distributed import ONE_PROCESS
    from rlhfkit.onpolicy.collect import RolloutSetup, collect
    from rlhfkit.onpolicy.trainer import scoring_plan

    cfg, models, prompts, texts = setup
    scoring = scoring_plan(models, cfg)
    setup = RolloutSetup(models, prompts, cfg.rollout_options, scoring, "no", accelerator or ONE_PROCESS, texts)
    return collect(setup, update, {})


def sampled_rollout_worker(rank: int, world: int, port: int, cases: list, out: str) -> None:
    """A gloo process of `world`: the rollout of every (stage, inputs, options) of `cases` at update 1;
    process 0 saves each one's (prompts, responses, mask) to `out`."""
    import tempfile

    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        rollouts = []
        for stage, inputs, options in cases:
            with tempfile.TemporaryDirectory() as folder:
                setup = rollout_setup(stage, inputs, Path(folder) / "run", **options)
                batch = sampled_rollout(setup, 1, GlooProcesses())
            rollouts.append((batch.prompts, batch.responses, batch.mask))
        if rank == 0:
            torch.save(rollouts, out)
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()


def distill_update_gradient(inputs: dict[str, Any], teacher: Path, tmp_path: Path, options: dict[str, Any], micro: int,
                            accelerator=None) -> dict[str, torch.Tensor]:
    """The gradient of one `rlhfkit distill` update (SGD at learning rate 1) on its first sampled rollout, with
    `micro` rows per pass over the rows of `accelerator`'s processes (None: one process): the weights' change."""
    from rlhfkit.onpolicy import evaluation, trainer
    from rlhfkit.onpolicy.update import Optimizers
    from rlhfkit.stages import resolve

    fixed = {"teacher": str(teacher), "micro_batch_size": micro, "reuse_update_forward": "false",
             "update_epochs": 1, "num_minibatches": 1}
    cfg = resolve("distill", None, None, stage_args("distill", inputs, tmp_path / "unused", **options | fixed))
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    trainer.prepare_for_training(models, cfg)
    batch = collected(models, [e.query.ids for e in train], cfg, 0, cfg.kl_coef)
    policy = models.policy
    before = {k: v.detach().clone() for k, v in policy.named_parameters()}
    optimizers = Optimizers(torch.optim.SGD(policy.parameters(), lr=1.0), None, None, None)
    run_update(models, optimizers, batch, cfg, accelerator)
    return {k: before[k] - v.detach() for k, v in policy.named_parameters()}


def distill_split_worker(rank: int, world: int, port: int, inputs: dict[str, str], teacher: str, tmp: str,
                         cases: list[dict[str, Any]], out: str) -> None:
    """A gloo process of `world`: `distill_update_gradient` of every case; process 0 saves them to `out`."""
    os.environ |= {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
    torch.distributed.init_process_group("gloo", rank=rank, world_size=world)
    try:
        paths = {k: Path(v) for k, v in inputs.items()}
        gradients = [distill_update_gradient(paths, Path(teacher), Path(tmp), case, 4, GlooProcesses())
                     for case in cases]
        if rank == 0:
            torch.save(gradients, out)
    finally:
        torch.distributed.barrier()
        torch.distributed.destroy_process_group()
