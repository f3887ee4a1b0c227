"""Calls into an environment's code: the user's code, run in the training process's main thread between
decoding steps (docs/environments.md, "When an environment fails").

As a reward function's call is (rlhfkit/reward_calls.py), each call is stopped at once by SIGTERM or SIGINT,
which drops the update (`preemption.interruptible`), and bounded by `environment_timeout`. Unlike a reward
function's failure, which scores its row `reward_error_score`, every fault of an environment stops the run
in one line naming the environment and the episode: raising or ending the process, overrunning the time
limit, returning something that is not a `Reply`, inserting ids outside the vocabulary, a reply in a place
the token rules do not allow, a reward that is not a finite number. An environment is a function of its
episode and the tokens it has seen, so its fault is a bug the next episode meets again, and an episode it
could not finish has nothing left to score.
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Callable
from typing import Any, TypeVar

from transformers import PreTrainedTokenizerBase

from ..errors import UserError
from ..preemption import interruptible
from ..reward_calls import TimedOut, time_limit
from .base import Environment, EpisodeStart, Reply

T = TypeVar("T")

TOKEN_RULES = (
    "after the policy's EOS a reply ends the episode (Reply.end) or opens a new message (self.message); after a "
    "pause it inserts text inside the turn (self.inline) or nothing (Reply())"
)


def fault(name: str, episode: str, problem: str) -> UserError:
    return UserError(f"environment {name} failed on episode {episode}: {problem}")


def guarded(name: str, episode: str, call: Callable[[], T], timeout: float = 0.0) -> T:
    """`call()`, which runs environment `name`'s code for `episode`: a stop signal ends it at once; one that
    overruns `timeout` seconds (0: no limit), raises or ends the process stops the run in one line."""
    try:
        with interruptible(), time_limit(timeout):
            return call()
    except TimedOut:
        raise fault(name, episode, f"still running after environment_timeout={timeout:g} s: stopped") from None
    except UserError:
        raise  # the environment's own one line (hh-dialogue's missing column)
    except (Exception, SystemExit, KeyboardInterrupt) as e:  # sys.exit or a KeyboardInterrupt must not end the run
        raise fault(name, episode, f"raised {type(e).__name__}" + (f": {e}" if str(e) else "")) from None


def built(
    environment: type[Environment],
    start: EpisodeStart,
    tokenizer: PreTrainedTokenizerBase,
    arguments: dict[str, Any],
    episode: str,
    timeout: float,
) -> Environment:
    """`environment(start, tokenizer, **arguments)`, its constructor guarded as every call is."""
    return guarded(environment.__name__, episode, lambda: environment(start, tokenizer, **arguments), timeout)


def reply_problem(reply: Any, ended_by_eos: bool, vocabulary: int) -> str | None:
    """What is wrong with `respond`'s answer to a turn that ended at the policy's EOS or at a pause, or None."""
    if not isinstance(reply, Reply):
        return (
            f"respond returned {type(reply).__name__}, not a Reply (Reply.end(), self.inline(text), self.message(...))"
        )
    if not isinstance(reply.ids, list | tuple):
        return f"replied with ids {reply.ids!r:.60}, not a list of token ids"
    for token in reply.ids:
        if not isinstance(token, numbers.Integral):
            return f"inserted {token!r:.40}, not a token id"
        if not 0 <= token < vocabulary:
            return f"inserted id {token}, outside the vocabulary (ids 0 to {vocabulary - 1})"
    if reply.done:
        return reward_problem(reply.reward)
    if ended_by_eos and reply.message is None:
        return (
            f"answered the policy's EOS with {'text inside the ended turn' if reply.ids else 'nothing'}: {TOKEN_RULES}"
        )
    if not ended_by_eos and reply.message is not None:
        return f"answered a pause inside the policy's turn with a new message: {TOKEN_RULES}"
    return None


def reward_problem(reward: Any) -> str | None:
    """Why an episode's reward cannot be trained on (as a reward function's NaN cannot), or None."""
    if reward is None:
        return None
    try:
        value = float(reward)
    except (TypeError, ValueError):
        return f"ended the episode with reward {reward!r:.40}, not a number"
    if not math.isfinite(value):
        return f"ended the episode with reward {value}, not a finite number: fix the environment's reward"
    return None


def component_values(reported: Any, names: tuple[str, ...]) -> list[float] | str:
    """The episode's components in the order of `names`, or what is wrong with what `components()` returned."""
    if not isinstance(reported, dict):
        return f"components() returned {type(reported).__name__}, not a dict of numbers by name"
    try:
        return [float(reported.get(name, 0.0)) for name in names]
    except (TypeError, ValueError):
        return f"components() returned {reported!r:.80}, not numbers"
