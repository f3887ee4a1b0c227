"""Judges: one interface over an OpenAI-compatible chat API, Anthropic, a local HF chat model and a
reward model, each comparing two responses to one prompt.

`make_judge(spec)` picks the judge from a spec string:

    openai:<model>[@<base_url>]   chat completions of OpenAI or any compatible server (vLLM, llama.cpp)
    anthropic:<model>             the Anthropic messages API
    hf:<model>                    a local chat model (folder, hub id or embedded name), greedy decoding
    hf-logprob:<model>            the same model made to answer: its next-token choice after `Preferred:`,
                                  read in both orders so a preference for a position cancels
    rm:<reward model folder>      the response with the higher reward wins; equal rewards tie

`Judge.judge(pairs)` returns one `Verdict` per pair: "A", "B", "tie" (equal rewards or probabilities only) or
"unparseable"; an unparseable reply is never a vote. Around every judge:

- the prompt is the paper's Appendix I template by default (`templates/tldr-appendix-i.txt`), or
  any file with `{prompt}`, `{response_a}` and `{response_b}`; its sha256 is recorded;
- each pair is shown in a randomised order decided by (seed, pair index) (`is_swapped`), and the
  verdict is mapped back to the caller's order; `Verdict.swapped` keeps position bias measurable;
- replies are cached on disk (`VerdictCache`), so a repeated or crashed evaluation never pays twice;
- API judges retry rate limits, server errors and timeouts with backoff (a malformed body once, a
  refused connection not at all), run N requests at a time and count tokens and cost (`JudgeStats`);
  a pair that got no reply is a failure, counted apart from unparseable replies. API keys are read only from the
  environment and are kept out of every message, log line and cached record.

The families live apart: `core` (the pair and verdict types, template, order, parser, cache and the
`Judge` base class), `api` (openai:, anthropic:) and `local` (hf:, hf-logprob:, rm:); this module
reads a spec and builds the judge (`make_judge`).
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlparse

from ...errors import ConfigError
from .api import ApiOptions, RetryPolicy, anthropic_judge, openai_judge
from .core import Judge, JudgeStats, Pair, Verdict, load_template
from .local import ChatModelJudge, ChoiceProbabilityJudge, RewardModelJudge

SPEC_FORMS = "openai:<model>[@<base_url>], anthropic:<model>, hf:<model>, hf-logprob:<model>, rm:<reward model folder>"


def parse_spec(spec: str) -> tuple[str, str, str | None]:
    """(kind, model or folder, base URL or None) of a judge spec; ConfigError naming the forms."""
    kind, colon, target = spec.partition(":")
    base_url = None
    if kind == "openai" and "@" in target:
        target, _, base_url = target.partition("@")
        if urlparse(base_url).scheme not in ("http", "https"):
            raise ConfigError(f"judge {spec!r}: the base URL after @ must start with http:// or https://")
    if not colon or kind not in ("openai", "anthropic", "hf", "hf-logprob", "rm") or not target:
        raise ConfigError(f"unknown judge {spec!r}; use one of {SPEC_FORMS}")
    return kind, target, base_url


def make_judge(
    spec: str,
    *,
    template: str | Path | None = None,
    cache_dir: str | Path | None = None,
    seed: int = 0,
    options: ApiOptions | None = None,
    base_url: str | None = None,
    max_new_tokens: int = 128,
    batch_size: int = 8,
) -> Judge:
    """The judge named by `spec` (see the module docstring for the forms).

    template: a template file (default: the paper's Appendix I prompt); not for rm: judges.
    cache_dir: folder of the verdict cache; None caches nothing.
    seed: decides the A/B order of each pair (`is_swapped(seed, index)`).
    options: concurrency, timeout, retries and prices of the API judges.
    base_url: server of openai: (if the spec has no @url) and anthropic: judges; else $OPENAI_BASE_URL
        or $ANTHROPIC_BASE_URL, else the provider's own API.
    max_new_tokens, batch_size: decoding of hf: judges (batch_size also for rm: scoring).
    """
    kind, target, spec_url = parse_spec(spec)
    if kind == "rm":
        if template is not None:
            raise ConfigError(f"judge {spec}: a reward model reads no template; drop the template option")
        return RewardModelJudge(target, cache_dir, seed, batch_size)
    prompt = load_template(template)
    if kind == "hf":
        return ChatModelJudge(target, prompt, cache_dir, seed, max_new_tokens, batch_size)
    if kind == "hf-logprob":
        return ChoiceProbabilityJudge(target, prompt, cache_dir, seed, batch_size)
    options = options or ApiOptions()
    if kind == "openai":
        return openai_judge(target, spec_url or base_url, prompt, options, cache_dir, seed)
    return anthropic_judge(target, base_url, prompt, options, cache_dir, seed)


__all__ = ["ApiOptions", "Judge", "JudgeStats", "Pair", "RetryPolicy", "Verdict", "load_template", "make_judge"]
