"""The judges' core: what a judge compares and answers (`Pair`, `Shown`, `Reply`, `Verdict`), the
prompt template, the A/B order, the strict parser of the `Preferred:` line, the verdict cache and
the `Judge` base class that owns order, cache and bookkeeping around every judge family."""

from __future__ import annotations

import hashlib
import json
import logging
import re
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from tqdm.auto import tqdm

from ...errors import ConfigError, warn

log = logging.getLogger(__name__)

DEFAULT_TEMPLATE = "tldr-appendix-i.txt"
BUILTIN = "builtin:"
PLACEHOLDERS = ("prompt", "response_a", "response_b")
PLACEHOLDER_PATTERN = re.compile(r"\{(prompt|response_a|response_b)\}")
# Appendix I asks for the line `Preferred: <"A" or "B">`. Only that line counts: the letter in either
# case, in matching quotes or none. Anything else (prose, markdown, two different letters) is
# unparseable rather than a guessed vote.
PREFERRED_LINE = re.compile(r'^Preferred:[ \t]*("?)([AaBb])\1[ \t]*\r?$', re.MULTILINE)
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
    this process (cache hits cost nothing); `cache_hits`, `received` and `unparseable` count verdicts."""

    calls: int = 0  # requests sent, every attempt included (local judges: pairs generated or scored)
    cache_hits: int = 0
    received: int = 0  # replies that came back, parseable or not (cache hits not included)
    retries: int = 0
    failures: int = 0  # pairs left without a reply after the last attempt: failed calls, not answers
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


# ---------------------------------------------------------------- order, template, parsing, cache


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
    templates = (resources.files("rlhfkit.eval") / "templates").iterdir()
    return sorted(p.name.removesuffix(".txt") for p in templates if p.name.endswith(".txt"))


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
            raise ConfigError(
                f"judge template {BUILTIN}{name} is not shipped; choose one of "
                f"{', '.join(BUILTIN + t for t in builtin_templates())} or give a file"
            )
        source = resources.files("rlhfkit.eval") / "templates" / f"{name}.txt"
        return JudgeTemplate(source.read_text(encoding="utf-8"), f"{BUILTIN}{name}.txt")
    file = Path(path)
    if not file.is_file():
        raise ConfigError(
            f"judge template {file} not found; give a text file with {{prompt}}, {{response_a}} and {{response_b}}"
        )
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

    def __init__(
        self,
        spec: str,
        template: JudgeTemplate | None,
        cache_dir: str | Path | None,
        seed: int,
        settings: dict[str, Any],
    ):
        self.spec = spec
        self.template = template
        self.seed = seed
        self.settings = settings  # whatever shapes a reply besides the spec (never a key)
        self.cache = VerdictCache(cache_dir) if cache_dir is not None else None
        self.stats = JudgeStats()
        self.first_failure = ""  # why the first pair got no reply (API keys redacted)

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
                self.first_failure = self.first_failure or reply.error
            else:
                self.stats.add(received=1)
                if self.cache is not None:
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

    def require_a_verdict(self) -> None:
        """Stop in one line when every pair asked so far failed and none came from the cache: a result
        built on no verdict would read as a judge that answered, unparseably."""
        if self.stats.failures and not self.stats.received and not self.stats.cache_hits:
            raise ConfigError(
                f"judge {self.spec}: no verdict was received: all {self.stats.failures} pairs asked got no reply; "
                f"the first: {self.first_failure}"
            )

    def warn_of_failures(self) -> None:
        """One warning line when some pairs got no reply: they are counted apart, as no vote."""
        if self.stats.failures:
            warn(
                f"judge {self.spec}: {self.stats.failures} pairs got no reply and count as no vote; the first: "
                f"{self.first_failure}"
            )

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
    return Verdict(
        to_caller_order(reply.winner, swapped),
        reply.winner,
        swapped,
        reply.text,
        cached,
        reply.error,
        reply.input_tokens,
        reply.output_tokens,
    )
