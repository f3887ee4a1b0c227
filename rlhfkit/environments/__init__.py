"""Multi-turn episodes: environments that answer the policy's turns (docs/environments.md)."""

from .base import Environment, EpisodeStart, Reply
from .registry import BUILTINS, check_environment, environment_class

__all__ = ["BUILTINS", "check_environment", "Environment", "EpisodeStart", "Reply", "environment_class"]
