"""Multi-turn episodes: environments that answer the policy's turns (docs/environments.md)."""

from .base import Environment, EpisodeStart, Reply
from .plan import ChunkEpisodes, EpisodePlan, EpisodePrompt, episode_plan
from .registry import BUILTINS, check_environment, environment_class

__all__ = [
    "BUILTINS",
    "ChunkEpisodes",
    "check_environment",
    "Environment",
    "EpisodePlan",
    "EpisodePrompt",
    "EpisodeStart",
    "Reply",
    "environment_class",
    "episode_plan",
]
