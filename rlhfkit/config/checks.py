"""Checks across a stage's options, run as its config is resolved: a mistake that needs no data and no
model to see (a batch that does not split, nothing to train, two options that exclude each other)
fails before anything is loaded or any folder is made. The trainers call the batch checks again with
the processes they actually run on."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from ..errors import ConfigError
from .commands import AnalyzeConfig, EvalConfig, GenerateConfig, Gsm8kEvalConfig, JudgeEvalConfig, RMEvalConfig
from .onpolicy import DistillConfig, OnPolicyConfig
from .sections import SELF_TEACHER
from .training import DPOConfig, RunConfig, SFTConfig, TrainConfig


def launched_processes(requested: int = 1) -> int:
    """Processes a stage will run on: those of the launch it runs in, or those `--num-processes` asks for."""
    return max(requested, int(os.environ.get("WORLD_SIZE", "1")))


def check_config(cfg: Any, processes: int = 1) -> Any:
    """`cfg`, once its options agree with each other on `processes` processes."""
    if isinstance(cfg, RunConfig) and cfg.resume and cfg.overwrite:
        raise ConfigError(
            f"resume={cfg.resume} continues a run and overwrite=true moves the run in output_dir aside: give one of "
            "them"
        )
    if isinstance(cfg, TrainConfig | OnPolicyConfig):  # the stages that train, every one reading data=
        check_data_given(cfg)
    if isinstance(cfg, TrainConfig):
        check_training_length(cfg)
        check_batch_split(cfg, processes)
    if isinstance(cfg, SFTConfig):
        check_sft_format(cfg)
    if isinstance(cfg, OnPolicyConfig):
        check_update_split(cfg, processes)
        check_objective(cfg)
        check_distillation(cfg)
    if isinstance(cfg, DPOConfig):
        check_preference_loss(cfg)
    if isinstance(cfg, GenerateConfig):
        check_output_file(cfg.out, cfg.overwrite)
    if isinstance(cfg, AnalyzeConfig | RMEvalConfig | JudgeEvalConfig | EvalConfig | Gsm8kEvalConfig):
        check_output_folder(cfg.out, cfg.overwrite)
    return cfg


def check_output_file(out: str, overwrite: bool) -> None:
    """A command's output file is never written over silently, as a run folder is not: overwrite=true replaces it."""
    path = Path(out)
    if path.is_dir():
        raise ConfigError(f"out={out} is a folder; give the file to write, e.g. out={path / 'samples.jsonl'}")
    if path.exists() and not overwrite:
        raise ConfigError(f"out={out} already exists; pass overwrite=true to replace it, or choose another out=")


def check_output_folder(out: str, overwrite: bool) -> None:
    """A command's output folder that already holds files is refused unless overwrite=true (empty: a new timestamped
    folder)."""
    path = Path(out)
    if out and path.exists() and not path.is_dir():
        raise ConfigError(f"out={out} is a file; give a folder for the command's results")
    held = sorted(p.name for p in path.iterdir()) if out and path.is_dir() else []
    if held and not overwrite:
        shown = ", ".join(held[:3]) + (", ..." if len(held) > 3 else "")
        raise ConfigError(
            f"out={out} already holds files ({shown}); pass overwrite=true to write over them, or choose another out="
        )


def check_data_given(cfg: TrainConfig | OnPolicyConfig) -> None:
    """A stage that trains reads data=: empty (an unset shell variable, `data=[]` from Python), it is refused
    here, before the run folder is made, not met as a missing first record once the models have loaded."""
    if not cfg.data:
        raise ConfigError(
            "data= is empty: give a file, folder, hub id or in-memory data (was it an unset shell variable?)"
        )


def check_training_length(cfg: TrainConfig) -> None:
    if not cfg.max_steps and not cfg.num_epochs:
        raise ConfigError(
            "max_steps=0 and num_epochs=0 leave nothing to train: set max_steps (optimizer steps) or num_epochs "
            "(passes over the data) above 0"
        )


def check_sft_format(cfg: SFTConfig) -> None:
    """A format named beside the default data, TL;DR posts on the hub (tldr-sft), fails before the hub is asked for
    them: the user meant to give other data."""
    default = SFTConfig().data
    if cfg.data_format in ("auto", "tldr-sft") or list(cfg.data) != default:
        return
    hint = " (GSM8K's training problems: ../shared/data/gsm8k/train.jsonl.gz)" if cfg.data_format == "gsm8k" else ""
    raise ConfigError(
        f"data_format={cfg.data_format} but data= is left at its default, {', '.join(default)} (TL;DR posts, "
        f"tldr-sft): name the data to read with data={hint}"
    )


def check_batch_split(cfg: TrainConfig, processes: int) -> None:
    """A supervised step's batch splits into micro-batches on every process alike."""
    if cfg.total_batch_size % (cfg.micro_batch_size * processes):
        raise ConfigError(
            f"total_batch_size={cfg.total_batch_size} must be a multiple of micro_batch_size x processes = "
            f"{cfg.micro_batch_size} x {processes}; change total_batch_size or micro_batch_size"
        )


def check_update_split(cfg: OnPolicyConfig, processes: int) -> None:
    """An update's batch splits into groups, minibatches and processes (each process samples whole groups
    of the same number of prompts), and the run holds at least one update."""
    if cfg.total_batch_size % cfg.samples_per_prompt:
        raise ConfigError(
            f"total_batch_size={cfg.total_batch_size} must be a multiple of samples_per_prompt={cfg.samples_per_prompt}"
        )
    if cfg.total_batch_size % cfg.num_minibatches:
        raise ConfigError(
            f"total_batch_size={cfg.total_batch_size} must be a multiple of num_minibatches={cfg.num_minibatches}"
        )
    prompts = cfg.total_batch_size // cfg.samples_per_prompt
    if prompts % processes:
        raise ConfigError(
            f"total_batch_size / samples_per_prompt = {prompts} prompts per update must be a multiple "
            f"of the {processes} processes: each samples the same number of whole groups"
        )
    if not cfg.max_steps and cfg.total_episodes < cfg.total_batch_size:
        raise ConfigError(
            f"total_episodes={cfg.total_episodes} is less than one update of total_batch_size={cfg.total_batch_size}"
        )


def check_objective(cfg: OnPolicyConfig) -> None:
    """The objective's options agree: bounds that exist, an overlong buffer inside the allowed length
    (what an advantage estimator needs, the registry checks with the estimator's declaration)."""
    if cfg.clip_range_high and not cfg.clip_range:
        raise ConfigError(
            f"clip_range_high={cfg.clip_range_high} needs clipping: set clip_range above 0 (the lower bound)"
        )
    if cfg.dual_clip and cfg.dual_clip <= 1:
        raise ConfigError(f"dual_clip={cfg.dual_clip} must be above 1 (Ye et al. 2020: 3), or 0 to turn it off")
    if cfg.overlong_buffer >= cfg.max_response_length:
        raise ConfigError(
            f"overlong_buffer={cfg.overlong_buffer} must be below max_response_length={cfg.max_response_length}: "
            "it is the last part of the allowed length (DAPO: 4,096 of 20,480)"
        )


def check_distillation(cfg: OnPolicyConfig) -> None:
    """A teacher that can teach: `rlhfkit distill` has no task reward (which the other on-policy commands mix in);
    self-distillation reads a hint, without which the teacher is the reference; the teacher's temperature is the
    student's unless asked otherwise. (The teacher `distill` needs is required as the models load: its defaults
    resolve.)"""
    if isinstance(cfg, DistillConfig):
        rewards = [f"{k}=" for k in ("reward_functions", "reward_model") if getattr(cfg, k)]
        if rewards:
            raise ConfigError(f"rlhfkit distill learns from the teacher alone and {', '.join(rewards)} is given: to "
                              "mix a task reward with the teacher, run grpo, rloo, reinforce or ppo with teacher=")
    if cfg.teacher == SELF_TEACHER and not cfg.teacher_hint:
        raise ConfigError("teacher=self reads the prompt with teacher_hint= (e.g. 'The answer is {answer}.'): without "
                          "one it is the student's own starting weights on the same prompt, and teaches nothing")
    if cfg.teacher_hint and cfg.teacher != SELF_TEACHER:
        raise ConfigError(f"teacher_hint is read by teacher=self alone; teacher={cfg.teacher or '(none)'}")
    teacher_temperature = cfg.teacher_temperature or cfg.temperature
    if cfg.teacher and teacher_temperature != cfg.temperature and not cfg.teacher_temperature_differs:
        raise ConfigError(
            f"teacher_temperature={cfg.teacher_temperature:g} differs from the sampling "
            f"temperature={cfg.temperature:g}: the student's log-probabilities are taken at the sampling "
            "temperature, so the two distributions "
            "compared would be at different temperatures; set teacher_temperature_differs=true if that is meant"
        )
    if cfg.teacher and cfg.temperature == 0:
        raise ConfigError("temperature=0 samples greedily, where the student's log-probabilities are taken at "
                          "temperature 1: set temperature above 0 (e.g. 1.0, as distillation usually samples)")


def check_preference_loss(cfg: DPOConfig) -> None:
    """An option of one preference loss is not silently ignored by another, and cDPO's eps is a flip rate below 1/2."""
    if cfg.loss_type == "cdpo" and not 0 < cfg.label_smoothing < 0.5:
        raise ConfigError(
            f"loss_type=cdpo needs label_smoothing in (0, 0.5), the assumed rate of flipped labels; got "
            f"{cfg.label_smoothing} (0 is plain dpo, 0.5 ignores the labels)"
        )
    if cfg.loss_type != "cdpo" and cfg.label_smoothing:
        raise ConfigError(
            f"label_smoothing={cfg.label_smoothing} only applies to loss_type=cdpo (conservative DPO), "
            f"not {cfg.loss_type}"
        )
    if cfg.loss_type == "simpo" and cfg.reference_model:
        raise ConfigError(f"loss_type=simpo uses no reference model: remove reference_model={cfg.reference_model}")
