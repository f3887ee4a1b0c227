"""Multi-turn episodes in an on-policy run (`environment=`, docs/environments.md): the prompts a draw's episodes
start from and what the environment reports. The run's `EpisodePlan` (rlhfkit/environments/plan.py) is built
once, with the models (`OnPolicyModels.episodes`), from `cfg.episode_options`, as `eval gsm8k` builds its own."""

from __future__ import annotations

from ..environments import EpisodePrompt
from ..rollout import RolloutBatch
from .scoring import PromptTexts, component_metrics


def episode_prompts(texts: PromptTexts, prompts: list[int]) -> list[EpisodePrompt]:
    """What the episodes of `prompts` (indices into `texts`) start from, in order."""
    return [EpisodePrompt(texts.prompts[p], texts.columns[p], texts.where[p]) for p in prompts]


def environment_metrics(batch: RolloutBatch) -> dict[str, float]:
    """The mean over the update's episodes of what the environment reports (env/<name>)."""
    if batch.episodes is None:
        return {}
    episodes = batch.episodes
    return component_metrics(list(episodes.component_names), episodes.env_components, None, prefix="env/")
