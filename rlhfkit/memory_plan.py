"""`rlhfkit plan`: a stage's estimated peak memory per device, broken into weights, gradients, optimizer
state, activations, KV cache and logits, and whether it fits; when it does not, the changes (LoRA,
sharding, a smaller micro-batch, activation checkpointing) that the same arithmetic says fit.

The arithmetic follows what rlhfkit runs (docs/memory.md has the derivation and the validation):

    weights     4 B x parameters of every model held (fp32 as loaded; bf16 is autocast over them);
                fsdp2/zero3: / N, plus the gathered units (the non-decoder parameters and two decoder
                layers of each model the phase runs); on-policy generation: the whole policy, which
                is gathered once per rollout (sharding.gathered_for_generation)
    gradients   4 B x trained parameters (/ N when sharded); replicated on N > 1: a second copy
                (DDP's buckets for sft/rm/dpo; the flattened all-reduce at the on-policy step)
    optimizer   AdamW: 8 B x trained parameters (/ N when sharded); at the step + 4 B x trained
                parameters (the foreach temporary)
    activations per decoder layer and token (bytes; h hidden, kv key/value width, I MLP width, n heads):
                    gated MLP, q/k/v apart (Llama):   fp32 32h + 8kv + 16I    bf16 30h + 4kv + 8I
                    plain MLP, fused qkv (GPT-NeoX):  fp32 32h + 8I           bf16 18h + 4I
                plus 4n (attention log-sum-exp), rank x a per LoRA-wrapped linear, and per layer the
                rows x width^2 x a mask SDPA keeps (a: 2 bf16, 4 fp32); 8h per token (final norm) and
                4h per scored token (the head's input) besides; bf16: the casts of the decoder linears'
                weights (2 B per weight) that autocast keeps for the backward pass.
                Activation checkpointing: the 4h-per-token input of every layer, plus the larger of the
                cached weight casts (trained weights only) and one layer recomputed.
    KV cache    generation: a static fp32 cache of every layer, rows x (query + response) x 2kv x 4 B
                (the keys leave the rotary embedding in fp32, so the cache takes fp32), plus the
                prompts' own cache (keys fp32, values a) while it is copied in; CUDA-graph decoding keeps
                its buffers (decoding.buckets.decoding_buffers x 2kv x a) through scoring, update and optimizer step
    logits      the log-probabilities are formed 256 positions at a time (ops.chunked_logprobs_entropy):
                in the update the larger of the forward's chunk, 20 B x 256 x V, and the top of the
                backward pass, 4 B x V x h (the head's gradient; none with LoRA) + 16h B per token;
                in no-grad passes 16 B x 256 x V (+ 2 B x V x h for the bf16 head cast)

Phases, as the stages run them: "update" (forward and backward of one micro-batch with the gradients
and optimizer state of earlier micro-batches and steps), "optimizer step", and for on-policy stages
"generation" (no gradients: they are freed after each step) and "scoring" (no-grad forward passes
of forward_batch_size rows); DPO also has "reference pass". The peak is the largest phase.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from .config import DPOConfig, OnPolicyConfig, PlanConfig, RMConfig, SFTConfig
from .decoding.buckets import decoding_buffers
from .model_shape import Shape, read_shape

GIB = 1024**3
CHUNK_ROWS = 256  # ops.chunked_logprobs_entropy's default
COMPONENTS = ("weights", "gradients", "optimizer state", "activations", "KV cache", "logits")
@dataclass(frozen=True)
class PlannedStage:
    """What the planner needs of a stage, handed in by the stage registry so that the planner imports no
    stage: its config class (which memory model applies, and its defaults) and whether it trains a value
    model beside the policy (PPO)."""

    config: type
    value_model: bool


@dataclass(frozen=True)
class Settings:
    """A plan's inputs with the stage's defaults filled in."""

    stage: str
    kind: type  # the stage's config class: which memory model applies
    critic: bool  # whether the stage trains a value model beside the policy (PPO)
    micro: int  # rows (pairs) per forward/backward pass
    forward: int  # rows (pairs) per no-grad pass
    generation: int  # rows per generation batch
    samples: int  # per prompt
    query: int
    response: int
    bf16: bool
    checkpointing: bool
    lora_rank: int
    lora_targets: tuple[str, ...]
    sharding: str
    devices: int
    decoding: str
    shared_prefix: str = "off"

    @property
    def on_policy(self) -> bool:
        return issubclass(self.kind, OnPolicyConfig)

    def passes(self, rows: int) -> tuple[int, int]:
        """(rows, width) of an on-policy pass over `rows` rollout rows: one row per group of `samples`,
        the query once, where the stage reads shared rows (`shared_rows.py`), else rows of their own."""
        if self.on_policy and self.samples > 1 and self.shared_prefix == "auto" and rows % self.samples == 0:
            return rows // self.samples, self.query + self.samples * self.response
        return rows, self.query + self.response

    @property
    def act_bytes(self) -> int:
        return 2 if self.bf16 else 4

    @property
    def shards(self) -> int:
        """How many ways gradients and optimizer state are split."""
        return self.devices if self.sharding != "none" else 1

    @property
    def weight_shards(self) -> int:
        return self.devices if self.sharding in ("fsdp2", "zero3") else 1


def settings_of(cfg: PlanConfig, stage: PlannedStage) -> Settings:
    default = stage.config()

    def pick(mine: int, name: str) -> int:
        return mine or getattr(default, name, 0)

    return Settings(
        stage=cfg.stage,
        kind=stage.config,
        critic=stage.value_model,
        micro=pick(cfg.micro_batch_size, "micro_batch_size"),
        forward=pick(cfg.forward_batch_size, "forward_batch_size"),
        generation=pick(cfg.generation_batch_size, "generation_batch_size"),
        samples=pick(cfg.samples_per_prompt, "samples_per_prompt") or 1,
        query=pick(cfg.max_query_length, "max_query_length"),
        response=pick(cfg.max_response_length, "max_response_length"),
        bf16=cfg.mixed_precision != "no",
        checkpointing=cfg.gradient_checkpointing,
        lora_rank=cfg.lora_rank,
        lora_targets=tuple(cfg.lora_target_modules),
        sharding=cfg.sharding,
        devices=cfg.devices,
        decoding=cfg.decoding,
        shared_prefix=cfg.shared_prefix,
    )


@dataclass(frozen=True)
class Held:
    """One model a stage holds: the policy, its frozen reference, the reward model or the value model."""

    role: str
    shape: Shape
    scalar: bool  # a backbone with a scalar head (no LM head)
    trained: bool

    @property
    def params(self) -> int:
        return self.shape.backbone_params + self.shape.hidden + 1 if self.scalar else self.shape.params

    def trained_params(self, s: Settings) -> int:
        if not self.trained:
            return 0
        if not s.lora_rank:
            return self.params
        head = self.shape.hidden + 1 if self.scalar else 0  # the scalar head stays fully trainable
        return s.lora_rank * self.shape.lora_sum(list(s.lora_targets))[0] + head

    def gathered_unit(self) -> int:
        """Parameters fsdp2/zero3 hold gathered while the model runs: its non-decoder parameters
        (embeddings, final norm, head: the root unit) and two decoder layers (one computing, one prefetched)."""
        return self.params - self.shape.layers * self.shape.layer_params + 2 * self.shape.layer_params


def held_models(s: Settings, policy: Shape, reward: Shape) -> list[Held]:
    """The models each stage holds (models.py, trainers/, onpolicy/trainer.load_models). With LoRA the
    reference is the adapter-disabled policy: no copy."""
    if issubclass(s.kind, SFTConfig):
        return [Held("policy", policy, False, True)]
    if issubclass(s.kind, RMConfig):
        return [Held("reward", policy, True, True)]
    models = [Held("policy", policy, False, True)] + ([] if s.lora_rank else [Held("reference", policy, False, False)])
    if s.on_policy:
        models.append(Held("reward", reward, True, False))
    if s.critic:
        models.append(Held("value", reward, True, True))
    return models


def layer_bytes_per_token(shape: Shape, s: Settings) -> int:
    """Saved activations of one decoder layer per token (counted with saved-tensor hooks, docs/memory.md)."""
    h, kv, inner, a = shape.hidden, shape.kv_dim, shape.intermediate, s.act_bytes
    if shape.gated:
        core = 32 * h + 8 * kv + 16 * inner if a == 4 else 30 * h + 4 * kv + 8 * inner
    else:
        core = 32 * h + 8 * inner if a == 4 else 18 * h + 4 * inner
    lora = s.lora_rank * a * shape.lora_sum(list(s.lora_targets))[1] if s.lora_rank else 0
    return core + 4 * shape.heads + lora


def training_activations(model: Held, s: Settings, rows: int, width: int, scored: int) -> int:
    """Bytes the forward pass of one micro-batch keeps for the backward pass (`scored` tokens reach the LM head)."""
    shape, a = model.shape, s.act_bytes
    tokens = rows * width
    per_layer = tokens * layer_bytes_per_token(shape, s) + rows * width * width * a
    edges = tokens * 8 * shape.hidden + (0 if model.scalar else scored * 4 * shape.hidden) + rows * width * width
    casts = 2 * shape.layers * shape.layer_linear_weights if s.bf16 else 0
    if not s.checkpointing:
        return shape.layers * per_layer + edges + casts
    inputs = shape.layers * tokens * 4 * shape.hidden
    cached = casts if not s.lora_rank else 0  # autocast caches casts of trained weights until it exits
    return inputs + edges + max(cached, per_layer + casts // shape.layers)


def forward_working_set(shape: Shape, s: Settings, rows: int, width: int) -> int:
    """A no-grad forward pass: the final hidden states, one layer's transients and the attention masks."""
    tokens = rows * width
    return tokens * (20 * shape.hidden + 3 * s.act_bytes * shape.intermediate) + rows * width * width * (
        1 + s.act_bytes
    )


def update_transient(model: Held, s: Settings, tokens: int, scored: int) -> int:
    """The larger of the forward pass's log-probability chunk (its logits and their fp32 copies) and the
    top of the backward pass: the LM head's gradient (held until the tied embedding's arrives; none
    with LoRA, whose head is frozen) and the last layer's gradient temporaries."""
    shape = model.shape
    forward = 0 if model.scalar else 20 * min(CHUNK_ROWS, scored) * shape.vocab
    head_grad = 0 if model.scalar or s.lora_rank else 4 * shape.vocab * shape.hidden
    return max(forward, head_grad + 16 * shape.hidden * tokens)


def logits_bytes(shape: Shape, s: Settings, scored: int) -> int:
    """A no-grad forward pass's log-probability chunk, and the bf16 cast of the head."""
    return 16 * min(CHUNK_ROWS, scored) * shape.vocab + (2 * shape.vocab * shape.hidden if s.bf16 else 0)


def weights_bytes(models: list[Held], s: Settings, running: list[Held]) -> int:
    full = sum(4 * m.params for m in models)
    if s.weight_shards == 1:
        return full
    return full // s.weight_shards + 4 * sum(m.gathered_unit() for m in running)


def phases(s: Settings, policy: Shape, reward: Shape) -> dict[str, dict[str, int]]:
    """Bytes per device of each component in each phase of the stage."""
    models = held_models(s, policy, reward)
    trained = [m for m in models if m.trained]
    trained_params = sum(m.trained_params(s) for m in trained)
    grads = 4 * trained_params // s.shards
    optimizer = 8 * trained_params // s.shards
    replicated_copy = 4 * trained_params if s.devices > 1 and s.sharding == "none" else 0
    (rows, width), scored = s.passes(s.micro), s.micro * s.response
    if issubclass(s.kind, RMConfig):  # one packed row per pair: query + chosen + rejected (collate.pack_pairs)
        width, scored = s.query + 2 * s.response, 0
    if issubclass(s.kind, DPOConfig):  # a shared row per pair (scoring.collate_shared_pairs), else a row per response
        rows, scored = 2 * s.micro, 2 * s.micro * s.response
        if s.shared_prefix == "auto":
            rows, width = s.micro, s.query + 2 * s.response
    biggest = max(models, key=lambda m: m.gathered_unit())
    out: dict[str, dict[str, int]] = {}
    acts = sum(training_activations(m, s, rows, width, scored) for m in trained)
    out["update"] = {
        "weights": weights_bytes(models, s, trained),
        "gradients": grads + (replicated_copy if not s.on_policy else 0),
        "optimizer state": optimizer,
        "activations": acts,
        "logits": update_transient(trained[0], s, rows * width, scored),
    }
    out["optimizer step"] = {
        "weights": weights_bytes(models, s, []),
        "gradients": grads + replicated_copy,
        "optimizer state": optimizer + 4 * trained_params // s.shards,
    }
    if issubclass(s.kind, DPOConfig):  # reference log-probabilities, computed before training (no optimizer state yet)
        pairs = 2 * s.forward
        out["reference pass"] = {
            "weights": weights_bytes(models, s, [biggest]),
            "activations": forward_working_set(policy, s, pairs, width),
            "logits": logits_bytes(policy, s, pairs * s.response),
        }
    if s.on_policy:
        queries = max(1, s.generation // s.samples)
        sampled = queries * s.samples
        kv = (
            policy.layers
            * policy.kv_dim
            * (sampled * (s.query + s.response) * 2 * 4 + queries * s.query * (4 + s.act_bytes))
        )
        gathered_policy = 4 * models[0].params - 4 * models[0].params // s.weight_shards
        out["generation"] = {
            "weights": weights_bytes(models, s, []) + gathered_policy,
            "optimizer state": optimizer,
            "KV cache": kv,
            "activations": forward_working_set(policy, s, queries, s.query),
            "logits": 12 * sampled * policy.vocab,
        }
        groups = max(s.samples, s.forward - s.forward % s.samples)  # scoring passes hold whole groups
        passes, pass_width = s.passes(groups)
        widest = max((m.shape for m in models), key=lambda sh: forward_working_set(sh, s, passes, pass_width))
        out["scoring"] = {
            "weights": weights_bytes(models, s, [biggest]),
            "optimizer state": optimizer,
            "activations": forward_working_set(widest, s, passes, pass_width),
            "logits": logits_bytes(policy, s, s.forward * s.response),
        }
        rows, length = decoding_buffers(s.generation, s.query + s.response)  # sharded weights decode eagerly
        kept = (
            0
            if s.decoding == "eager" or s.sharding in ("fsdp2", "zero3")
            else policy.layers * policy.kv_dim * 2 * s.act_bytes * rows * length
        )
        out["scoring"]["KV cache"] = out["update"]["KV cache"] = out["optimizer step"]["KV cache"] = kept
    return {name: {c: parts.get(c, 0) for c in COMPONENTS} for name, parts in out.items()}


@dataclass
class Plan:
    cfg: PlanConfig
    settings: Settings
    models: list[Held]
    phases: dict[str, dict[str, int]]
    peak_phase: str
    suggestions: list[tuple[dict[str, Any], Plan]] = dataclasses.field(default_factory=list)

    @property
    def peak(self) -> int:
        return sum(self.phases[self.peak_phase].values())

    @property
    def usable(self) -> float:
        return self.cfg.device_memory_gb * GIB * (1 - self.cfg.headroom)

    @property
    def fits(self) -> bool:
        return self.peak <= self.usable


def estimate(cfg: PlanConfig, stage: PlannedStage, policy: Shape, reward: Shape | None = None) -> Plan:
    """The plan of `cfg`, whose stage is `stage`, for already-read shapes (no suggestions)."""
    s = settings_of(cfg, stage)
    by_phase = phases(s, policy, reward or policy)
    peak_phase = max(by_phase, key=lambda name: sum(by_phase[name].values()))
    return Plan(cfg, s, held_models(s, policy, reward or policy), by_phase, peak_phase)


def candidate_changes(plan: Plan) -> list[dict[str, Any]]:
    """Single changes that lower the peak: LoRA, fsdp2 over the devices, halved batches, checkpointing."""
    s, changes = plan.settings, []
    if not s.lora_rank:
        changes.append({"lora_rank": 16})
    if s.devices > 1 and s.sharding in ("none", "zero2"):
        changes.append({"sharding": "fsdp2"})
    micro = s.micro
    while micro > 1:
        micro //= 2
        changes.append({"micro_batch_size": micro})
    if not s.checkpointing:
        changes.append({"gradient_checkpointing": True})
    if s.on_policy:
        generation = s.generation
        while generation > s.samples:
            generation //= 2
            changes.append({"generation_batch_size": max(generation, s.samples)})
    return changes


def suggest(plan: Plan, stage: PlannedStage, policy: Shape, reward: Shape | None) -> list[tuple[dict[str, Any], Plan]]:
    """The fewest changes that make `plan` fit, each checked by re-planning: single changes first, then
    pairs and so on; of the halved batch sizes only the largest that fits is kept."""
    options = candidate_changes(plan)
    for size in range(1, 5):
        found: list[tuple[dict[str, Any], Plan]] = []
        for combo in itertools.combinations(options, size):
            change = {k: v for c in combo for k, v in c.items()}
            if len(change) < size:  # two sizes of one batch
                continue
            trial = estimate(dataclasses.replace(plan.cfg, **change), stage, policy, reward)
            if trial.fits and not any(set(c) == set(change) for c, _ in found):
                found.append((change, trial))  # halvings are listed largest first: the first that fits is kept
        if found:
            return found
    return []


def plan(cfg: PlanConfig, stage: PlannedStage) -> Plan:
    """The plan of `cfg`, whose stage is `stage` (the registry knows it), with the fewest changes that
    make it fit when it does not."""
    policy = read_shape(cfg.model, "model")
    on_policy = issubclass(stage.config, OnPolicyConfig)
    reward = read_shape(cfg.reward_model, "reward_model") if cfg.reward_model and on_policy else None
    result = estimate(cfg, stage, policy, reward)
    if not result.fits:
        result.suggestions = suggest(result, stage, policy, reward)
    return result


def gib(value: float) -> float:
    return round(value / GIB, 2)


def describe_change(change: dict[str, Any]) -> str:
    return " ".join(f"{k}={str(v).lower() if isinstance(v, bool) else v}" for k, v in change.items())


def as_json(p: Plan) -> dict[str, Any]:
    s = p.settings
    return {
        "model": p.cfg.model,
        "stage": s.stage,
        "settings": {k: v for k, v in dataclasses.asdict(s).items() if k not in ("kind", "critic")},
        "models": [
            {
                "role": m.role,
                "architecture": m.shape.architecture,
                "parameters": m.params,
                "trained_parameters": m.trained_params(s),
            }
            for m in p.models
        ],
        "phases_gib": {
            name: {c: gib(v) for c, v in parts.items()} | {"total": gib(sum(parts.values()))}
            for name, parts in p.phases.items()
        },
        "peak_phase": p.peak_phase,
        "peak_gib": gib(p.peak),
        "device_memory_gib": p.cfg.device_memory_gb,
        "devices": s.devices,
        "usable_gib": gib(p.usable),
        "fits": p.fits,
        "suggestions": [
            {"change": change, "peak_gib": gib(trial.peak), "peak_phase": trial.peak_phase}
            for change, trial in p.suggestions
        ],
    }


PHASE_ABOUT = {
    "update": "forward and backward of one micro-batch",
    "optimizer step": "AdamW step after the backward passes",
    "generation": "sampling with the KV cache",
    "scoring": "no-grad forward passes over the rollout",
    "reference pass": "the frozen reference's log-probabilities",
}


def as_table(p: Plan) -> str:
    s = p.settings
    precision = "bf16 autocast" if s.bf16 else "fp32"
    lora = f"LoRA rank {s.lora_rank}" if s.lora_rank else "full fine-tuning"
    shapes = f"micro-batch {s.micro}, query {s.query} + response {s.response} tokens"
    if s.on_policy:
        shapes += f", generation batch {s.generation} ({s.samples} per prompt), forward batch {s.forward}"
    elif issubclass(s.kind, DPOConfig):
        shapes += f", forward batch {s.forward}"
    lines = [
        f"rlhfkit plan: {s.stage} on {p.cfg.model}, {s.devices} x {p.cfg.device_memory_gb:g} GiB, sharding "
        f"{s.sharding}, "
        f"{lora}, {precision}{', activation checkpointing' if s.checkpointing else ''}",
        f"batch: {shapes}",
        "models:",
    ]
    for m in p.models:
        trained = m.trained_params(s)
        state = (f"trained ({trained:,} parameters)" if trained < m.params else "trained") if m.trained else "frozen"
        lines.append(
            f"  {m.role:<10} {m.shape.architecture}{' backbone + scalar head' if m.scalar else ''}, {m.params:,} "
            f"parameters, {state}"
        )
    lines += [
        "",
        f"per device at the peak: {p.peak_phase} ({PHASE_ABOUT[p.peak_phase]})",
        f"  {'component':<18}{'GiB':>9}",
    ]
    lines += [f"  {c:<18}{gib(v):>9.2f}" for c, v in p.phases[p.peak_phase].items()]
    lines += [
        f"  {'total':<18}{gib(p.peak):>9.2f}",
        f"  {'device memory':<18}{p.cfg.device_memory_gb:>9.2f}  ({gib(p.usable):.2f} usable, {p.cfg.headroom:.0%} "
        "headroom)",
        "phases: " + ", ".join(f"{name} {gib(sum(parts.values())):.2f}" for name, parts in p.phases.items()),
        "",
    ]
    if p.fits:
        lines.append(f"fits ({gib(p.usable - p.peak):.2f} GiB to spare)")
    else:
        lines.append(f"does not fit ({gib(p.peak - p.usable):.2f} GiB over)")
        if p.suggestions:
            lines.append("changes that fit (each re-planned):")
            lines += [
                f"  {describe_change(change):<60} {gib(trial.peak):>8.2f} GiB at {trial.peak_phase}"
                for change, trial in p.suggestions
            ]
        else:
            lines.append(
                "no combination of LoRA, fsdp2, smaller batches and activation checkpointing fits: more devices or "
                "memory"
            )
    return "\n".join(lines)


def run(cfg: PlanConfig, stage_of: Callable[[str], PlannedStage]) -> int:
    """`rlhfkit plan`; `stage_of` (from the stage registry) describes the planned stage."""
    result = plan(cfg, stage_of(cfg.stage))
    print(json.dumps(as_json(result), indent=2) if cfg.format == "json" else as_table(result))
    return 0
