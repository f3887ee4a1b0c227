import torch
from torch.utils._python_dispatch import TorchDispatchMode

from rlhfkit.data.collate import left_pad_queries
from rlhfkit.generation import SamplingParams, generate, generate_texts
from rlhfkit.logprobs import response_logprobs

from ..support.decoding import SamplingLogprobs


def encode(tokenizer, text):
    return tokenizer(text, add_special_tokens=False).input_ids


def test_left_padded_batch_generates_same_tokens_as_each_row_alone(tiny_model, monkeypatch):
    model, tok = tiny_model
    sampling = SamplingLogprobs(monkeypatch)
    model.eval()
    queries = [
        encode(tok, "SUBREDDIT: r/test\n\nTITLE: a long title here\n\nPOST: words words words\n\nTL;DR:"),
        encode(tok, "hi there"),
    ]
    params = SamplingParams(max_new_tokens=12, temperature=0)
    batch = left_pad_queries(queries, tok.pad_token_id)
    together = generate(model, batch["input_ids"], batch["attention_mask"], params, tok.eos_token_id, tok.pad_token_id)
    together_logprobs = sampling.of(together)
    for i, q in enumerate(queries):
        alone_batch = left_pad_queries([q], tok.pad_token_id)
        alone = generate(
            model, alone_batch["input_ids"], alone_batch["attention_mask"], params, tok.eos_token_id, tok.pad_token_id
        )
        width = alone.responses.size(1)
        assert together.responses[i, :width].tolist() == alone.responses[0].tolist()
        torch.testing.assert_close(together_logprobs[i, :width], sampling.of(alone)[0], atol=1e-5, rtol=1e-4)


class ScriptedLM(torch.nn.Module):
    """Emits a fixed token sequence per row, whatever the input: lets a test place EOS exactly."""

    def __init__(self, scripts, vocab):
        super().__init__()
        self.scripts = scripts
        self.vocab = vocab
        self.calls = 0
        self.weight = torch.nn.Parameter(torch.zeros(1))

    def forward(
        self, input_ids, attention_mask=None, position_ids=None, past_key_values=None, use_cache=True, logits_to_keep=0
    ):
        logits = torch.full((input_ids.size(0), input_ids.size(1), self.vocab), -10.0)
        for row, script in enumerate(self.scripts):
            logits[row, -1, script[min(self.calls, len(script) - 1)]] = 10.0
        self.calls += 1
        return type("Out", (), {"logits": logits, "past_key_values": None})()


def test_eos_truncation_pads_after_first_eos_and_handles_rows_without_eos():
    eos, pad = 2, 99
    model = ScriptedLM([[5, 2, 7, 7, 7], [5, 6, 7, 8, 9], [2, 2, 2, 2, 2]], vocab=100)
    ids = torch.ones(3, 3, dtype=torch.long)
    out = generate(model, ids, torch.ones_like(ids), SamplingParams(max_new_tokens=5, temperature=0), eos, pad)
    assert out.responses.tolist() == [[5, 2, pad, pad, pad], [5, 6, 7, 8, 9], [2, pad, pad, pad, pad]]
    assert out.has_eos.tolist() == [True, False, True]
    assert out.lengths.tolist() == [2, 5, 1]


def test_generation_stops_early_once_every_row_has_eos():
    model = ScriptedLM([[2], [5, 2]], vocab=10)
    ids = torch.ones(2, 2, dtype=torch.long)
    out = generate(model, ids, torch.ones_like(ids), SamplingParams(max_new_tokens=50, temperature=0), 2, 9)
    assert out.responses.size(1) == 2 and model.calls == 2


def test_sampling_is_deterministic_for_a_seed(tiny_model):
    model, tok = tiny_model
    queries = [encode(tok, "one two three"), encode(tok, "four")]
    params = SamplingParams(max_new_tokens=8, temperature=0.7, seed=3)
    a = generate_texts(model, tok, queries, params, batch_size=2)
    b = generate_texts(model, tok, queries, params, batch_size=2)
    c = generate_texts(model, tok, queries, SamplingParams(max_new_tokens=8, temperature=0.7, seed=4), batch_size=2)
    assert a == b
    assert a != c


def greedy_without_cache(model, ids, mask, steps):
    """Reference decoding: the whole left-padded sequence through the model at every step, no KV cache."""
    from rlhfkit.ops import position_ids_from_mask

    tokens, logps = [], []
    for _ in range(steps):
        logits = model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask)).logits[:, -1]
        nxt = logits.argmax(-1)
        tokens.append(nxt)
        logps.append(logits.log_softmax(-1).gather(-1, nxt[:, None]).squeeze(-1))
        ids, mask = torch.cat([ids, nxt[:, None]], 1), torch.cat([mask, torch.ones_like(mask[:, :1])], 1)
    return torch.stack(tokens, 1), torch.stack(logps, 1)


def test_decoding_into_the_preallocated_cache_matches_full_forwards_without_cache(tiny_model, monkeypatch):
    """The same tokens, from the same logits, as full forwards; and the one forward pass the trainers
    score a rollout with (`logprobs.response_logprobs`) gives the sampled tokens those log-probabilities."""
    model, tok = tiny_model
    model.eval()
    sampling = SamplingLogprobs(monkeypatch)
    queries = [
        encode(tok, "SUBREDDIT: r/test\n\nPOST: a much longer post than the other one\n\nTL;DR:"),
        encode(tok, "short"),
    ]
    batch = left_pad_queries(queries, tok.pad_token_id)
    # a huge EOS id: no row stops, so every one of the 10 positions is compared
    out = generate(
        model, batch["input_ids"], batch["attention_mask"], SamplingParams(max_new_tokens=10, temperature=0), 10**9, -1
    )
    with torch.no_grad():
        tokens, logps = greedy_without_cache(model, batch["input_ids"], batch["attention_mask"], 10)
    assert out.responses.tolist() == tokens.tolist()
    torch.testing.assert_close(sampling.of(out), logps, atol=1e-5, rtol=1e-4)
    ids = torch.cat([batch["input_ids"], out.responses], dim=1)
    mask = torch.cat([batch["attention_mask"], torch.ones_like(out.responses)], dim=1)
    with torch.no_grad():
        teacher_forced, _ = response_logprobs(model, ids, mask, batch["input_ids"].size(1), 0.0)
    torch.testing.assert_close(teacher_forced, logps, atol=1e-5, rtol=1e-4)


def test_prompt_cache_is_laid_out_once_with_each_row_repeated_for_its_group(tiny_model):
    from transformers import DynamicCache

    from rlhfkit.decoding.eager import OneDtypeStaticLayer, static_decode_cache

    model, tok = tiny_model
    ids = torch.tensor([encode(tok, "one two three"), encode(tok, "four five six")])
    with torch.no_grad():
        prefill = model(input_ids=ids, use_cache=True).past_key_values
    static = static_decode_cache(model, prefill, repeats=2, max_length=ids.size(1) + 5)
    assert all(isinstance(layer, OneDtypeStaticLayer) for layer in static.layers)
    assert int(static.get_seq_length()) == ids.size(1)
    for source, target in zip(prefill.layers, static.layers, strict=True):
        assert target.keys.shape[0] == 4 and target.keys.shape[2] == ids.size(1) + 5
        torch.testing.assert_close(target.keys[:, :, : ids.size(1)], source.keys.repeat_interleave(2, dim=0))
        torch.testing.assert_close(target.values[2:, :, : ids.size(1)], source.values[[1, 1]])
    sliding = DynamicCache(
        config=type(model.config)(
            **(
                model.config.to_dict()
                | {"sliding_window": 4, "layer_types": ["sliding_attention"] * model.config.num_hidden_layers}
            )
        )
    )
    assert static_decode_cache(model, sliding, repeats=1, max_length=8) is None  # other layouts keep the growing cache


def test_decoding_under_bf16_autocast_stores_fp32_keys_and_bf16_values_in_one_buffer(tiny_model, monkeypatch):
    """Autocast hands the cache fp32 keys (after RoPE) and bf16 values, which the preallocated buffer
    takes in bf16; greedy tokens match the growing cache's, which keeps each as it came."""
    from rlhfkit.decoding import eager

    model, tok = tiny_model
    model.eval()
    sampling = SamplingLogprobs(monkeypatch)
    batch = left_pad_queries([encode(tok, "one two three four"), encode(tok, "five")], tok.pad_token_id)
    params = SamplingParams(max_new_tokens=8, temperature=0)
    runs, logprobs = [], []
    for preallocate in (True, False):
        if not preallocate:
            monkeypatch.setattr(eager, "static_decode_cache", lambda *args: None)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            runs.append(generate(model, batch["input_ids"], batch["attention_mask"], params, 10**9, -1))
        logprobs.append(sampling.of(runs[-1]))
    assert runs[0].responses.tolist() == runs[1].responses.tolist()
    torch.testing.assert_close(logprobs[0], logprobs[1], atol=2e-2, rtol=2e-2)


class Casts(TorchDispatchMode):
    """The weights (by data pointer) and the tensors shaped like a whole layer cache that are cast."""

    def __init__(self, model, cache_length):
        super().__init__()
        self.weights, self.cache_length = {p.data_ptr() for p in model.parameters()}, cache_length
        self.weight_casts, self.cache_casts = [], 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten._to_copy.default:
            if args[0].data_ptr() in self.weights:
                self.weight_casts.append(args[0].data_ptr())
            self.cache_casts += args[0].dim() == 4 and args[0].size(2) == self.cache_length
        return func(*args, **(kwargs or {}))


def test_bf16_autocast_decoding_casts_no_weight_twice_and_never_the_cache(tiny_model, monkeypatch):
    """Under autocast every decoded token used to cast every layer's whole fp32 cache to bf16
    for attention, and every frozen weight (autocast caches only weights that require grad) again. Now
    the cache is held in bf16 and each weight, frozen or not, is cast once per call, with the flags put
    back; tokens and log-probabilities are bit for bit those of the fp32 cache."""
    from rlhfkit.decoding import eager

    model, tok = tiny_model
    model.eval()
    sampling = SamplingLogprobs(monkeypatch)
    batch = left_pad_queries([encode(tok, "one two three four"), encode(tok, "five six")], tok.pad_token_id)
    params = SamplingParams(max_new_tokens=6, temperature=0)
    runs, logprobs = {}, {}
    for frozen in (False, True):
        model.requires_grad_(not frozen)
        with torch.autocast("cpu", dtype=torch.bfloat16), Casts(model, batch["input_ids"].size(1) + 6) as casts:
            runs[frozen] = generate(model, batch["input_ids"], batch["attention_mask"], params, 10**9, -1)
        logprobs[frozen] = sampling.of(runs[frozen])
        assert casts.cache_casts == 0
        assert casts.weight_casts and len(casts.weight_casts) == len(set(casts.weight_casts)), frozen
        assert all(p.requires_grad is not frozen for p in model.parameters())
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        prefill = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], use_cache=True
        ).past_key_values
        static = eager.static_decode_cache(model, prefill, 1, batch["input_ids"].size(1) + 6)
    assert (
        {layer.keys.dtype for layer in static.layers}
        == {layer.values.dtype for layer in static.layers}
        == {torch.bfloat16}
    )
    monkeypatch.setattr(eager, "cache_dtype", lambda keys, values: torch.promote_types(keys.dtype, values.dtype))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        fp32_cache = generate(model, batch["input_ids"], batch["attention_mask"], params, 10**9, -1)
    fp32_cache_logprobs = sampling.of(fp32_cache)
    for frozen, run in runs.items():
        assert torch.equal(run.responses, fp32_cache.responses) and torch.equal(logprobs[frozen], fp32_cache_logprobs)
