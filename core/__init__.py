"""The shared transformer core: pure PyTorch modules used by `translate` and `streamrec`.

Nothing here imports Lightning, sentencepiece or sacrebleu.
"""

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from core.attention import CrossAttention, MultiHeadAttention, attend
    from core.blocks import DecoderLayer, EncoderLayer, FeedForward
    from core.cpu_fastpath import FastDropout, FastLinear, disable_cpu_fastpath, enable_cpu_fastpath
    from core.distributed import destroy_process_group_at_exit
    from core.explain import AttentionCapture, attention_entropy, attention_rollout, save_attention_json, save_heatmap
    from core.kv_cache import DecoderCache, KVCache, StaticKV
    from core.loss import linear_cross_entropy, rdrop_cross_entropy
    from core.masks import additive_mask, causal_mask, causal_padding_mask, combine_masks, lengths_mask, padding_mask
    from core.positions import ALiBi, LearnedPositions, RotaryEmbedding, SinusoidalPositions, alibi_slopes, apply_rope
    from core.schedule import InverseSqrt, InverseSqrtLR, WarmupCosine, WarmupCosineLR, stops_on_time
    from core.stacks import Decoder, Encoder, TokenEmbedding, init_linear, tie_weights

# Where each public name is defined: `from core import X` imports that one module, on first use.
_MODULE_OF = {
    name: module
    for module, names in {
        "attention": ("CrossAttention", "MultiHeadAttention", "attend"),
        "blocks": ("DecoderLayer", "EncoderLayer", "FeedForward"),
        "cpu_fastpath": ("FastDropout", "FastLinear", "disable_cpu_fastpath", "enable_cpu_fastpath"),
        "distributed": ("destroy_process_group_at_exit",),
        "explain": ("AttentionCapture", "attention_entropy", "attention_rollout", "save_attention_json",
                    "save_heatmap"),
        "kv_cache": ("DecoderCache", "KVCache", "StaticKV"),
        "loss": ("linear_cross_entropy", "rdrop_cross_entropy"),
        "masks": ("additive_mask", "causal_mask", "causal_padding_mask", "combine_masks", "lengths_mask",
                  "padding_mask"),
        "positions": ("ALiBi", "LearnedPositions", "RotaryEmbedding", "SinusoidalPositions", "alibi_slopes",
                      "apply_rope"),
        "schedule": ("InverseSqrt", "InverseSqrtLR", "WarmupCosine", "WarmupCosineLR", "stops_on_time"),
        "stacks": ("Decoder", "Encoder", "TokenEmbedding", "init_linear", "tie_weights"),
    }.items()
    for name in names
}


def __getattr__(name: str) -> Any:
    """The public names, imported on first use: `core.errors` alone (the readers) then imports no torch."""
    module = _MODULE_OF.get(name)
    if module is None:
        raise AttributeError(f"module 'core' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f"core.{module}"), name)
    globals()[name] = value  # found once: later uses are plain attribute reads
    return value


__all__ = [
    "ALiBi", "AttentionCapture", "CrossAttention", "Decoder", "DecoderCache", "DecoderLayer", "Encoder",
    "EncoderLayer", "FastDropout", "FastLinear", "FeedForward", "InverseSqrt", "InverseSqrtLR", "KVCache",
    "LearnedPositions", "MultiHeadAttention", "RotaryEmbedding", "SinusoidalPositions", "StaticKV", "TokenEmbedding",
    "WarmupCosine", "WarmupCosineLR", "additive_mask", "alibi_slopes", "apply_rope", "attend", "attention_entropy",
    "attention_rollout", "causal_mask", "causal_padding_mask", "combine_masks", "destroy_process_group_at_exit",
    "disable_cpu_fastpath", "enable_cpu_fastpath", "init_linear", "lengths_mask", "linear_cross_entropy",
    "padding_mask", "rdrop_cross_entropy", "save_attention_json", "save_heatmap", "stops_on_time", "tie_weights",
]
