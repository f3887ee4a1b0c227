"""Model FLOP counts behind the MFU the benchmarks report. No torch import: compare_trl.py's parent
process reads them without inflating its children's peak memory."""

from __future__ import annotations


def training_flops_per_token(config, sequence_length: int) -> float:
    """Model FLOPs of one training token (forward and backward): 6 x the parameters of the transformer
    body plus the attention scores and values, 12 x layers x width x sequence length (the PaLM
    appendix B count). The LM head is left out because the stages differ in where they apply it (the
    reward model never does; SFT and DPO only at response positions), so the MFU is conservative."""
    text = config.get_text_config() if hasattr(config, "get_text_config") else config
    width, layers = text.hidden_size, text.num_hidden_layers
    heads, kv_heads = text.num_attention_heads, getattr(text, "num_key_value_heads", None) or text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or width // heads
    attention = width * head_dim * (2 * heads + 2 * kv_heads)  # q and o, k and v projections
    mlp = 3 * width * text.intermediate_size  # gate, up and down (SwiGLU)
    return 6 * layers * (attention + mlp) + 12 * layers * width * sequence_length


def mfu(tokens_per_s: float, flops_per_token: float, peak_gflops: float) -> float:
    """Model FLOPs utilisation: achieved model FLOP/s over the measured matmul peak."""
    return round(tokens_per_s * flops_per_token / (peak_gflops * 1e9), 3)
