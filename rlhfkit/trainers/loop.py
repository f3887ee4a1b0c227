"""The one training loop every stage runs: SFT, reward model and DPO (optimizer steps over a dataset),
PPO, GRPO and RLOO (on-policy updates).

A stage supplies its step and its state through `Steps`; `run_loop` does the rest, the same way for
every stage and every number of processes: the progress bar, metrics logged every `log_every` steps
and whenever an evaluation ran, a checkpoint every `save_every` steps, a stop on SIGTERM/SIGINT agreed
by all processes (so all save the same step), the final checkpoint, then the final evaluation (after
the save: a failing evaluation must not lose the trained model), then closing the trackers.

A signal does not wait for work that can be done again: an evaluation ends at once (its metrics are
dropped), and so does a step inside a reward function's call (`preemption.interruptible`), which
leaves the step's state as it was before it began; the loop then checkpoints that state. In the
final evaluation the final checkpoint is already written, and a resumed run evaluates again.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from pathlib import Path
from typing import NoReturn, Protocol

import torch
from tqdm.auto import tqdm

from ..config import RunConfig
from ..preemption import Interrupted, StopSignal, exit_after_checkpoint, stopping_at_once
from ..tracking import Tracker

Show = Callable[[str], None]  # names the phase a long step is in (shown on the progress bar)


class Steps(Protocol):
    """What a stage gives the loop. Every method is called on every process, in the same order."""

    name: str  # progress-bar label
    unit: str  # "step" or "update", as the logs and the stop message name one
    total: int  # steps in the whole run

    def step(self, index: int, show: Show) -> dict[str, float]:
        """Run step `index` (0-based) and return its metrics (the same on every process). One that raises
        `Interrupted` leaves the state as it was before it began: the loop checkpoints it as `index` steps."""
        ...

    def evaluate(self, done: int) -> dict[str, float]:
        """Metrics of the model after `done` steps, or {} when the stage has no evaluation."""
        ...

    def save(self, done: int) -> None:
        """Write checkpoint `done` (the processes write it together)."""
        ...

    def finish(self) -> dict[str, float]:
        """The final evaluation, after the final checkpoint ({} for none)."""
        ...

    def postfix(self, metrics: dict[str, float]) -> dict[str, str]:
        """The few numbers the progress bar shows after a step."""
        ...


def agreed_signal(accelerator, stop: StopSignal) -> int:
    """The signal every process stops for after this step (0: none). Processes may get it a step apart,
    and all must save the same step: the checkpoint's collective calls would wait forever otherwise."""
    return int(accelerator.reduce(torch.tensor(stop.signum or 0, device=accelerator.device), "max").item())


def run_loop(steps: Steps, cfg: RunConfig, run_dir: Path, start: int, accelerator, resume: str) -> dict[str, float]:
    """Run steps `start .. steps.total` of `steps`; return the last step's metrics with the final
    evaluation's. `resume` is the command a preempted run prints to continue."""
    main = accelerator.is_main_process
    tracker = Tracker(run_dir, cfg.report_to, dataclasses.asdict(cfg), resume_step=start) if main else None

    def log(done: int, metrics: dict[str, float]) -> None:
        if tracker is not None and metrics:
            tracker.log(done, metrics)

    bar = tqdm(total=steps.total, initial=start, desc=steps.name, unit=steps.unit, disable=not main)

    def show(phase: str) -> None:
        bar.set_description_str(f"{steps.name} [{phase}]", refresh=True)

    def close() -> None:
        bar.close()
        if tracker is not None:
            tracker.close()

    def stop_after(signum: int, done: int, saved: int | None) -> NoReturn:
        if saved != done:
            steps.save(done)
        bar.close()  # first: the line starts a line of its own
        exit_after_checkpoint(signum, f"{steps.unit} {done}", run_dir, resume, announce=main)

    last: dict[str, float] = {}
    saved = start or None  # the step the newest checkpoint holds (None: none yet)
    # a step of a run on several processes is never dropped on one: the others would wait for it in a collective
    try:
        with StopSignal(droppable=accelerator.num_processes == 1) as stop:
            if cfg.eval_every and start == 0:
                log(0, unless_stopped(stop, functools.partial(steps.evaluate, 0)))  # where the curves start
            for index in range(start, steps.total):
                try:
                    metrics = steps.step(index, show)
                except (
                    Interrupted
                ) as interrupted:  # in a reward function: the step changed nothing yet and is dropped whole
                    stop_after(interrupted.signum, index, saved)
                done = index + 1
                evaluated = bool(cfg.eval_every) and done % cfg.eval_every == 0 and done < steps.total
                if evaluated:
                    show("evaluating")
                    metrics |= unless_stopped(stop, functools.partial(steps.evaluate, done))
                if evaluated or done % cfg.log_every == 0 or done == steps.total:
                    log(done, metrics)
                last = metrics
                bar.set_description_str(steps.name)
                bar.update(1)
                bar.set_postfix(steps.postfix(metrics))
                if cfg.save_every and done % cfg.save_every == 0 and done < steps.total:
                    steps.save(done)
                    saved = done
                if signum := agreed_signal(accelerator, stop):
                    stop_after(signum, done, saved)
            bar.close()
            steps.save(steps.total)
            if signum := agreed_signal(accelerator, stop):  # it came during the save
                stop_after(signum, steps.total, steps.total)
            # the final checkpoint is written: a signal ends the final evaluation at once, and resuming runs it again
            with stopping_at_once(run_dir, f"{steps.unit} {steps.total}", resume):
                final = steps.finish()
    except BaseException:  # a stop or an error: its line starts a line of its own, not the bar's
        close()
        raise
    log(steps.total, final)
    close()
    return last | final


def unless_stopped(stop: StopSignal, evaluate: Callable[[], dict[str, float]]) -> dict[str, float]:
    """`evaluate()`, or no metrics when a stop signal ends it: an evaluation is not worth finishing before
    the checkpoint (the signal stays recorded for the step's end)."""
    if not stop.droppable:  # several processes: a sharded evaluation's collectives need every process
        return evaluate()
    if stop.signum is not None:
        return {}
    try:
        with StopSignal(at_once=True):
            return evaluate()
    except Interrupted as interrupted:
        stop.signum = interrupted.signum
        return {}
