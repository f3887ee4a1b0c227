"""Decoding in buckets and on CUDA graphs (rlhfkit/decoding/buckets.py), checked on a CPU: the same greedy
tokens as the eager steps and as `transformers` `generate`, the same samples from the same generator,
finished rows leaving the batch, a decoding step a graph can record, and the logged fallbacks to eager
steps when a capture fails or its replay disagrees with an eager step."""

import logging

import pytest
import torch

from rlhfkit.decoding import DECODING, buckets
from rlhfkit.generation import SamplingParams, generate
from rlhfkit.ops import truncate_after_eos

from ..support.decoding import HostSyncDetector, SamplingLogprobs, staggered_eos_model

NEW_TOKENS = 10  # the last row of staggered_eos_model never emits EOS within this many


@pytest.fixture
def staggered():
    return staggered_eos_model()


def decode(model, tok, ids, mask, eos, mode, temperature=0.0, group=1, seed=0):
    params = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=temperature, seed=seed, decoding=mode)
    return generate_recording(model, ids, mask, params, eos, tok.pad_token_id, samples_per_prompt=group)


def generate_recording(*args, **kwargs):
    """`generate`'s rollout, with the log-probabilities its decoding steps gave the tokens it picked
    (`step_logprobs`): two ways of decoding must compute the same logits, not only pick the same tokens."""
    with pytest.MonkeyPatch.context() as patch:
        sampling = SamplingLogprobs(patch)
        run = generate(*args, **kwargs)
    run.step_logprobs = sampling.of(run)
    return run


def assert_same_rollout(a, b):
    assert torch.equal(a.responses, b.responses)
    assert torch.equal(a.lengths, b.lengths) and torch.equal(a.has_eos, b.has_eos)
    torch.testing.assert_close(a.step_logprobs, b.step_logprobs, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("group", [1, 2])
def test_buckets_drop_finished_rows_and_decode_the_eager_greedy_tokens(staggered, group):
    model, tok, ids, mask, eos = staggered
    eager = decode(*staggered, "eager", group=group)
    assert eager.lengths.tolist()[::group] == [2, 3, 4, 5, 6, 7, 8, NEW_TOKENS]  # rows finish one by one
    bucketed = decode(*staggered, "buckets", group=group)
    assert bucketed.decoding == "buckets" and eager.decoding == "eager"
    assert_same_rollout(bucketed, eager)
    # the rows still running moved down to every smaller bucket (the last prompt's group runs to the end)
    assert set(buckets.decoders[model].steps) == ({8, 4, 2, 1} if group == 1 else {16, 8, 4, 2})


def test_bucket_greedy_tokens_equal_transformers_generate_in_fp32(staggered):
    model, tok, ids, mask, eos = staggered
    ours = decode(*staggered, "buckets")
    theirs = model.generate(input_ids=ids, attention_mask=mask, max_new_tokens=NEW_TOKENS, do_sample=False,
                            eos_token_id=eos, pad_token_id=tok.pad_token_id)[:, ids.size(1):]
    assert torch.equal(ours.responses, truncate_after_eos(theirs, eos, tok.pad_token_id))


def test_sampling_draws_the_same_tokens_whichever_way_the_steps_run(staggered):
    eager = decode(*staggered, "eager", temperature=1.0, seed=3)
    bucketed = decode(*staggered, "buckets", temperature=1.0, seed=3)
    assert_same_rollout(bucketed, eager)
    assert not torch.equal(bucketed.responses, decode(*staggered, "buckets", temperature=1.0, seed=4).responses)


def test_buffers_kept_from_an_earlier_call_decode_a_different_batch_alike(staggered):
    model, tok, ids, mask, eos = staggered
    decode(*staggered, "buckets")
    kept = buckets.decoders[model]
    narrower = ids[2:5, 3:], mask[2:5, 3:]  # three rows, fewer query columns: fits the kept buffers
    assert_same_rollout(decode(model, tok, *narrower, eos, "buckets"), decode(model, tok, *narrower, eos, "eager"))
    assert buckets.decoders[model] is kept
    model.double()  # the weights moved: the buffers and graphs are rebuilt
    decode(model, tok, ids, mask, eos, "buckets")
    assert buckets.decoders[model] is not kept


def test_the_decoding_step_never_waits_for_the_device(staggered):
    """Nothing in a step reads a value back to the host: the condition for recording it as a graph."""
    model, tok, ids, mask, eos = staggered
    decode(*staggered, "buckets")
    step = buckets.decoders[model].step_function(4)
    with HostSyncDetector():
        step()
    with pytest.raises(AssertionError, match="host synchronisation"), HostSyncDetector():
        int(mask.sum())  # the detector itself sees a read-back


def test_cuda_graphs_asked_for_on_a_cpu_fall_back_to_eager_steps_with_the_reason_logged_once(staggered, caplog):
    caplog.set_level(logging.WARNING, logger="rlhfkit.decoding")
    first = decode(*staggered, "cuda-graphs")
    assert first.decoding == "eager"
    assert_same_rollout(first, decode(*staggered, "eager"))
    decode(*staggered, "cuda-graphs")
    logged = [r.getMessage() for r in caplog.records]
    assert logged == ["rlhfkit: decoding with eager steps: CUDA graphs need a CUDA device; the model is on cpu"]


def test_auto_decodes_eagerly_on_a_cpu_without_a_word(staggered, caplog):
    caplog.set_level(logging.WARNING, logger="rlhfkit.decoding")
    assert decode(*staggered, "auto").decoding == "eager" and not caplog.records


@pytest.fixture
def capturable(monkeypatch):
    """A CPU standing in for a CUDA device: only the device check is lifted; refusals still count."""
    monkeypatch.setattr(buckets, "graph_obstacle", lambda model, device: buckets.graphs_refused.get(model))


def test_a_faithful_graph_is_checked_once_and_replayed(staggered, capturable, monkeypatch):
    captured = []
    monkeypatch.setattr(buckets, "capture_graph", lambda step: captured.append(step) or step)
    graphs = decode(*staggered, "cuda-graphs")
    assert graphs.decoding == "cuda-graphs" and len(captured) == 4  # buckets 8, 4, 2, 1
    assert_same_rollout(graphs, decode(*staggered, "eager"))


def test_a_capture_that_fails_falls_back_with_the_reason_logged_and_is_not_tried_again(
    staggered, capturable, monkeypatch, caplog
):
    caplog.set_level(logging.WARNING, logger="rlhfkit.decoding")
    attempts = []

    def refusing(step):
        attempts.append(step)
        raise RuntimeError("operation not permitted when stream is capturing")

    monkeypatch.setattr(buckets, "capture_graph", refusing)
    first = decode(*staggered, "cuda-graphs")
    assert first.decoding == "buckets"  # this call goes on with eager steps on the same buffers
    assert_same_rollout(first, decode(*staggered, "eager"))
    second = decode(*staggered, "cuda-graphs")
    assert second.decoding == "eager" and len(attempts) == 1
    assert [r.getMessage() for r in caplog.records] == [
        "rlhfkit: decoding with eager steps: capturing the 8-row step failed: RuntimeError: operation not permitted "
        "when stream is capturing"
    ]


def test_a_graph_that_froze_its_inputs_is_caught_at_its_first_replay_and_the_call_redone_eagerly(
    staggered, capturable, monkeypatch, caplog
):
    """A graph whose replay returns what the step gave at capture (inputs frozen, as a graph reading a
    Python number would) differs from an eager step once the token and position have moved on; the call
    starts again with eager steps and the generator rewound, so even its samples are the eager ones."""
    model = staggered[0]
    caplog.set_level(logging.WARNING, logger="rlhfkit.decoding")

    def frozen(step):
        decoder = buckets.decoders[model]
        before = [f.clone() for f in decoder.filled]
        output = step().clone()
        for filled, position in zip(decoder.filled, before, strict=True):
            filled.copy_(position)

        def replay():
            for filled in decoder.filled:
                filled.add_(1)
            return output

        return replay

    monkeypatch.setattr(buckets, "capture_graph", frozen)
    graphs = decode(*staggered, "cuda-graphs", temperature=1.0, seed=5)
    assert graphs.decoding == "eager"
    assert_same_rollout(graphs, decode(*staggered, "eager", temperature=1.0, seed=5))
    assert [r.getMessage() for r in caplog.records] == [
        "rlhfkit: decoding with eager steps: the 8-row graph's logits differ from an eager step's on the same inputs"
    ]
    assert buckets.graphs_refused[model]


def test_recording_turns_off_autocasts_weight_cache_and_keeps_its_dtype():
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with buckets.autocast_without_weight_cache("cpu"):
            assert torch.is_autocast_enabled("cpu") and torch.get_autocast_dtype("cpu") == torch.bfloat16
            assert not torch.is_autocast_cache_enabled()
        assert torch.is_autocast_cache_enabled()


def test_buckets_are_powers_of_two():
    assert [buckets.bucket_for(n) for n in (1, 2, 3, 4, 5, 8, 9, 64, 65)] == [1, 2, 4, 4, 8, 8, 16, 64, 128]


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_gpt_neox_decodes_alike_in_buckets_with_either_attention(attention):
    """Pythia's architecture (partial rotary, parallel residual), and eager attention's additive mask."""
    from transformers import AutoModelForCausalLM, GPTNeoXConfig

    from rlhfkit.data.collate import left_pad_queries

    config = GPTNeoXConfig(
        vocab_size=500,
        hidden_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        intermediate_size=128,
        rotary_pct=0.25,
        eos_token_id=0,
        pad_token_id=1,
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config, attn_implementation=attention).eval()
    generator = torch.Generator().manual_seed(0)
    queries = [torch.randint(2, 500, (n,), generator=generator).tolist() for n in (3, 9, 17, 5)]
    batch = left_pad_queries(queries, 1)
    runs = [
        generate_recording(
            model, batch["input_ids"], batch["attention_mask"], SamplingParams(12, 0.0, decoding=mode), 7, 1
        )
        for mode in ("eager", "buckets")
    ]
    assert runs[1].decoding == "buckets"
    assert_same_rollout(runs[1], runs[0])


def test_the_stages_decoding_options_are_the_decoders_and_an_unknown_one_is_refused(staggered):
    from typing import get_args, get_type_hints

    from rlhfkit.config import OnPolicyConfig, PlanConfig

    for config in (OnPolicyConfig, PlanConfig):
        assert get_args(get_type_hints(config)["decoding"]) == DECODING
    with pytest.raises(ValueError, match="decoding='graphs': choose one of auto, eager, cuda-graphs, buckets"):
        decode(*staggered, "graphs")
