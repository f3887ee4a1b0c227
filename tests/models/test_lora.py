"""LoRA adapters on every trained model: the adapter-disabled policy is the reference, only
adapters and scalar heads train, checkpoints hold the adapter and resume bit-identically, the final
folder is merged and loads with plain transformers."""

import json

import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM

from rlhfkit.adapters import (
    AdapterDisabled,
    add_adapter,
    decoder_linear_names,
    is_adapted,
    merged_copy,
    save_weights,
)
from rlhfkit.cli import main as cli_main
from rlhfkit.errors import ConfigError
from rlhfkit.logprobs import response_logprobs
from rlhfkit.models import load_policy
from rlhfkit.onpolicy import evaluation, trainer
from rlhfkit.onpolicy.scoring import policy_logprobs
from rlhfkit.reward_models import ScalarModel
from rlhfkit.stages import resolve

from ..support.gradients import collected, run_update
from ..support.processes import assert_same_files, assert_same_metrics, straight_and_resumed
from ..support.tiny import cli_args, stage_args

LORA = {"lora_rank": 4, "lora_alpha": 8}


def lora_cfg(**extra):
    return resolve("sft", None, None, {**LORA, **extra}).lora


def perturb_adapter(model: torch.nn.Module, seed: int = 0) -> None:
    """Give the zero-initialised B matrices values, as training would."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * 0.1)


def test_default_targets_are_the_linear_layers_of_the_decoder_blocks(tiny_model):
    model, _ = tiny_model
    assert decoder_linear_names(model) == ["down_proj", "gate_proj", "k_proj", "o_proj", "q_proj", "up_proj", "v_proj"]
    adapted = add_adapter(model, lora_cfg())
    wrapped = {name.rsplit(".", 2)[0] for name, _ in adapted.named_parameters() if "lora_A" in name}
    assert len(wrapped) == 7 * adapted.config.num_hidden_layers and not any(
        "lm_head" in w or "embed" in w for w in wrapped
    )
    trained = {name for name, p in adapted.named_parameters() if p.requires_grad}
    assert trained and all("lora_" in name for name in trained)


def test_unknown_target_module_is_a_config_error_naming_the_option(tiny_model):
    with pytest.raises(ConfigError, match="lora_target_modules"):
        add_adapter(tiny_model[0], lora_cfg(lora_target_modules=["no_such_proj"]))


def test_a_fresh_adapter_computes_exactly_the_base_and_the_disabled_one_stays_the_base(tiny_model_dir):
    base, _ = load_policy(str(tiny_model_dir))
    adapted = add_adapter(load_policy(str(tiny_model_dir))[0], lora_cfg())
    ids = torch.randint(100, 1000, (3, 9), generator=torch.Generator().manual_seed(1))
    mask = torch.ones_like(ids)
    expected = response_logprobs(base, ids, mask, 4, 0.7)[0]
    assert torch.equal(response_logprobs(adapted, ids, mask, 4, 0.7)[0], expected)
    perturb_adapter(adapted)
    reference = AdapterDisabled(adapted)
    assert torch.equal(response_logprobs(reference, ids, mask, 4, 0.7)[0], expected)
    assert not torch.equal(response_logprobs(adapted, ids, mask, 4, 0.7)[0], expected)
    assert reference.to("cpu") is reference and list(reference.parameters()) == list(adapted.parameters())


def test_the_merged_model_computes_base_plus_adapter_and_loads_with_plain_transformers(tiny_model, tmp_path):
    model, tok = tiny_model
    adapted = add_adapter(model, lora_cfg())
    perturb_adapter(adapted)
    merged = merged_copy(adapted)
    assert is_adapted(adapted) and not is_adapted(merged)
    merged.save_pretrained(tmp_path / "merged")
    plain = AutoModelForCausalLM.from_pretrained(tmp_path / "merged")
    ids = torch.randint(100, 1000, (2, 7), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(plain(input_ids=ids).logits, adapted(input_ids=ids).logits, atol=1e-5, rtol=1e-5)
    assert not any("lora" in key for key in load_file(tmp_path / "merged" / "model.safetensors"))


def test_an_adapter_saves_alone_and_reloads_exactly_onto_a_fresh_base(tiny_model_dir, tmp_path):
    adapted = add_adapter(load_policy(str(tiny_model_dir))[0], lora_cfg())
    perturb_adapter(adapted)
    save_weights(adapted, tmp_path / "adapter")
    saved = load_file(tmp_path / "adapter" / "adapter_model.safetensors")
    assert saved and all("lora_" in key for key in saved)  # no base weights, no embeddings
    reloaded = add_adapter(load_policy(str(tiny_model_dir))[0], lora_cfg(), tmp_path / "adapter")
    for (name, a), (_, b) in zip(adapted.state_dict().items(), reloaded.state_dict().items(), strict=True):
        assert torch.equal(a, b), name


def test_a_scalar_model_keeps_its_head_trainable_and_saves_it_with_the_adapter(tiny_model_dir, tmp_path):
    torch.manual_seed(3)
    value = add_adapter(ScalarModel.from_policy(load_policy(str(tiny_model_dir))[0]), lora_cfg())
    trained = {name for name, p in value.named_parameters() if p.requires_grad}
    assert {"head.weight", "head.bias"} <= trained and all("lora_" in n or n.startswith("head.") for n in trained)
    with torch.no_grad():
        value.head.bias.fill_(0.5)
    save_weights(value, tmp_path / "value")
    assert {"adapter_model.safetensors", "scalar_head.safetensors", "rlhfkit_scalar.json"} <= {
        p.name for p in (tmp_path / "value").iterdir()
    }
    again = add_adapter(ScalarModel.from_policy(load_policy(str(tiny_model_dir))[0]), lora_cfg(), tmp_path / "value")
    assert again.head.bias.item() == 0.5


def test_ppo_with_lora_has_kl_exactly_zero_and_ratio_exactly_one_against_the_adapter_disabled_reference(
    ppo_dirs, tmp_path
):
    cfg = resolve(
        "ppo",
        "tldr-ppo",
        None,
        stage_args(
            "ppo", ppo_dirs, tmp_path / "run", forward_batch_size=3, micro_batch_size=5, update_epochs=1, **LORA
        ),
    )
    models = trainer.load_models(cfg, None, torch.device("cpu"))
    assert isinstance(models.reference, AdapterDisabled) and models.reference.inner is models.policy  # no second copy
    assert is_adapted(models.value)
    train, _, _ = evaluation.split_posts(cfg.prompt_split, models.tokenizer)
    trainer.prepare_for_training(models, cfg)
    prompts = [e.query.ids for e in train]
    before = {name: p.detach().clone() for m in (models.policy, models.value) for name, p in m.named_parameters()}
    batch = collected(models, prompts, cfg, 0, cfg.kl_coef)
    assert torch.equal(batch.logprobs, batch.ref_logprobs) and torch.equal(batch.kl, torch.zeros_like(batch.kl))
    metrics = run_update(models, trainer.build_optimizers(models, cfg, 2), batch, cfg).metrics
    assert metrics["val/ratio"] == 1.0 and metrics["policy/clipfrac_avg"] == 0 and metrics["policy/approxkl_avg"] == 0
    after = {name: p.detach() for m in (models.policy, models.value) for name, p in m.named_parameters()}
    changed = {name for name in before if not torch.equal(before[name], after[name])}
    assert changed and all("lora_" in name or name.startswith("head.") for name in changed)
    assert any("lora_B" in name for name in changed) and "head.weight" in changed
    # after the update the reference still computes the SFT policy's log-probs; the policy's moved
    with torch.no_grad():
        reference_now = policy_logprobs(models.reference, batch, cfg.temperature)[0]
        policy_now = policy_logprobs(models.policy, batch, cfg.temperature)[0]
    assert torch.equal(reference_now[batch.mask], batch.ref_logprobs[batch.mask])
    assert not torch.equal(policy_now[batch.mask], batch.logprobs[batch.mask])


def test_rm_with_lora_and_frozen_layers_is_refused_in_one_line(ppo_dirs, tmp_path, capsys):
    args = stage_args("rm", ppo_dirs, tmp_path / "run", trainable_layers=1, **LORA)
    assert cli_main(["rm", *cli_args(args)]) == 2
    assert "trainable_layers" in capsys.readouterr().err


FAULTS = pytest.mark.faults  # SIGKILL and resume: the fault-injection suite keeps the default run short


@FAULTS
@pytest.mark.parametrize(
    "stage, preset", [("sft", "tldr-sft"), ("rm", "tldr-rm"), ("dpo", "tldr-dpo"), ("ppo", "tldr-ppo")]
)
def test_lora_run_checkpoints_hold_the_adapter_resume_bit_identically_and_finish_merged(
    stage, preset, ppo_dirs, tmp_path
):
    args = stage_args(stage, ppo_dirs, tmp_path, max_steps=3, **LORA)
    straight, killed = straight_and_resumed(stage, preset, args, tmp_path, kill_at=1)
    checkpoint = next((killed / "checkpoints").glob("step-*"))
    assert (checkpoint / "model" / "adapter_model.safetensors").is_file()
    assert not any((checkpoint / "model").glob("model*.safetensors"))  # no base weights
    files = ["adapter/adapter_model.safetensors", "model/model.safetensors"]
    files += {
        "rm": ["model/scalar_head.safetensors"],
        "ppo": ["value_adapter/adapter_model.safetensors", "value/scalar_head.safetensors"],
    }.get(stage, [])
    assert_same_files(straight, killed, files)
    assert_same_metrics(straight, killed, 3)
    config = json.loads((straight / "adapter" / "adapter_config.json").read_text())
    assert config["r"] == 4 and config["lora_alpha"] == 8 and config["lora_dropout"] == 0
    if stage in ("sft", "dpo", "ppo"):
        plain = AutoModelForCausalLM.from_pretrained(straight / "model")
        base = load_policy(str(ppo_dirs["policy"]))[0]
        same = {name for name, p in plain.named_parameters() if torch.equal(p, dict(base.named_parameters())[name])}
        # merged: embeddings and norms are the base's, the wrapped linear layers moved
        assert "model.embed_tokens.weight" in same and "model.layers.0.self_attn.q_proj.weight" not in same
        assert np.isfinite(plain(input_ids=torch.tensor([[1, 2, 3]])).logits.detach().numpy()).all()
