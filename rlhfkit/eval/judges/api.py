"""API judges: an OpenAI-compatible chat server (OpenAI, vLLM, llama.cpp) and Anthropic's messages API.

Requests run N at a time; rate limits, server errors and timeouts are retried with backoff
(`RetryPolicy`); a malformed body is tried once more, and a refused connection or a host name that does
not resolve not at all: waiting does not fix them (`failure_of`); tokens and cost are counted. API keys are read only
from the environment and
are kept out of every message, log line and cached record (`redact`)."""

from __future__ import annotations

import email.utils
import importlib
import json
import logging
import os
import random
import socket
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from ...errors import ConfigError
from .core import Deliver, Judge, JudgeTemplate, Reply, Shown, parse_preference

log = logging.getLogger(__name__)

KEY_ENV = {"openai": "OPENAI_API_KEY", "anthropic": "ANTHROPIC_API_KEY"}
# 408 and 429 ask the client to come back later; 5xx are the server's own faults.
RETRYABLE_STATUS = (408, 429)
REDACTED = "[redacted]"


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


def redact(text: str) -> str:
    """`text` with the value of every API-key variable replaced, for anything printed or written: a
    server may echo the key in an error body (short values are skipped: they would blank out words)."""
    for name in KEY_ENV.values():
        secret = os.environ.get(name, "")
        if len(secret) >= 8:
            text = text.replace(secret, REDACTED)
    return text


class MalformedResponse(Exception):
    """A 2xx answer whose body is not the provider's JSON shape (an HTML page, a truncated body)."""


# a body cut short in transit may come whole on a second try; a server that answers with an HTML page
# (a proxy, a wrong base URL) answers the same way every time
MALFORMED_ATTEMPTS = 2
# nothing listening at the address, or a host name that does not resolve: no wait fixes either
UNREACHABLE = (ConnectionRefusedError, socket.gaierror)


@dataclass(frozen=True)
class Failure:
    """A failed request that may be retried: why, and how often at most."""

    reason: str  # one line for the log and for `Verdict.error`
    retry_after: float | None = None  # seconds, from the server's headers
    attempts: int | None = None  # times a request is tried while it fails this way (None: as the retry policy allows)


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


def causes(error: BaseException) -> list[BaseException]:
    """`error` and the exceptions it was raised from, outermost first (the SDKs wrap the socket's error twice)."""
    chain: list[BaseException] = []
    while error is not None and error not in chain:
        chain.append(error)
        error = error.__cause__ or error.__context__
    return chain


def connection_failure(error: Exception) -> Failure:
    """A connection that failed: not retried when nothing listens or the host name does not resolve."""
    unreachable = next((c for c in causes(error) if isinstance(c, UNREACHABLE)), None)
    if unreachable is None:
        return Failure("connection failed")
    return Failure(
        f"connection failed ({redact(str(unreachable))}); check the base URL and that the server runs", attempts=1
    )


def failure_of(error: Exception, sdk: Any) -> Failure | None:
    """The retryable reading of an SDK error, or None when the whole run should stop (400, 401, 404 ...).
    Both SDKs share the same exception layout, so `sdk` is the module (openai or anthropic)."""
    if isinstance(error, sdk.APITimeoutError):
        return Failure("request timed out")
    if isinstance(error, sdk.APIConnectionError):
        return connection_failure(error)
    if isinstance(error, sdk.APIStatusError):
        status = error.status_code
        if status in RETRYABLE_STATUS or status >= 500:
            return Failure(f"HTTP {status}", retry_after_seconds(error.response.headers))
        return None
    if isinstance(error, json.JSONDecodeError):  # the SDKs parse a JSON content type without checking
        return Failure("reply body is not valid JSON", attempts=MALFORMED_ATTEMPTS)
    if isinstance(error, MalformedResponse):
        return Failure(f"malformed reply: {redact(str(error))}", attempts=MALFORMED_ATTEMPTS)
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
        raise ConfigError(
            f"judge {spec}: set {KEY_ENV[provider]} in the environment (API keys are read only from there)"
        )
    return key or None


class ApiJudge(Judge):
    """An LLM behind an HTTP API: requests run `options.concurrency` at a time, each retried per
    `options.retry`; the SDK's own retries are off so that these are the only ones."""

    provider = ""

    def __init__(
        self,
        spec: str,
        model: str,
        client: Any,
        sdk: Any,
        template: JudgeTemplate,
        options: ApiOptions,
        cache_dir: str | Path | None,
        seed: int,
    ):
        super().__init__(
            spec, template, cache_dir, seed, {"max_tokens": options.max_tokens, "temperature": options.temperature}
        )
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
        """The reply to `prompt`, retrying failures that waiting may fix; a failed Reply once attempts run out."""
        retry = self.options.retry
        attempt = 0
        same_kind: Counter[type] = Counter()  # failed attempts by the error's type
        while True:
            attempt += 1
            self.stats.add(calls=1)
            try:
                text, input_tokens, output_tokens = self.request(prompt)
                break
            except Exception as error:
                failure = failure_of(error, self.sdk)
                if failure is None:
                    if isinstance(error, self.sdk.APIStatusError):
                        raise ConfigError(self.refusal_message(error)) from None
                    raise
                same_kind[type(error)] += 1
                if attempt == retry.max_attempts or same_kind[type(error)] == failure.attempts:
                    tries = f"gave up after {attempt} attempts" if attempt > 1 else "not retried"
                    return Reply("", "unparseable", error=f"{failure.reason} ({tries})")
                wait = retry.delay(attempt, failure.retry_after, self.rng)
                self.stats.add(retries=1)
                retries = min(retry.max_attempts, failure.attempts or retry.max_attempts) - 1
                log.warning("judge %s: %s; retry %d of %d in %.1f s", self.spec, failure.reason, attempt, retries, wait)
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
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=self.options.max_tokens,
            temperature=0.0 if self.options.temperature is None else self.options.temperature,
        )
        return openai_reply(completion)


def refuse_text_body(body: Any) -> None:
    """The SDKs hand back the text of a reply whose content type is not JSON (an HTML page, plain text)."""
    if isinstance(body, str):
        raise MalformedResponse(f"not JSON but {' '.join(body.split())[:80]!r}; check the base URL")


def openai_reply(completion: Any) -> tuple[str, int, int]:
    """(choices[0].message.content, usage.prompt_tokens, usage.completion_tokens). The SDK builds the
    object without validation and returns a plain string for a non-JSON body, so check the shape."""
    refuse_text_body(completion)
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
            model=self.model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=self.options.max_tokens,
            **sampling,
        )
        return anthropic_reply(message)


def anthropic_reply(message: Any) -> tuple[str, int, int]:
    """(the text blocks of `content` joined, usage.input_tokens, usage.output_tokens)."""
    refuse_text_body(message)
    blocks = getattr(message, "content", None)
    texts = [getattr(b, "text", None) for b in blocks or [] if getattr(b, "type", None) == "text"]
    if not texts or not all(isinstance(t, str) for t in texts):
        raise MalformedResponse("no text block in content")
    usage = getattr(message, "usage", None)
    return "".join(texts), getattr(usage, "input_tokens", 0) or 0, getattr(usage, "output_tokens", 0) or 0


def is_official_openai(base_url: str | None) -> bool:
    return base_url is None or (urlparse(base_url).hostname or "").endswith("api.openai.com")


def openai_judge(
    model: str,
    base_url: str | None,
    template: JudgeTemplate,
    options: ApiOptions,
    cache_dir: str | Path | None,
    seed: int,
) -> OpenAIJudge:
    base_url = base_url or os.environ.get("OPENAI_BASE_URL") or None
    spec = f"openai:{model}" + (f"@{base_url}" if base_url else "")
    sdk = import_sdk("openai")
    # a self-hosted server (vLLM, llama.cpp) needs no key, but the SDK insists on one
    key = api_key("openai", spec, optional=not is_official_openai(base_url)) or "no-key-needed"
    client = sdk.OpenAI(api_key=key, base_url=base_url, timeout=options.timeout, max_retries=0)
    return OpenAIJudge(spec, model, client, sdk, template, options, cache_dir, seed)


def anthropic_judge(
    model: str,
    base_url: str | None,
    template: JudgeTemplate,
    options: ApiOptions,
    cache_dir: str | Path | None,
    seed: int,
) -> AnthropicJudge:
    spec = f"anthropic:{model}"
    sdk = import_sdk("anthropic")
    key = api_key("anthropic", spec, optional=False)
    base_url = base_url or os.environ.get("ANTHROPIC_BASE_URL") or None
    client = sdk.Anthropic(api_key=key, base_url=base_url, timeout=options.timeout, max_retries=0)
    return AnthropicJudge(spec, model, client, sdk, template, options, cache_dir, seed)
