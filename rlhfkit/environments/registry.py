"""`environment=`: a built-in's name, `module:Class`, `path/to/file.py:Class`, or (through the Python API)
a class object held as `python:<name>`."""

from __future__ import annotations

import inspect
from typing import Any

from ..errors import ConfigError
from ..rewards import load_callable
from ..supplied import is_supplied, lookup
from .base import Environment
from .calculator import Gsm8kCalculator
from .dialogue import HHDialogue

BUILTINS: dict[str, type[Environment]] = {"gsm8k-calculator": Gsm8kCalculator, "hh-dialogue": HHDialogue}


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
    take; None without an environment."""
    if not spec:
        if arguments:
            raise ConfigError("environment_args is set but environment is not: name the environment they are for")
        return None
    environment = environment_class(spec)
    try:
        inspect.signature(environment).bind(None, None, **arguments)
    except TypeError as e:
        raise ConfigError(f"environment_args={arguments}: {environment.__name__} does not take them ({e})") from None
    return environment
