"""The same samples however a batch is split: every row draws from its own RNG, keyed by (seed, update,
stream, prompt index in the update, sample index) and advanced once per decoding step
(`generation.SampleKeys`), so a response does not depend on `generation_batch_size`, the length sort,
the process count or what else shares its generation chunk.

Every on-policy method is sampled at update 1 with generation chunks of one group, two groups and the
whole batch, and on 2 gloo processes with chunks of two groups: the same prompts and tokens. Different
chunks pad queries to other widths, which moves logits by float rounding only; at fp32 on the tiny
model no token flips (the exact comparisons below). The old per-chunk RNG fails the same comparison.
"""

import pytest
import torch
import torch.multiprocessing as mp

from rlhfkit import generation
from rlhfkit.ops import sample_rows

from ..support.gradients import rollout_setup, sampled_rollout, sampled_rollout_worker
from ..support.processes import free_port

FIXED = "tests.support.episodes:FixedTextEnv"
GROUPED = {"total_batch_size": 16, "samples_per_prompt": 4, "micro_batch_size": 8, "forward_batch_size": 8}
EPISODES = {
    "prompt_format": "gsm8k",
    "environment": FIXED,
    "environment_args": {"user_turns": 1, "pause_every": 6},
    "max_response_length": 32,
    "max_query_length": 256,
}
# (stage, which inputs, options): each on-policy command, the methods whose sampling differs (ReMax's greedy
# baseline, DAPO's refilling draws) and multi-turn episodes
METHODS = {
    "ppo": ("ppo", "tldr", {}),
    "grpo": ("grpo", "tldr", GROUPED),
    "rloo": ("rloo", "tldr", GROUPED),
    "reinforce": ("reinforce", "tldr", {}),
    "remax": ("reinforce", "tldr", {"advantage_estimator": "remax"}),
    "dapo": ("grpo", "tldr", GROUPED | {"dynamic_sampling": True, "dynamic_sampling_min_spread": 1.0}),
    "episodes": ("grpo", "episodes", GROUPED | EPISODES),
}


def method_inputs(which, ppo_dirs, environment_dirs):
    if which == "episodes":
        return {"policy": environment_dirs["policy"], "rm": environment_dirs["rm"], "posts": environment_dirs["gsm8k"]}
    return ppo_dirs


def chunk_sizes(options):
    """One group, two groups, the whole batch (rows)."""
    group = options.get("samples_per_prompt", 1)
    return group, 2 * group, options.get("total_batch_size", 8)


def rollout_at(stage, inputs, options, tmp_path, generation_batch_size):
    setup = rollout_setup(stage, inputs, tmp_path / f"run{generation_batch_size}",
                          **options, generation_batch_size=generation_batch_size)
    return sampled_rollout(setup, update=1)


def assert_same_samples(got, want, what):
    assert torch.equal(got.prompts, want.prompts), f"{what}: other prompts"
    assert torch.equal(got.mask, want.mask) and torch.equal(got.responses, want.responses), f"{what}: other tokens"


# PPO (one sample a prompt), GRPO (groups) and episodes in the default run; the other methods, whose sampling
# differs only by what runs around the same sampler, in the slow suite, which CI runs too
DEFAULT_METHODS = ("ppo", "grpo", "episodes")


@pytest.mark.parametrize(
    "method", [m if m in DEFAULT_METHODS else pytest.param(m, marks=pytest.mark.slow) for m in sorted(METHODS)]
)
def test_a_rollout_is_the_same_for_chunks_of_one_group_two_groups_and_the_whole_batch(
    method, ppo_dirs, environment_dirs, tmp_path
):
    stage, which, options = METHODS[method]
    inputs = method_inputs(which, ppo_dirs, environment_dirs)
    one, two, whole = chunk_sizes(options)
    reference = rollout_at(stage, inputs, options, tmp_path, whole)
    assert reference.size == options.get("total_batch_size", 8)
    assert reference.responses.unique().numel() > 10  # sampled, not a constant answer
    if method == "episodes":
        assert int((reference.mask & ~reference.episodes.policy_mask).sum()) > 0  # the environment inserted tokens
    for size in (one, two):
        split = rollout_at(stage, inputs, options, tmp_path, size)
        assert_same_samples(split, reference, f"{method}, chunks of {size}")


def test_the_old_per_chunk_rng_gives_other_samples_for_other_chunk_sizes(ppo_dirs, tmp_path, monkeypatch):
    """The comparison above has teeth: one RNG per chunk, keyed by its first row (the old sampler), draws
    a prompt's tokens from a stream that the prompts before it in the chunk advanced."""
    def one_per_chunk(seeds, device):
        return [torch.Generator(device=device).manual_seed(seeds[0])] * len(seeds)

    monkeypatch.setattr(generation, "row_generators", one_per_chunk)
    stage, _, options = METHODS["grpo"]
    one, two, _ = chunk_sizes(options)
    with pytest.raises(AssertionError, match="other tokens"):
        assert_same_samples(rollout_at(stage, ppo_dirs, options, tmp_path, two),
                            rollout_at(stage, ppo_dirs, options, tmp_path, one), "one RNG per chunk")


@pytest.mark.slow  # the default run's 2-process runs (tests/onpolicy/test_distributed.py) sample two prompts a chunk
def test_two_gloo_processes_sample_what_one_process_samples(ppo_dirs, environment_dirs, tmp_path):
    """Each process samples its half of the prompts in chunks of two groups; one process the whole batch
    at once: every method."""
    cases = []
    for stage, which, options in METHODS.values():
        inputs = {k: str(v) for k, v in method_inputs(which, ppo_dirs, environment_dirs).items()}
        cases.append((stage, inputs, options | {"generation_batch_size": chunk_sizes(options)[1]}))
    out = tmp_path / "rollouts.pt"
    mp.start_processes(sampled_rollout_worker, args=(2, free_port(), cases, str(out)), nprocs=2,
                       start_method="spawn", join=True)
    for (method, (stage, which, options)), (prompts, responses, mask) in zip(
        METHODS.items(), torch.load(out, weights_only=True), strict=True
    ):
        one = rollout_at(stage, method_inputs(which, ppo_dirs, environment_dirs), options, tmp_path,
                         chunk_sizes(options)[2])
        assert torch.equal(prompts, one.prompts), f"{method}: other prompts"
        assert torch.equal(mask, one.mask) and torch.equal(responses, one.responses), f"{method}: other tokens"


def test_a_rows_token_is_drawn_from_its_own_rng_alone():
    """`sample_rows`: a row sampled beside others, in another order, draws what it draws alone."""
    probs = torch.softmax(torch.randn(5, 50, generator=torch.Generator().manual_seed(0)) * 3, -1)
    seeds = [11, 12, 13, 14, 15]
    together = sample_rows(probs, generation.row_generators(seeds, torch.device("cpu")))
    for row, seed in enumerate(seeds):
        alone = sample_rows(probs[row : row + 1], generation.row_generators([seed], torch.device("cpu")))
        assert int(alone) == int(together[row])
    reversed_rows = sample_rows(probs.flip(0), generation.row_generators(seeds[::-1], torch.device("cpu")))
    assert torch.equal(reversed_rows, together.flip(0))


def test_the_exponential_race_samples_each_token_with_its_probability():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05, 0.0]])
    cpu = torch.device("cpu")
    draws = torch.cat([sample_rows(probs, generation.row_generators([seed], cpu)) for seed in range(4000)])
    frequencies = torch.bincount(draws, minlength=5).float() / draws.numel()
    # 4000 draws: a standard error of at most 0.008
    torch.testing.assert_close(frequencies, probs[0], atol=0.03, rtol=0)
    assert int((draws == 4).sum()) == 0


def test_a_rows_seed_is_keyed_by_its_prompts_place_in_the_update_not_its_place_in_the_call():
    keys = generation.SampleKeys(seed=3, update=2, stream=generation.TRAINING_STREAM, first_prompt=5)
    whole = generation.SampleKeys(seed=3, update=2).row_seeds(range(8), 4)
    assert keys.row_seeds([1, 0], 4) == whole[24:28] + whole[20:24]
    assert len(set(whole)) == 32
    assert generation.SampleKeys(3, 2, generation.EVALUATION_STREAM).row_seeds([0], 1) != whole[:1]
