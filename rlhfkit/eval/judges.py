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
- API judges retry rate limits, server errors, timeouts and malformed bodies with backoff, run N
  requests at a time and count tokens and cost (`JudgeStats`). API keys are read only from the
  environment and are kept out of every message, log line and cached record.
"""

from __future__ import annotations

import email.utils
import hashlib
import importlib
import json
import logging
import os
import random
import re
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlparse

from tqdm import tqdm

from ..errors import ConfigError

log = logging.getLogger(__name__)

SPEC_FORMS = "openai:<model>[@<base_url>], anthropic:<model>, hf:<model>, hf-logprob:<model>, rm:<reward model folder>"
KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
DEFAULT_TEMPLATE = "tldr-appendix-i.txt"
BUILTIN = "builtin:"
PLACEHOLDERS = ("prompt", "response_a", "response_b")
PLACEHOLDER_PATTERN = re.compile(r"\{(prompt|response_a|response_b)\}")
# Appendix I asks for the line `Preferred: <"A" or "B">`. Only that line counts: the letter in either
# case, in matching quotes or none. Anything else (prose, markdown, two different letters) is
# unparseable rather than a guessed vote.
PREFERRED_LINE = re.compile(r'^Preferred:[ \t]*("?)([AaBb])\1[ \t]*\r?$', re.MULTILINE)
# 408 and 429 ask the client to come back later; 5xx are the server's own faults.
RETRYABLE_STATUS = (408, 429)
REDACTED = "[redacted]"
RECORD_FIELDS = {"key", "shown_winner", "reply", "input_tokens", "output_tokens"}


class PairLike(Protocol):
    """Anything with the three texts of a comparison, e.g. `Pair`."""

    prompt: str
    response_a: str
    response_b: str


@dataclass(frozen=True)
class Pair:
    """Two responses to one prompt, in the caller's order. For TL;DR the prompt is the formatted
    query (`SUBREDDIT: ... TL;DR:`), which the Appendix I template shows as the post."""

    prompt: str
    response_a: str
    response_b: str


@dataclass(frozen=True)
class Shown:
    """A pair as the judge sees it: `first` is labelled "A", `second` "B"."""

    prompt: str
    first: str
    second: str
    swapped: bool  # True when `first` is the caller's response_b


@dataclass(frozen=True)
class Reply:
    """A judge's answer for one pair in the order shown. `error` is set when no answer came back
    (retries exhausted); `winner` is then "unparseable" and nothing is cached."""

    text: str
    winner: str  # "A", "B", "tie" or "unparseable", in the order shown
    input_tokens: int = 0
    output_tokens: int = 0
    error: str = ""


@dataclass(frozen=True)
class Verdict:
    """The judgement of one pair, in the caller's order (A = `pair.response_a`)."""

    winner: str  # "A", "B", "tie" or "unparseable"
    shown_winner: str  # the same verdict in the order the judge saw: position bias = share of "A"
    swapped: bool
    raw: str  # the judge's reply; for a reward model its two scores as JSON
    cached: bool = False
    error: str = ""  # why no reply came back; such a verdict is "unparseable" and not cached
    input_tokens: int = 0
    output_tokens: int = 0

    @property
    def is_vote(self) -> bool:
        return self.winner != "unparseable"


@dataclass
class JudgeStats:
    """Running totals of one judge. `calls`, `retries`, `failures`, tokens and cost are work done by
    this process (cache hits cost nothing); `cache_hits` and `unparseable` count verdicts."""

    calls: int = 0  # requests sent, every attempt included (local judges: pairs generated or scored)
    cache_hits: int = 0
    retries: int = 0
    failures: int = 0  # pairs left without a reply after the last attempt
    unparseable: int = 0  # replies without a valid `Preferred:` line (failures not included)
    input_tokens: int = 0
    output_tokens: int = 0
    cost: float = 0.0  # in the currency of the per-million-token prices given
    lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, **amounts: float) -> None:
        """Thread-safe increments, e.g. add(calls=1, retries=1); API workers report concurrently."""
        with self.lock:
            for name, amount in amounts.items():
                setattr(self, name, getattr(self, name) + amount)

    def as_dict(self) -> dict[str, float]:
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "lock"}


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how long to retry a transient failure (429, 408, 5xx, timeout, bad body)."""

    max_attempts: int = 6
    base_delay: float = 1.0  # seconds before the first retry; doubles with each attempt
    max_delay: float = 120.0  # cap on any wait, a server's Retry-After included

    def delay(self, attempt: int, retry_after: float | None, rng: random.Random) -> float:
        """Seconds to wait after failed attempt `attempt` (1-based): the server's Retry-After when it
        sent one, else exponential backoff with jitter."""
        if retry_after is not None:
            return min(max(retry_after, 0.0), self.max_delay)
        ceiling = min(self.max_delay, self.base_delay * 2 ** (attempt - 1))
        # equal jitter: at least half the ceiling, so waits still grow, while workers that failed
        # together (one rate limit hits them all) come back spread out instead of in a burst
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


@dataclass(frozen=True)
class ApiOptions:
    """Settings of the API judges (openai:, anthropic:)."""

    concurrency: int = 4  # requests in flight at once
    timeout: float = 60.0  # seconds per request
    max_tokens: int = 256
    # None: greedy (0) on OpenAI-compatible servers and the provider's default on Anthropic, whose
    # newer models reject any other value; a number is sent to either
    temperature: float | None = None
    input_price: float = 0.0  # per million input tokens
    output_price: float = 0.0  # per million output tokens
    retry: RetryPolicy = field(default_factory=RetryPolicy)

    def __post_init__(self) -> None:
        if self.concurrency < 1:
            raise ConfigError(f"judge concurrency must be at least 1, got {self.concurrency}")
        if self.timeout <= 0:
            raise ConfigError(f"judge timeout must be positive seconds, got {self.timeout}")
        if self.retry.max_attempts < 1:
            raise ConfigError(f"judge max_attempts must be at least 1, got {self.retry.max_attempts}")


# ---------------------------------------------------------------- order, template, parsing, keys


def is_swapped(seed: int, index: int) -> bool:
    """Whether pair `index` is shown as (response_b, response_a). A hash of (seed, index) rather than a
    random generator's state, so any pair's order can be recomputed later and does not depend on
    which other pairs were judged or cached (Appendix I randomises the order against position bias)."""
    return hashlib.sha256(f"{seed}:{index}".encode()).digest()[0] % 2 == 1


def show(pair: PairLike, swapped: bool) -> Shown:
    first, second = (pair.response_b, pair.response_a) if swapped else (pair.response_a, pair.response_b)
    return Shown(pair.prompt, first, second, swapped)


def to_caller_order(shown_winner: str, swapped: bool) -> str:
    """Map a verdict about the order shown back to the caller's order."""
    if swapped and shown_winner in ("A", "B"):
        return "B" if shown_winner == "A" else "A"
    return shown_winner


def parse_preference(reply: str) -> str:
    """"A" or "B" from the reply's `Preferred:` line(s); "unparseable" when there is none or they disagree."""
    letters = {match.group(2).upper() for match in PREFERRED_LINE.finditer(reply)}
    return letters.pop() if len(letters) == 1 else "unparseable"


@dataclass(frozen=True)
class JudgeTemplate:
    """A judge prompt with `{prompt}`, `{response_a}` and `{response_b}`; `source` is its file."""

    text: str
    source: str

    @property
    def sha256(self) -> str:
        return hashlib.sha256(self.text.encode("utf-8")).hexdigest()

    def render(self, shown: Shown) -> str:
        values = {"prompt": shown.prompt, "response_a": shown.first, "response_b": shown.second}
        # one pass: a post that itself contains "{response_b}" is never substituted a second time
        return PLACEHOLDER_PATTERN.sub(lambda match: values[match.group(1)], self.text)


def builtin_templates() -> list[str]:
    return sorted(p.name.removesuffix(".txt") for p in (resources.files("rlhfkit.eval") / "templates").iterdir() if p.name.endswith(".txt"))


def builtin_name(path: str | Path | None) -> str | None:
    """The shipped template `path` names, or None for a file."""
    if path is None:
        return DEFAULT_TEMPLATE.removesuffix(".txt")
    text = str(path)
    return text.removeprefix(BUILTIN) if text.startswith(BUILTIN) else None


def load_template(path: str | Path | None = None) -> JudgeTemplate:
    """The template in `path`, a shipped one named `builtin:<name>` (`builtin:hh-helpfulness` for
    HH-RLHF dialogues), or the paper's Appendix I prompt when None. The paper prints that prompt with
    Python line continuations (`\\`); the file joins those lines as the string literal did."""
    name = builtin_name(path)
    if name is not None:
        if name not in builtin_templates():
            raise ConfigError(f"judge template {BUILTIN}{name} is not shipped; choose one of "
                              f"{', '.join(BUILTIN + t for t in builtin_templates())} or give a file")
        source = resources.files("rlhfkit.eval") / "templates" / f"{name}.txt"
        return JudgeTemplate(source.read_text(encoding="utf-8"), f"{BUILTIN}{name}.txt")
    file = Path(path)
    if not file.is_file():
        raise ConfigError(f"judge template {file} not found; give a text file with {{prompt}}, {{response_a}} and {{response_b}}")
    text = file.read_text(encoding="utf-8")
    missing = [f"{{{name}}}" for name in PLACEHOLDERS if f"{{{name}}}" not in text]
    if missing:
        raise ConfigError(f"judge template {file} lacks {', '.join(missing)}; the judge would not see both responses")
    return JudgeTemplate(text, str(file))


def cache_key(shown: Shown, judge_identity: str, template_sha256: str) -> str:
    """sha256 over the texts as shown to the judge, the judge and the template. A JSON list, so no
    choice of separator can make two different tuples collide."""
    payload = json.dumps([shown.prompt, shown.first, shown.second, judge_identity, template_sha256], ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


def redact(text: str) -> str:
    """`text` with the value of every API-key variable replaced, for anything printed or written: a
    server may echo the key in an error body (short values are skipped: they would blank out words)."""
    for name in KEY_ENV.values():
        secret = os.environ.get(name, "")
        if len(secret) >= 8:
            text = text.replace(secret, REDACTED)
    return text


def weights_fingerprint(path: str) -> str:
    """Names, sizes and modification times of a model folder's weight files, so verdicts cached for a
    local judge are not reused after the folder is retrained in place ("" for a hub id)."""
    folder = Path(path)
    if not folder.is_dir():
        return ""
    stats = [(p.name, p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(folder.glob("*.safetensors"))]
    return hashlib.sha256(json.dumps(stats).encode()).hexdigest()[:16]


class VerdictCache:
    """Replies on disk: `<folder>/verdicts.jsonl`, one JSON object per line, appended as each reply
    arrives. A killed run loses at most the line being written, which the next load skips."""

    FILE = "verdicts.jsonl"

    def __init__(self, folder: str | Path):
        self.path = Path(folder) / self.FILE
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.records = self.load()

    def load(self) -> dict[str, dict[str, Any]]:
        if not self.path.exists():
            return {}
        data = self.path.read_bytes()
        records, skipped = {}, 0
        # split at b"\n" only: str.splitlines would also cut at U+2028 or \x85, which JSON leaves raw
        for line in data.split(b"\n"):
            if not line.strip():
                continue
            try:
                record = json.loads(line)
                if not isinstance(record, dict) or RECORD_FIELDS - record.keys():
                    raise ValueError("not a verdict record")
                records[record["key"]] = record
            except ValueError:  # a JSON or UTF-8 decode error is a ValueError too
                skipped += 1
        if skipped:
            log.warning("%s: skipped %d incomplete line(s), e.g. from a killed run", self.path, skipped)
        if data and not data.endswith(b"\n"):
            # a write cut short by a kill: end its line so the next record starts on a line of its own
            with self.path.open("ab") as f:
                f.write(b"\n")
        return records

    def get(self, key: str) -> dict[str, Any] | None:
        return self.records.get(key)

    def put(self, key: str, record: dict[str, Any]) -> None:
        record = {"key": key, **record}
        line = json.dumps(record, ensure_ascii=False) + "\n"
        with self.lock:  # one write() per line in append mode: lines from threads never interleave
            with self.path.open("a", encoding="utf-8") as f:
                f.write(line)
            self.records[key] = record


# ---------------------------------------------------------------- the interface


Deliver = Callable[[int, Reply], None]


class Judge:
    """Compares pairs. The base class owns order, cache and bookkeeping; a subclass only answers
    pairs in the order shown, in `answer`."""

    def __init__(self, spec: str, template: JudgeTemplate | None, cache_dir: str | Path | None, seed: int,
                 settings: dict[str, Any]):
        self.spec = spec
        self.template = template
        self.seed = seed
        self.settings = settings  # whatever shapes a reply besides the spec (never a key)
        self.cache = VerdictCache(cache_dir) if cache_dir is not None else None
        self.stats = JudgeStats()

    @property
    def identity(self) -> str:
        """The judge part of a cache key: the spec and the reply-shaping settings."""
        return json.dumps([self.spec, self.settings], sort_keys=True)

    @property
    def template_sha256(self) -> str:
        return self.template.sha256 if self.template else ""

    def describe(self) -> dict[str, Any]:
        """What a run records about the judge, so its verdicts can be reproduced and audited."""
        return {
            "judge": self.spec,
            "settings": self.settings,
            "template": self.template.source if self.template else None,
            "template_sha256": self.template_sha256 or None,
            "swap_seed": self.seed,
        }

    def judge(self, pairs: Sequence[PairLike]) -> list[Verdict]:
        """One verdict per pair, in input order; cached replies are reused, the rest are asked for once
        per distinct key (a pair repeated in `pairs` is not paid for twice either)."""
        shown = [show(pair, is_swapped(self.seed, index)) for index, pair in enumerate(pairs)]
        keys = [cache_key(s, self.identity, self.template_sha256) for s in shown]
        verdicts: list[Verdict | None] = [None] * len(shown)
        waiting: dict[str, list[int]] = {}  # key -> indices that share its reply, the first one asked
        for index, key in enumerate(keys):
            record = self.cache.get(key) if self.cache else None
            if record is None:
                waiting.setdefault(key, []).append(index)
            else:
                reply = Reply(record["reply"], record["shown_winner"], record["input_tokens"], record["output_tokens"])
                verdicts[index] = verdict_of(reply, shown[index].swapped, cached=True)
        self.stats.add(cache_hits=sum(v is not None for v in verdicts))

        def deliver(index: int, reply: Reply) -> None:
            # called as each reply arrives (from worker threads for API judges): cache it at once, so
            # a run killed half-way keeps everything already paid for
            if reply.error:
                self.stats.add(failures=1)
            elif self.cache is not None:
                self.cache.put(keys[index], self.record_of(reply))
            for twin in waiting[keys[index]]:  # equal keys were shown equally, swap included
                verdicts[twin] = verdict_of(reply, shown[twin].swapped, cached=False)
            bar.update(1)

        if waiting:
            with tqdm(total=len(waiting), desc=f"judging ({self.spec})", unit="pair") as bar:
                self.answer([(indices[0], shown[indices[0]]) for indices in waiting.values()], deliver)
        done = [v for v in verdicts if v is not None]
        assert len(done) == len(shown), "a judge returned without answering every pair"
        self.stats.add(unparseable=sum(v.winner == "unparseable" and not v.error for v in done))
        return done

    def record_of(self, reply: Reply) -> dict[str, Any]:
        return {
            "judge": self.spec,
            "template_sha256": self.template_sha256,
            "shown_winner": reply.winner,
            "reply": reply.text,
            "input_tokens": reply.input_tokens,
            "output_tokens": reply.output_tokens,
        }

    def answer(self, items: list[tuple[int, Shown]], deliver: Deliver) -> None:
        """Call `deliver(index, reply)` once for every (index, shown pair)."""
        raise NotImplementedError


def verdict_of(reply: Reply, swapped: bool, cached: bool) -> Verdict:
    return Verdict(to_caller_order(reply.winner, swapped), reply.winner, swapped, reply.text, cached, reply.error,
                   reply.input_tokens, reply.output_tokens)


# ---------------------------------------------------------------- API judges


class MalformedResponse(Exception):
    """A 2xx answer whose body is not the provider's JSON shape; retried like a server error."""


@dataclass(frozen=True)
class Transient:
    reason: str  # one line for the log and for `Verdict.error`
    retry_after: float | None = None  # seconds, from the server's headers


def retry_after_seconds(headers: Any) -> float | None:
    """The wait a server asked for: `retry-after-ms`, or `retry-after` in seconds or as an HTTP date."""
    milliseconds = headers.get("retry-after-ms")
    if milliseconds is not None:
        try:
            return float(milliseconds) / 1000
        except ValueError:
            pass
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return float(value)
    except ValueError:
        pass
    try:
        return email.utils.parsedate_to_datetime(value).timestamp() - time.time()
    except (TypeError, ValueError):
        return None


def transient_failure(error: Exception, sdk: Any) -> Transient | None:
    """The retryable reading of an SDK error, or None when retrying cannot help (400, 401, 404 ...).
    Both SDKs share the same exception layout, so `sdk` is the module (openai or anthropic)."""
    if isinstance(error, sdk.APITimeoutError):
        return Transient("request timed out")
    if isinstance(error, sdk.APIConnectionError):
        return Transient("connection failed")
    if isinstance(error, sdk.APIStatusError):
        status = error.status_code
        if status in RETRYABLE_STATUS or status >= 500:
            return Transient(f"HTTP {status}", retry_after_seconds(error.response.headers))
        return None
    if isinstance(error, json.JSONDecodeError):  # the SDKs parse a JSON content type without checking
        return Transient("reply body is not valid JSON")
    if isinstance(error, MalformedResponse):
        return Transient(f"malformed reply: {error}")
    return None


def import_sdk(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError:
        raise ConfigError(f'{name}: judges need the {name} SDK: pip install -e ".[{name}]"') from None


def api_key(provider: str, spec: str, optional: bool) -> str | None:
    """The provider's key from its environment variable (the only place keys are read from)."""
    key = os.environ.get(KEY_ENV[provider], "")
    if not key and not optional:
        raise ConfigError(f"judge {spec}: set {KEY_ENV[provider]} in the environment (API keys are read only from there)")
    return key or None


class ApiJudge(Judge):
    """An LLM behind an HTTP API: requests run `options.concurrency` at a time, each retried per
    `options.retry`; the SDK's own retries are off so that these are the only ones."""

    provider = ""

    def __init__(self, spec: str, model: str, client: Any, sdk: Any, template: JudgeTemplate, options: ApiOptions,
                 cache_dir: str | Path | None, seed: int):
        super().__init__(spec, template, cache_dir, seed, {"max_tokens": options.max_tokens, "temperature": options.temperature})
        self.model = model
        self.client = client
        self.sdk = sdk
        self.options = options
        self.rng = random.Random()  # backoff jitter only; no verdict depends on it

    def request(self, prompt: str) -> tuple[str, int, int]:
        """One API call: (reply text, input tokens, output tokens)."""
        raise NotImplementedError

    def answer(self, items: list[tuple[int, Shown]], deliver: Deliver) -> None:
        pool = ThreadPoolExecutor(max_workers=self.options.concurrency, thread_name_prefix="judge")
        try:
            futures = [pool.submit(self.ask_and_deliver, index, s, deliver) for index, s in items]
            for future in as_completed(futures):
                future.result()  # re-raises a fatal error (bad key, unknown model) in this thread
        finally:
            # on a fatal error or Ctrl-C, drop the queued pairs; requests in flight finish and are cached
            pool.shutdown(wait=True, cancel_futures=True)

    def ask_and_deliver(self, index: int, shown: Shown, deliver: Deliver) -> None:
        deliver(index, self.ask(self.template.render(shown)))

    def ask(self, prompt: str) -> Reply:
        """The reply to `prompt`, retrying transient failures; a failed Reply once attempts run out."""
        retry = self.options.retry
        attempt = 0
        while True:
            attempt += 1
            self.stats.add(calls=1)
            try:
                text, input_tokens, output_tokens = self.request(prompt)
                break
            except Exception as error:
                failure = transient_failure(error, self.sdk)
                if failure is None:
                    if isinstance(error, self.sdk.APIStatusError):
                        raise ConfigError(self.refusal_message(error)) from None
                    raise
                if attempt == retry.max_attempts:
                    return Reply("", "unparseable", error=f"{failure.reason} (gave up after {attempt} attempts)")
                wait = retry.delay(attempt, failure.retry_after, self.rng)
                self.stats.add(retries=1)
                log.warning("judge %s: %s; retry %d of %d in %.1f s", self.spec, failure.reason, attempt,
                            retry.max_attempts - 1, wait)
                time.sleep(wait)
        cost = (input_tokens * self.options.input_price + output_tokens * self.options.output_price) / 1e6
        self.stats.add(input_tokens=input_tokens, output_tokens=output_tokens, cost=cost)
        text = redact(text)
        return Reply(text, parse_preference(text), input_tokens, output_tokens)

    def refusal_message(self, error: Any) -> str:
        """One line for a non-retryable HTTP error, naming what to fix; the server's text is redacted."""
        hints = {
            401: f"check the key in {KEY_ENV[self.provider]}",
            403: f"the key in {KEY_ENV[self.provider]} may not use this model",
            404: f"check the model name {self.model!r} and the base URL",
        }
        detail = redact(" ".join(str(error.message).split()))[:300]
        hint = hints.get(error.status_code, "check the judge settings")
        return f"judge {self.spec}: the server refused the request with HTTP {error.status_code} ({detail}); {hint}"


class OpenAIJudge(ApiJudge):
    provider = "openai"

    def request(self, prompt: str) -> tuple[str, int, int]:
        completion = self.client.chat.completions.create(
            model=self.model, messages=[{"role": "user", "content": prompt}],
            max_tokens=self.options.max_tokens,
            temperature=0.0 if self.options.temperature is None else self.options.temperature,
        )
        return openai_reply(completion)


def openai_reply(completion: Any) -> tuple[str, int, int]:
    """(choices[0].message.content, usage.prompt_tokens, usage.completion_tokens). The SDK builds the
    object without validation and returns a plain string for a non-JSON body, so check the shape."""
    choices = getattr(completion, "choices", None)
    content = getattr(getattr(choices[0], "message", None), "content", None) if choices else None
    if not isinstance(content, str):
        raise MalformedResponse("no choices[0].message.content")
    usage = getattr(completion, "usage", None)
    return content, getattr(usage, "prompt_tokens", 0) or 0, getattr(usage, "completion_tokens", 0) or 0


class AnthropicJudge(ApiJudge):
    provider = "anthropic"

    def request(self, prompt: str) -> tuple[str, int, int]:
        # the SDK dropped the `temperature` argument (anthropic>=1.0) while the API still takes it for
        # the models that support it, so it travels in the body, and only when asked for
        sampling = {} if self.options.temperature is None else {"extra_body": {"temperature": self.options.temperature}}
        message = self.client.messages.create(
            model=self.model, messages=[{"role": "user", "content": prompt}], max_tokens=self.options.max_tokens,
            **sampling,
        )
        return anthropic_reply(message)


def anthropic_reply(message: Any) -> tuple[str, int, int]:
    """(the text blocks of `content` joined, usage.input_tokens, usage.output_tokens)."""
    blocks = getattr(message, "content", None)
    texts = [getattr(b, "text", None) for b in blocks or [] if getattr(b, "type", None) == "text"]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise MalformedResponse("no text block in content")
    usage = getattr(message, "usage", None)
    return "".join(texts), getattr(usage, "input_tokens", 0) or 0, getattr(usage, "output_tokens", 0) or 0


def is_official_openai(base_url: str | None) -> bool:
    return base_url is None or (urlparse(base_url).hostname or "").endswith("api.openai.com")


def openai_judge(model: str, base_url: str | None, template: JudgeTemplate, options: ApiOptions,
                 cache_dir: str | Path | None, seed: int) -> OpenAIJudge:
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    spec = f"openai:{model}" + (f"@{base_url}" if base_url else "")
    sdk = import_sdk("openai")
    # a self-hosted server (vLLM, llama.cpp) needs no key, but the SDK insists on one
    key = api_key("openai", spec, optional=not is_official_openai(base_url)) or "no-key-needed"
    client = sdk.OpenAI(api_key=key, base_url=base_url, timeout=options.timeout, max_retries=0)
    return OpenAIJudge(spec, model, client, sdk, template, options, cache_dir, seed)


def anthropic_judge(model: str, base_url: str | None, template: JudgeTemplate, options: ApiOptions,
                    cache_dir: str | Path | None, seed: int) -> AnthropicJudge:
    spec = f"anthropic:{model}"
    sdk = import_sdk("anthropic")
    key = api_key("anthropic", spec, optional=False)
    base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
    client = sdk.Anthropic(api_key=key, base_url=base_url, timeout=options.timeout, max_retries=0)
    return AnthropicJudge(spec, model, client, sdk, template, options, cache_dir, seed)


# ---------------------------------------------------------------- local judges


class ChatModelJudge(Judge):
    """A local HF chat model: the rendered template as one user turn of its chat template, then
    greedy decoding of up to `max_new_tokens`, `batch_size` prompts at a time."""

    KIND = "hf"

    def __init__(self, target: str, template: JudgeTemplate, cache_dir: str | Path | None, seed: int,
                 max_new_tokens: int, batch_size: int):
        from ..models import load_policy, resolve_model_path

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
        from ..data.collate import left_pad_queries

        device = next(self.model.parameters()).device
        for start in range(0, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            queries = [self.query_ids(self.template.render(s)) + (suffix or []) for _, s in chunk]
            batch = left_pad_queries(queries, self.tokenizer.pad_token_id)
            yield chunk, queries, batch["input_ids"].to(device), batch["attention_mask"].to(device)

    def answer(self, items: list[tuple[int, Shown]], deliver: Deliver) -> None:
        from ..generation import SamplingParams, generate, response_texts

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
            raise ConfigError(f"judge {self.spec}: {text!r} is {len(ids)} tokens for this tokenizer, not one; use hf: instead")
        return ids[0]

    def choice_logprobs(self, items: list[tuple[int, Shown]]) -> list[tuple[list[float], int]]:
        """(logprobs of " A" and " B" after the answer prefix, prompt tokens) for each pair as shown."""
        import torch

        from ..ops import position_ids_from_mask

        results = []
        for _, queries, ids, mask in self.batches(items, self.prefix_ids):
            with torch.inference_mode():
                logits = self.model(input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask),
                                    logits_to_keep=1).logits[:, -1]
            results += zip(logits.float().log_softmax(-1)[:, self.choice_ids].tolist(), map(len, queries), strict=True)
        return results

    def answer(self, items: list[tuple[int, Shown]], deliver: Deliver) -> None:
        for start in range(0, len(items), self.batch_size):
            chunk = items[start : start + self.batch_size]
            mirrored = [(index, Shown(s.prompt, s.second, s.first, not s.swapped)) for index, s in chunk]
            shown, swapped = self.choice_logprobs(chunk), self.choice_logprobs(mirrored)
            for (index, _), (_, mirror), ((a, b), tokens), ((a_mirrored, b_mirrored), tokens_mirrored) in zip(
                    chunk, mirrored, shown, swapped, strict=True):
                self.stats.add(calls=2, input_tokens=tokens + tokens_mirrored)
                margin = ((a - b) + (b_mirrored - a_mirrored)) / 2  # for the response shown first
                readings = {"A": a, "B": b}, {"A": a_mirrored, "B": b_mirrored}
                deliver(index, self.reply(margin, *readings, tokens + tokens_mirrored))
                if self.cache is not None:  # the mirrored order is the same two readings: never pay for it again
                    mirrored_reply = self.reply(-margin, *reversed(readings), tokens + tokens_mirrored)
                    self.cache.put(cache_key(mirror, self.identity, self.template_sha256), self.record_of(mirrored_reply))

    def reply(self, margin_first: float, shown: dict[str, float], mirrored: dict[str, float], input_tokens: int) -> Reply:
        winner = "A" if margin_first > 0 else "B" if margin_first < 0 else "tie"
        logprobs = {"shown": shown, "mirrored": mirrored, "margin_first": margin_first}
        return Reply(f"{self.ANSWER_PREFIX} {winner} " + json.dumps(logprobs), winner, input_tokens, 0)


class RewardModelJudge(Judge):
    """A reward model as a judge: each response scored after the prompt (leading space + EOS, Detail 3);
    the higher reward wins and equal rewards tie. The prompt is tokenised as given, so pass it in the
    format and length the reward model was trained on (for TL;DR the truncated query)."""

    def __init__(self, folder: str, cache_dir: str | Path | None, seed: int, batch_size: int):
        from ..models import load_reward_model

        self.model, self.tokenizer = load_reward_model(folder)
        self.batch_size = batch_size
        super().__init__(f"rm:{folder}", None, cache_dir, seed, {"weights": weights_fingerprint(folder)})

    def answer(self, items: list[tuple[int, Shown]], deliver: Deliver) -> None:
        from ..data.formats import encode_completion, encode_text
        from ..scoring import score_texts

        queries = [encode_text(self.tokenizer, s.prompt) for _, s in items]
        responses = [encode_completion(self.tokenizer, s.first) for _, s in items]
        responses += [encode_completion(self.tokenizer, s.second) for _, s in items]
        scores = score_texts(self.model, self.tokenizer.pad_token_id, queries * 2, responses, self.batch_size, "judging")
        first, second = scores[: len(items)], scores[len(items) :]
        for (index, _), a, b in zip(items, first.tolist(), second.tolist(), strict=True):
            self.stats.add(calls=1)
            winner = "A" if a > b else "B" if b > a else "tie"
            deliver(index, Reply(json.dumps({"A": a, "B": b}), winner))


# ---------------------------------------------------------------- the factory


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
