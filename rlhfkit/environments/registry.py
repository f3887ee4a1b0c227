"""`environment=`: a built-in's name, `module:Class`, `path/to/file.py:Class`, or (through the Python API)
a class object held as `python:<name>`."""

from __future__ import annotations

import inspect
import types
import typing
from typing import Any

from ..errors import ConfigError
from ..rewards import load_callable
from ..supplied import is_supplied, lookup
from .base import Environment
from .calculator import Gsm8kCalculator
from .dialogue import HHDialogue

BUILTINS: dict[str, type[Environment]] = {"gsm8k-calculator": Gsm8kCalculator, "hh-dialogue": HHDialogue}
# the annotations whose values are checked, as the option values of a command line are
EXPECTED = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null"}


def environment_class(spec: str) -> type[Environment]:
    """The Environment subclass `spec` names, or a one-line error naming the option."""
    if is_supplied(spec):
        found = lookup(spec, "environment")
    elif spec in BUILTINS:
        found = BUILTINS[spec]
    else:
        found = load_callable(spec, "environment", BUILTINS, "class")
    if not (isinstance(found, type) and issubclass(found, Environment)):
        raise ConfigError(
            f"environment={spec}: {found!r} is not a subclass of rlhfkit.environments.Environment "
            '(docs/environments.md, "Writing an environment")'
        )
    return found


def check_environment(spec: str, arguments: dict[str, Any]) -> type[Environment] | None:
    """The class `environment=spec` names, after refusing `environment_args` its constructor does not
    take, values that do not fit their annotations and negative counts; None without an environment."""
    if not spec:
        if arguments:
            raise ConfigError("environment_args is set but environment is not: name the environment they are for")
        return None
    environment = environment_class(spec)
    try:
        inspect.signature(environment).bind(None, None, **arguments)
    except TypeError as e:
        raise ConfigError(f"environment_args={arguments}: {environment.__name__} does not take them ({e})") from None
    check_values(environment, arguments)
    return environment


def check_values(environment: type[Environment], arguments: dict[str, Any]) -> None:
    """Refuse, before anything loads, a value its constructor's annotation does not allow (`max_calls: int`
    given "lots") and a negative value of one of the class's `counts`: either would fail, or count
    backwards, only once an episode runs."""
    annotations = constructor_annotations(environment)
    for name, value in arguments.items():
        expected = expected_values(annotations.get(name))
        if expected is not None and not any(fits(value, kind) for kind in expected):
            wanted = " or ".join(EXPECTED[kind] for kind in expected)
            raise ConfigError(f"environment_args: {name} expects {wanted}, got {value!r}")
        if name in environment.counts and fits(value, float) and value < 0:
            raise ConfigError(f"environment_args: {name} is a count: give 0 or more, got {value!r}")


def constructor_annotations(environment: type[Environment]) -> dict[str, Any]:
    """The constructor's annotations as types; none when a name in them cannot be resolved (then no value is
    checked against them)."""
    try:
        return typing.get_type_hints(environment.__init__)
    except Exception:  # a name the class's module does not define: its annotations are text only
        return {}


def expected_values(annotation: Any) -> tuple[type, ...] | None:
    """The kinds of value `annotation` allows when it is built of int, float, bool, str and None alone
    (`int`, `float | None`); None for any other annotation, which is not checked."""
    union = typing.get_origin(annotation) in (typing.Union, types.UnionType)
    kinds = typing.get_args(annotation) if union else (annotation,)
    return kinds if all(kind in EXPECTED for kind in kinds) else None


def fits(value: Any, kind: type) -> bool:
    """Whether `value` is a `kind`: a bool is not a number here, and an integer is also a float, as in Python."""
    if kind in (int, float) and isinstance(value, bool):
        return False
    return isinstance(value, int | float) if kind is float else isinstance(value, kind)
