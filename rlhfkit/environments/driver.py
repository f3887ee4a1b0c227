"""Episodes inside the decoding loop: each row's environment answers between the policy's turns, and its
ids are fed to the model as forced tokens (docs/environments.md, "Token rules").

At every decoding step every row samples a token (so the random stream is the same whatever the
environments do: a resumed run and a run split across processes sample the same episodes); a row with
queued environment ids takes the next of them instead, unmarked in the policy mask. Nothing is re-encoded
and the KV cache simply continues: the episode is exactly the ids the model read.

Rules a test holds each to (tests/environments/test_environments.py):
- the last token of an episode is the policy's: a reply that does not fit the token budget is not
  inserted, and the episode ends there, truncated (`has_eos` false), as TRL rolls back overlong tool results;
- an episode ends when its environment says done, or truncated at the token budget or after `max_turns`
  policy turns;
- `has_eos` means the environment ended the episode after the policy's EOS.

Every call into the environment goes through `calls.guarded`: a stop signal ends it, `environment_timeout`
bounds it, and a fault stops the run in one line naming the environment and the episode (`labels`).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch
from transformers import PreTrainedTokenizerBase

from ..errors import UserError
from ..rollout import Episodes
from .base import Environment, Reply, overrides
from .calls import component_values, fault, guarded, reply_problem
from .chat_turns import expected_episode_ids, first_mismatch


@dataclass
class Episode:
    """One row's episode as it is sampled."""

    environment: Environment
    ids: list[int] = field(default_factory=list)
    sampled: list[bool] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    queue: deque = field(default_factory=deque)
    turn: list[int] = field(default_factory=list)  # the policy's ids since the last insertion
    turns: int = 0
    messages: list[tuple[str, list[int] | str]] = field(default_factory=list)  # for the token check
    finished: bool = False
    has_eos: bool = False
    reward: float = 0.0

    def add(self, token: int, sampled: bool, logprob: float = 0.0) -> None:
        self.ids.append(token)
        self.sampled.append(sampled)
        self.logprobs.append(logprob)


@dataclass(frozen=True)
class EpisodeLimits:
    budget: int  # tokens per episode, the policy's and the environment's
    max_turns: int  # the policy's turns (a turn ends at its EOS or at a pause)
    temperature: float  # the sampling temperature, at which the sampled tokens' log-probabilities are kept
    check_tokens: bool = False  # compare each episode with the chat template's rendering (`check_episode`)
    timeout: float = 0.0  # seconds a call of the environment may run (0: no limit): `environment_timeout`


class EpisodeResults(NamedTuple):
    """A chunk's episodes as every sampler returns its rows, and what episodes add."""

    responses: torch.Tensor  # (b, width) the policy's and the environment's ids, PAD after the episode
    lengths: torch.Tensor  # (b,)
    has_eos: torch.Tensor  # (b,) the environment ended the episode after the policy's EOS
    episodes: Episodes


class EpisodeDriver:
    """The episodes of one generation chunk, row r driven by `environments[r]` and named `labels[r]` in an
    error line (default: r); `advance` is called once per decoding step with the sampled tokens and returns
    the tokens to feed and which rows are done."""

    def __init__(
        self,
        environments: list[Environment],
        tokenizer: PreTrainedTokenizerBase,
        limits: EpisodeLimits,
        prompts: list[list[dict] | str] | None = None,
        labels: list[str] | None = None,
    ):
        self.episodes = [Episode(env) for env in environments]
        self.tokenizer, self.limits, self.prompts = tokenizer, limits, prompts
        self.labels = labels if labels is not None else [str(row) for row in range(len(environments))]
        self.eos_id, self.pad_id = tokenizer.eos_token_id, tokenizer.pad_token_id
        self.vocabulary = len(tokenizer)
        self.pauses = [overrides(type(env), "pauses_after") for env in environments]

    def advance(self, sampled: torch.Tensor, logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(the tokens every row feeds at this step, (B,) rows whose episode has ended)."""
        scaled = logits.float() / (self.limits.temperature if self.limits.temperature > 0 else 1.0)
        logprobs = scaled.log_softmax(-1).gather(-1, sampled.unsqueeze(-1)).squeeze(-1).tolist()
        chosen = []
        for row, (token, logprob) in enumerate(zip(sampled.tolist(), logprobs, strict=True)):
            chosen.append(self.next_token(row, token, logprob))
        fed = torch.tensor(chosen, dtype=sampled.dtype, device=sampled.device)
        finished = torch.tensor([e.finished for e in self.episodes], device=sampled.device)
        return fed, finished

    def next_token(self, row: int, token: int, logprob: float) -> int:
        episode = self.episodes[row]
        if episode.finished:
            return self.pad_id
        if episode.queue:
            forced = episode.queue.popleft()
            episode.add(forced, sampled=False)
            return forced
        episode.add(token, sampled=True, logprob=logprob)
        episode.turn.append(token)
        if token == self.eos_id:
            self.end_turn(row, ended_by_eos=True)
        elif self.pauses[row] and self.paused(row):
            self.end_turn(row, ended_by_eos=False)
        if not episode.finished and len(episode.ids) >= self.limits.budget:
            episode.finished = True  # truncated: the budget is spent inside the policy's turn
        return token

    def turn_text(self, episode: Episode) -> str:
        return self.tokenizer.decode(episode.turn, skip_special_tokens=True)

    def name(self, row: int) -> str:
        return type(self.episodes[row].environment).__name__

    def paused(self, row: int) -> bool:
        """Whether row's environment pauses the turn here; asked after every sampled token, so not timed
        (a quick test of the text), but a stop signal still ends it."""
        episode = self.episodes[row]
        text = self.turn_text(episode)
        return bool(guarded(self.name(row), self.labels[row], lambda: episode.environment.pauses_after(text)))

    def reply(self, row: int, ended_by_eos: bool) -> Reply:
        """Row's environment's answer to the turn that just ended, refused in one line unless the token rules
        allow it."""
        episode = self.episodes[row]
        turn, text = list(episode.turn), self.turn_text(episode)
        reply = guarded(
            self.name(row),
            self.labels[row],
            lambda: episode.environment.respond(turn, text, ended_by_eos),
            self.limits.timeout,
        )
        problem = reply_problem(reply, ended_by_eos, self.vocabulary)
        if problem is not None:
            raise fault(self.name(row), self.labels[row], problem)
        return reply

    def end_turn(self, row: int, ended_by_eos: bool) -> None:
        episode = self.episodes[row]
        episode.turns += 1
        reply = self.reply(row, ended_by_eos)
        if reply.done:
            self.finish(episode, reply, ended_by_eos)
        elif episode.turns >= self.limits.max_turns:
            episode.finished = True  # truncated: too many turns
        elif len(episode.ids) + len(reply.ids) >= self.limits.budget:
            episode.finished = True  # truncated: the reply does not fit, and the last token stays the policy's
        else:
            episode.queue.extend(reply.ids)
            self.record_turn(episode, reply)
            episode.turn = []

    def record_turn(self, episode: Episode, reply: Reply) -> None:
        """The conversation as the chat template would render it, up to an inserted reply: the policy's ids
        and the inline replies make one assistant message; a reply's `message` starts the next."""
        if not self.limits.check_tokens:
            return
        if not episode.messages or episode.messages[-1][0] != "assistant":
            episode.messages.append(("assistant", []))
        episode.messages[-1][1].extend(episode.turn)
        if reply.message is None:
            episode.messages[-1][1].extend(reply.ids)
        else:
            episode.messages.append((reply.message["role"], reply.message["content"]))

    @staticmethod
    def finish(episode: Episode, reply: Reply, ended_by_eos: bool) -> None:
        episode.finished, episode.has_eos = True, ended_by_eos
        episode.reward = float(reply.reward) if reply.reward is not None else 0.0

    def check_episode(self, row: int) -> None:
        """Refuse an episode whose ids differ from the chat template's rendering of the same conversation,
        naming the first differing position."""
        episode = self.episodes[row]
        if self.prompts is None or not isinstance(self.prompts[row], list):
            raise UserError("check_tokens needs chat prompts (a dataset of messages): the chat template renders them")
        messages = [(role, list(content) if role == "assistant" else content) for role, content in episode.messages]
        if episode.turn:  # the last turn: ended by the environment, the budget or the turn limit
            if messages and messages[-1][0] == "assistant":
                messages[-1][1].extend(episode.turn)
            else:
                messages.append(("assistant", list(episode.turn)))
        expected = expected_episode_ids(self.tokenizer, self.prompts[row], messages)
        mismatch = first_mismatch(self.tokenizer, expected, episode.ids)
        if mismatch is not None:
            raise UserError(
                f"episode {self.labels[row]}: token {mismatch.position} differs from the chat template's rendering "
                f"(expected {mismatch.expected}, sampled {mismatch.actual}; around it: {mismatch.context!r}); "
                f"environment {type(episode.environment).__name__} inserted ids the template does not write"
            )

    def results(self, width: int, device: torch.device) -> EpisodeResults:
        """The chunk's episodes as (b, width) responses padded with PAD, (b,) lengths and has_eos, and what
        episodes add (`Episodes`)."""
        if self.limits.check_tokens:
            for row in range(len(self.episodes)):
                self.check_episode(row)
        rows = len(self.episodes)
        responses = torch.full((rows, width), self.pad_id, dtype=torch.long)
        policy_mask = torch.zeros(rows, width, dtype=torch.bool)
        logprobs = torch.zeros(rows, width, dtype=torch.float32)
        for i, episode in enumerate(self.episodes):
            n = len(episode.ids)
            responses[i, :n] = torch.tensor(episode.ids, dtype=torch.long)
            policy_mask[i, :n] = torch.tensor(episode.sampled)
            logprobs[i, :n] = torch.tensor(episode.logprobs)
        names = type(self.episodes[0].environment).component_names if self.episodes else ()
        reported = [self.components(row, names) for row in range(rows)]
        episodes = Episodes(
            policy_mask,
            logprobs,
            torch.tensor([e.reward for e in self.episodes], dtype=torch.float32),
            torch.tensor(reported, dtype=torch.float32).reshape(rows, len(names)),
            names,
        )
        return EpisodeResults(
            responses.to(device),
            torch.tensor([len(e.ids) for e in self.episodes], dtype=torch.long, device=device),
            torch.tensor([e.has_eos for e in self.episodes], dtype=torch.bool, device=device),
            episodes.map(lambda value: value.to(device)),
        )

    def components(self, row: int, names: tuple[str, ...]) -> list[float]:
        """What row's environment reports at the episode's end, in the order of `names`."""
        environment = self.episodes[row].environment
        values = component_values(
            guarded(self.name(row), self.labels[row], environment.components, self.limits.timeout), names
        )
        if isinstance(values, str):
            raise fault(self.name(row), self.labels[row], values)
        return values
