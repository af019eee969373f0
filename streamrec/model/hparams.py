"""Checkpoints written before the option groups existed: their flat hyper-parameter names, mapped into groups.

Only loaders call `upgrade_hparams` (the Python API, exports, `load_from_checkpoint`, `--ckpt_path`): the old names are
not options of the constructor or the CLI, so a config must use the grouped keys."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.nn.options import regroup

# old flat name -> (group, key) of the grouped layout
RENAMED: dict[str, tuple[str, str]] = {
    **{k: ("block", k) for k in ("n_kv_heads", "attn_dropout", "positions", "activation", "output_head")},
    **{k: ("mixing", k) for k in ("attention", "lowpass_alpha", "lowpass_window", "lowpass_kind")},
    **{k: ("items", k) for k in ("tied", "id_dropout", "history_dropout")},
    **{k: ("objective", k) for k in ("loss", "label_smoothing", "rdrop_alpha", "num_negatives", "negative_sampling",
                                     "gbce_t", "mask_prob")},
    **{k: ("optimizer", k) for k in ("warmup_steps", "lr_floor", "item_optimizer", "item_lr")},
    **{k: ("evaluation", k) for k in ("ks", "exclude_seen", "sampled_metrics", "popularity_baseline")},
    **{k: ("speed", k) for k in ("cpu_fastpath", "compile", "compile_backend")},
    "attention_window": ("mixing", "window"), "item_init_std": ("items", "init_std"),
    "contrastive_weight": ("contrastive", "weight"), "contrastive_temperature": ("contrastive", "temperature"),
    "contrastive_positive": ("contrastive", "positive"), "second_pass_softmax": ("contrastive", "second_pass_softmax"),
    "filter_seen": ("evaluation", "exclude_seen"), "gated_residual": ("block", "residual"),
}


def upgrade_hparams(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """`hparams` in the grouped layout: old flat names moved into their groups; grouped ones kept as they are.
    `gated_residual: true` becomes `block.residual: gated`; `filter_seen: null` (the old default) is dropped; a setting
    given both flat and in its group is refused (`core.nn.options.regroup`)."""
    flat = {key: value for key, value in hparams.items() if not (key == "filter_seen" and value is None)}
    if "gated_residual" in flat:
        flat["gated_residual"] = "gated" if flat["gated_residual"] else "plain"
    return regroup(flat, RENAMED)
