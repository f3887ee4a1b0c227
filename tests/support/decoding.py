"""Decoding: the log-probabilities a sampler saw, a model whose rows stop at chosen steps, host syncs."""

from __future__ import annotations

import torch


class SamplingLogprobs:
    """The log-probability of each token `generation.generate` picks, under the logits it was picked
    from at the sampling temperature: the decoding steps' own numbers, which generation keeps no copy
    of (the trainers recompute log-probabilities in one forward pass). Tests compare two ways of
    decoding, or decoding and that forward pass, by them."""

    def __init__(self, monkeypatch):
        from rlhfkit import generation
        from rlhfkit.ops import logprobs_from_logits

        self.steps: list[torch.Tensor] = []
        pick_next = generation.pick_next

        def recording(logits, params, generators, pad_id=None):
            token = pick_next(logits, params, generators, pad_id)
            self.steps.append(logprobs_from_logits(logits, token, params.temperature))
            return token

        monkeypatch.setattr(generation, "pick_next", recording)

    def of(self, run) -> torch.Tensor:
        """(B, R) for `run`, the latest `generate` call's result; 0 after each row's EOS. Forgets them."""
        width = run.responses.size(1)
        logprobs = torch.stack(self.steps[-width:], dim=1)  # after a fallback to eager steps, the eager pass's
        self.steps.clear()
        return logprobs * (torch.arange(width, device=logprobs.device).unsqueeze(0) < run.lengths.unsqueeze(1))


def staggered_eos_model(rows: int = 8, finish_at: tuple[int, ...] = (1, 2, 3, 4, 5, 6, 7), seed: int = 0):
    """(model, tokenizer, query ids, query mask, eos id): a tiny random Llama whose greedy answers to
    `rows` random left-padded queries emit EOS at the steps `finish_at` (row i at finish_at[i], the last
    rows never), so rows finish one by one and decoding passes through every smaller bucket.

    Weights drawn wide make every row's greedy answer differ; then the (tied) embedding of a token no
    query holds is solved for (least squares) so that its logit is +30 at each row's chosen step and -30
    at every step before it; it is never an input before it is emitted, so nothing earlier changes."""
    from rlhfkit.data.collate import left_pad_queries
    from rlhfkit.generation import SamplingParams, generate
    from rlhfkit.tiny_models import tiny_policy

    model, tokenizer = tiny_policy(seed=seed)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 2:
                parameter.normal_(0, 0.5, generator=generator)
    model.eval()
    lengths = torch.randint(5, 30, (rows,), generator=generator).tolist()
    queries = [torch.randint(100, 40000, (n,), generator=generator).tolist() for n in lengths]
    batch = left_pad_queries(queries, tokenizer.pad_token_id)
    ids, mask = batch["input_ids"], batch["attention_mask"]
    eos, steps = 49000, max(finish_at) + 2
    probe = generate(
        model,
        ids,
        mask,
        SamplingParams(max_new_tokens=steps, temperature=0, decoding="eager"),
        -1,
        tokenizer.pad_token_id,
    )
    with torch.no_grad():
        hidden = model.model(
            input_ids=torch.cat([ids, probe.responses], dim=1),
            attention_mask=torch.cat([mask, torch.ones_like(probe.responses)], dim=1),
        ).last_hidden_state
        states, targets = [], []
        for row in range(rows):
            last = finish_at[row] if row < len(finish_at) else steps - 1
            for step in range(last + 1):
                states.append(hidden[row, ids.size(1) - 1 + step])
                targets.append(30.0 if row < len(finish_at) and step == last else -30.0)
        solved = torch.linalg.lstsq(
            torch.stack(states).double(), torch.tensor(targets, dtype=torch.float64).unsqueeze(1)
        ).solution
        model.get_input_embeddings().weight[eos] = solved.squeeze(1).float()
    return model, tokenizer, ids, mask, eos


SYNCING = {
    torch.Tensor.item,
    torch.Tensor.tolist,
    torch.Tensor.__bool__,
    torch.Tensor.__int__,
    torch.Tensor.__float__,
    torch.Tensor.__index__,
    torch.Tensor.nonzero,
    torch.nonzero,
    torch.Tensor.cpu,
    torch.Tensor.numpy,
    torch.masked_select,
    torch.Tensor.masked_select,
    torch.unique,
    torch.Tensor.unique,
}


class HostSyncDetector(torch.overrides.TorchFunctionMode):
    """Raises on any call that makes the host wait for a CUDA device's result (a Python number, a
    data-dependent shape, an explicit copy to the host): what a CUDA graph cannot record. Seen on a CPU
    too, where every tensor is already on the host (so `.to(device)` cannot be told apart there)."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        masked_index = func is torch.Tensor.__getitem__ and any(
            isinstance(i, torch.Tensor) and i.dtype == torch.bool
            for i in (args[1] if isinstance(args[1], tuple) else (args[1],))
        )
        if func in SYNCING or masked_index:
            raise AssertionError(f"host synchronisation: {getattr(func, '__name__', func)}")
        return func(*args, **kwargs)
