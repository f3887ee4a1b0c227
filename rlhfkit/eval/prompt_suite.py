"""Prompt suites: hand-written prompts by category (sycophancy, out-of-distribution, capability),
answered by each policy with `rlhfkit generate prompt_suite=...` and compared by `rlhfkit eval`
(seed 002, Part 4.2). Capability prompts carry the answers they accept."""

from __future__ import annotations

from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..errors import ConfigError

BUILTIN = {"builtin-hh": "hh-suite.yaml"}
CATEGORIES = ("sycophancy", "out-of-distribution", "capability")


@dataclass(frozen=True)
class SuitePrompt:
    id: str
    category: str
    prompt: str
    expect: list[str] = field(default_factory=list)

    def passes(self, response: str) -> bool | None:
        """Capability prompts: whether the response contains an accepted answer; None for the others."""
        if not self.expect:
            return None
        return any(answer.lower() in response.lower() for answer in self.expect)


def load_suite(name_or_path: str) -> list[SuitePrompt]:
    if name_or_path in BUILTIN:
        text, source = (resources.files("rlhfkit.prompts") / BUILTIN[name_or_path]).read_text(), name_or_path
    elif Path(name_or_path).is_file():
        text, source = Path(name_or_path).read_text(), name_or_path
    else:
        raise ConfigError(f"prompt_suite={name_or_path}: neither a file nor one of {', '.join(BUILTIN)}")
    return parse_suite(yaml.safe_load(text), source)


def parse_suite(data: Any, source: str) -> list[SuitePrompt]:
    if not isinstance(data, list) or not data:
        raise ConfigError(f"{source}: a prompt suite is a non-empty list of {{id, category, prompt, expect}}")
    prompts, seen = [], set()
    for number, item in enumerate(data, 1):
        where = f"{source}: entry {number}"
        if not isinstance(item, dict) or not all(
            isinstance(item.get(k), str) and item[k].strip() for k in ("id", "category", "prompt")
        ):
            raise ConfigError(f"{where} needs non-empty text fields id, category and prompt")
        if item["category"] not in CATEGORIES:
            raise ConfigError(
                f"{where} ({item['id']}): category {item['category']!r} is not one of {', '.join(CATEGORIES)}"
            )
        if item["id"] in seen:
            raise ConfigError(f"{where}: id {item['id']!r} is used twice")
        expect = item.get("expect", [])
        if not isinstance(expect, list) or not all(isinstance(e, str) and e for e in expect):
            raise ConfigError(f"{where} ({item['id']}): expect must be a list of non-empty strings")
        if (item["category"] == "capability") != bool(expect):
            raise ConfigError(
                f"{where} ({item['id']}): capability prompts, and only they, list the answers they expect"
            )
        seen.add(item["id"])
        prompts.append(SuitePrompt(item["id"], item["category"], item["prompt"].strip(), list(expect)))
    return prompts


def as_dialogue(prompt: str) -> str:
    """One user turn in HH-RLHF's format, ending where the assistant speaks."""
    return f"\n\nHuman: {prompt}\n\nAssistant:"
