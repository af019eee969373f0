"""The pure-PyTorch transformer both apps build on: no Lightning, LitServe or file I/O here.

`from core.nn import MultiHeadAttention, Decoder, causal_mask, ...` names the public parts; each lives in the module
named for its concept (`core.nn.attention`, `core.nn.masks`, ...)."""

from core.nn.attention import CrossAttention, MultiHeadAttention, SideStream, attend
from core.nn.blocks import DecoderLayer, EncoderLayer, FeedForward, GatedResidual, Residual
from core.nn.cpu_fastpath import FastDropout, FastLinear, disable_cpu_fastpath, enable_cpu_fastpath
from core.nn.explain import AttentionCapture, attention_entropy, attention_rollout
from core.nn.kv_cache import DecoderCache, KVCache, StaticKV
from core.nn.linear_attention import LinearAttention
from core.nn.loss import contrastive_loss, linear_cross_entropy, rdrop_cross_entropy
from core.nn.masks import additive_mask, causal_mask, causal_padding_mask, combine_masks, lengths_mask, padding_mask
from core.nn.options import OptionGroup, SpeedOptions
from core.nn.positions import ALiBi, LearnedPositions, RotaryEmbedding, SinusoidalPositions, alibi_slopes, apply_rope
from core.nn.schedule import InverseSqrt, InverseSqrtLR, WarmupCosine, WarmupCosineLR, stops_on_time
from core.nn.stacks import Decoder, Encoder, TokenEmbedding, init_linear, tie_weights
from core.nn.windowed import WindowAttention

__all__ = ["ALiBi", "AttentionCapture", "CrossAttention", "Decoder", "DecoderCache", "DecoderLayer", "Encoder",
           "EncoderLayer", "FastDropout", "FastLinear", "FeedForward", "GatedResidual", "LinearAttention",
           "OptionGroup", "Residual", "SpeedOptions", "WindowAttention", "InverseSqrt", "InverseSqrtLR", "KVCache",
           "LearnedPositions", "MultiHeadAttention", "RotaryEmbedding", "SideStream", "SinusoidalPositions", "StaticKV",
           "TokenEmbedding", "WarmupCosine", "WarmupCosineLR", "additive_mask", "alibi_slopes", "apply_rope", "attend",
           "attention_entropy", "attention_rollout", "causal_mask", "causal_padding_mask", "combine_masks",
           "contrastive_loss", "disable_cpu_fastpath", "enable_cpu_fastpath", "init_linear", "lengths_mask",
           "linear_cross_entropy", "padding_mask", "rdrop_cross_entropy", "stops_on_time", "tie_weights"]
