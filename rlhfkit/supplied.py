"""Python objects handed to a stage by the Python API (`rlhfkit.api`): loaded models, tokenizers and reward
functions defined in a notebook. A config holds strings, so an object stands in it as `python:<name>`
(`model: python:model`, `reward_functions: [python:my_reward]`); the loaders look the name up here while
the API's call runs (`supplying`), in that call's context: a `ContextVar`, so two calls running side by side in
threads each see their own objects alone. Outside such a call (the command line reading a config.yaml an API run
wrote) the name is an error that says how to run it again. Kept free of torch: the registry holds objects,
the loaders that read them know what they are."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping
from types import MappingProxyType
from typing import Any

from .errors import ConfigError

PREFIX = "python:"
# spec -> object, of the API calls running in this context; each call sets a new mapping, never changes one
HELD: contextvars.ContextVar[Mapping[str, Any]] = contextvars.ContextVar(
    "rlhfkit_supplied_objects", default=MappingProxyType({})
)


def is_supplied(spec: str) -> bool:
    return isinstance(spec, str) and spec.startswith(PREFIX)


def lookup(spec: str, option: str) -> Any:
    """The object `spec` (python:<name>) stands for, or an error naming `option` when no API call holds it."""
    held = HELD.get()
    if spec not in held:
        raise ConfigError(
            f"{option}={spec} was a Python object given to rlhfkit's Python API, which only that call holds; "
            f"run it from Python again passing the object, or give {option} a folder, file or importable "
            "module:function (model.save_pretrained(folder) saves a model)"
        )
    return held[spec]


@contextlib.contextmanager
def supplying(objects: dict[str, Any]) -> Iterator[None]:
    """Hold `objects` (spec -> object) for the block; a spec already held by an enclosing call keeps its object."""
    held = HELD.get()
    clash = [spec for spec, obj in objects.items() if spec in held and held[spec] is not obj]
    if clash:
        raise ConfigError(f"{', '.join(clash)}: another object of this name is in use by a running call")
    token = HELD.set({**held, **objects})
    try:
        yield
    finally:
        HELD.reset(token)
