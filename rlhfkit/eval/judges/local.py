"""Local judges: a Hugging Face chat model that writes its verdict (`hf:`), the same model read at its
next-token choice after `Preferred:` in both orders (`hf-logprob:`), and a reward model whose higher
reward wins (`rm:`, scored through `rlhfkit.scoring`). Their cache keys carry a fingerprint of the
weights, so a model retrained in place is asked again."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from ...errors import ConfigError
from .core import Deliver, Judge, JudgeTemplate, Reply, Shown, cache_key, parse_preference


def weights_fingerprint(path: str) -> str:
    """Names, sizes and modification times of a model folder's weight files, so verdicts cached for a
    local judge are not reused after the folder is retrained in place ("" for a hub id)."""
    folder = Path(path)
    if not folder.is_dir():
        return ""
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.glob("*.safetensors"))]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]


class ChatModelJudge(Judge):
    """A local HF chat model: the rendered template as one user turn of its chat template, then
    greedy decoding of up to `max_new_tokens`, `batch_size` prompts at a time."""

    KIND = "hf"

    def __init__(self, target: str, template: JudgeTemplate, cache_dir: str | Path | None, seed: int,
                 max_new_tokens: int, batch_size: int):
        from ...models import load_policy, resolve_model_path

        self.model, self.tokenizer = load_policy(target)
        if not self.tokenizer.chat_template:
            raise ConfigError(f"judge hf:{target}: its tokenizer has no chat template; use a chat (instruct) model")
        self.model.eval()
        self.max_new_tokens, self.batch_size = max_new_tokens, batch_size
        settings = {"max_new_tokens": max_new_tokens, "weights": weights_fingerprint(resolve_model_path(target))}
        super().__init__(f"{self.KIND}:{target}", template, cache_dir, seed, settings)

    def query_ids(self, prompt: str) -> list[int]:
        text = self.tokenizer.apply_chat_template([{"role": "user", "content": prompt}], tokenize=False,
                                                  add_generation_prompt=True)
        # the chat markers (<|im_start|> ...) must stay special tokens, so no split_special_tokens here
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def batches(self, items: list[tuple[int, Shown]], suffix: list[int] | None = None):
        """`batch_size` pairs at a time, as (pairs, their prompt ids + `suffix`, left-padded ids, mask on
        the model's device); answers are delivered per batch, so a kill loses one batch."""
        from ...data.collate import left_pad_queries

        device = next(self.model.parameters()).device
        for start in range(0, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            queries = [self.query_ids(self.template.render(s)) + (suffix or []) for _, s in chunk]
            batch = left_pad_queries(queries, self.tokenizer.pad_token_id)
            yield chunk, queries, batch["input_ids"].to(device), batch["attention_mask"].to(device)

    def answer(self, items: list[tuple[int, Shown]], deliver: Deliver) -> None:
        from ...generation import SamplingParams, generate, response_texts

        params = SamplingParams(max_new_tokens=self.max_new_tokens, temperature=0.0)
        tokenizer = self.tokenizer
        for chunk, queries, ids, mask in self.batches(items):
            rollout = generate(self.model, ids, mask, params, tokenizer.eos_token_id, tokenizer.pad_token_id)
            texts = response_texts(rollout, tokenizer)
            for (index, _), query, text, length in zip(chunk, queries, texts, rollout.lengths.tolist(), strict=True):
                self.stats.add(calls=1, input_tokens=len(query), output_tokens=length)
                deliver(index, Reply(text.strip(), parse_preference(text), len(query), length))


class ChoiceProbabilityJudge(ChatModelJudge):
    """A local chat model held to the template's answer format: its reply is started for it with the
    template's answer line (`Preferred:`), and its preference is how much likelier it finds " A" than
    " B" as the next token. One forward pass per order and never unparseable, at the price of the
    one-sentence comparison that Appendix I asks for first. Small models rarely write the format
    unprompted (SmolLM2-135M-Instruct: no parseable reply in 24 under `hf:`), so this is how such a
    model can judge at all.

    Small models also answer by position: SmolLM2-135M-Instruct said "A" for all 400 verdicts of a
    TL;DR judge-eval. So each pair is read in both orders and the verdict is the sign of the mean
    margin for the same response, (margin shown + margin mirrored) / 2, which cancels any preference
    for a position; `rlhfkit judge-eval` says how far the rest can be trusted."""

    KIND = "hf-logprob"
    ANSWER_PREFIX = "Preferred:"

    def __init__(self, target: str, template: JudgeTemplate, cache_dir: str | Path | None, seed: int, batch_size: int):
        super().__init__(target, template, cache_dir, seed, max_new_tokens=0, batch_size=batch_size)
        self.settings["orders"] = 2
        self.prefix_ids = self.tokenizer(self.ANSWER_PREFIX, add_special_tokens=False)["input_ids"]
        self.choice_ids = [self.single_token_id(" " + letter) for letter in "AB"]

    def single_token_id(self, text: str) -> int:
        ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) != 1:
            raise ConfigError(
                f"judge {self.spec}: {text!r} is {len(ids)} tokens for this tokenizer, not one; use hf: instead"
            )
        return ids[0]

    def choice_logprobs(self, items: list[tuple[int, Shown]]) -> list[tuple[list[float], int]]:
        """(logprobs of " A" and " B" after the answer prefix, prompt tokens) for each pair as shown."""
        import torch

        from ...ops import position_ids_from_mask

        results = []
        for _, queries, ids, mask in self.batches(items, self.prefix_ids):
            with torch.inference_mode():
                logits = self.model(
                    input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), logits_to_keep=1
                ).logits[:, -1]
            results += zip(logits.float().log_softmax(-1)[:, self.choice_ids].tolist(), map(len, queries), strict=True)
        return results

    def answer(self, items: list[tuple[int, Shown]], deliver: Deliver) -> None:
        for start in range(0, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            mirrored = [(index, Shown(s.prompt, s.second, s.first, not s.swapped)) for index, s in chunk]
            shown, swapped = self.choice_logprobs(chunk), self.choice_logprobs(mirrored)
            for (index, _), (_, mirror), ((a, b), tokens), ((a_mirrored, b_mirrored), tokens_mirrored) in zip(
                chunk, mirrored, shown, swapped, strict=True
            ):
                self.stats.add(calls=2, input_tokens=tokens + tokens_mirrored)
                margin = ((a - b) + (b_mirrored - a_mirrored)) / 2  # for the response shown first
                readings = {"A": a, "B": b}, {"A": a_mirrored, "B": b_mirrored}
                deliver(index, self.reply(margin, *readings, tokens + tokens_mirrored))
                if self.cache is not None:  # the mirrored order is the same two readings: never pay for it again
                    mirrored_reply = self.reply(-margin, *reversed(readings), tokens + tokens_mirrored)
                    self.cache.put(
                        cache_key(mirror, self.identity, self.template_sha256), self.record_of(mirrored_reply)
                    )

    def reply(
        self, margin_first: float, shown: dict[str, float], mirrored: dict[str, float], input_tokens: int
    ) -> Reply:
        winner = "A" if margin_first > 0 else "B" if margin_first < 0 else "tie"
        logprobs = {"shown": shown, "mirrored": mirrored, "margin_first": margin_first}
        return Reply(f"{self.ANSWER_PREFIX} {winner} " + json.dumps(logprobs), winner, input_tokens, 0)


class RewardModelJudge(Judge):
    """A reward model as a judge: each response scored after the prompt (leading space + EOS, Detail 3);
    the higher reward wins and equal rewards tie. The prompt is tokenised as given, so pass it in the
    format and length the reward model was trained on (for TL;DR the truncated query)."""

    def __init__(self, folder: str, cache_dir: str | Path | None, seed: int, batch_size: int):
        from ...reward_models import load_reward_model

        self.model, self.tokenizer = load_reward_model(folder)
        self.batch_size = batch_size
        super().__init__(f"rm:{folder}", None, cache_dir, seed, {"weights": weights_fingerprint(folder)})

    def answer(self, items: list[tuple[int, Shown]], deliver: Deliver) -> None:
        from ...data.formats import encode_completion, encode_text
        from ...scoring import score_texts

        queries = [encode_text(self.tokenizer, s.prompt) for _, s in items]
        responses = [encode_completion(self.tokenizer, s.first) for _, s in items]
        responses += [encode_completion(self.tokenizer, s.second) for _, s in items]
        scores = score_texts(
            self.model, self.tokenizer.pad_token_id, queries * 2, responses, self.batch_size, "judging"
        )
        first, second = scores[: len(items)], scores[len(items) :]
        for (index, _), a, b in zip(items, first.tolist(), second.tolist(), strict=True):
            self.stats.add(calls=1)
            winner = "A" if a > b else "B" if b > a else "tie"
            deliver(index, Reply(json.dumps({"A": a, "B": b}), winner))
