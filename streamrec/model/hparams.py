"""Checkpoints written before the option groups existed: their flat hyper-parameter names, mapped into groups.

Only loaders call `upgrade_hparams` (the Python API, exports, `load_from_checkpoint`, `--ckpt_path`): the
old names are not options of the constructor or the CLI, so a config must use the grouped keys.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.nn.options import regroup

# old flat name -> (group, key) of the grouped layout
RENAMED: dict[str, tuple[str, str]] = {
    "n_kv_heads": ("block", "n_kv_heads"), "attn_dropout": ("block", "attn_dropout"),
    "positions": ("block", "positions"), "activation": ("block", "activation"),
    "output_head": ("block", "output_head"),
    "attention": ("mixing", "attention"), "attention_window": ("mixing", "window"),
    "lowpass_alpha": ("mixing", "lowpass_alpha"), "lowpass_window": ("mixing", "lowpass_window"),
    "lowpass_kind": ("mixing", "lowpass_kind"),
    "tied": ("items", "tied"), "item_init_std": ("items", "init_std"), "id_dropout": ("items", "id_dropout"),
    "history_dropout": ("items", "history_dropout"),
    "loss": ("objective", "loss"), "label_smoothing": ("objective", "label_smoothing"),
    "rdrop_alpha": ("objective", "rdrop_alpha"), "num_negatives": ("objective", "num_negatives"),
    "negative_sampling": ("objective", "negative_sampling"), "gbce_t": ("objective", "gbce_t"),
    "mask_prob": ("objective", "mask_prob"),
    "contrastive_weight": ("contrastive", "weight"), "contrastive_temperature": ("contrastive", "temperature"),
    "contrastive_positive": ("contrastive", "positive"),
    "second_pass_softmax": ("contrastive", "second_pass_softmax"),
    "warmup_steps": ("optimizer", "warmup_steps"), "lr_floor": ("optimizer", "lr_floor"),
    "item_optimizer": ("optimizer", "item_optimizer"), "item_lr": ("optimizer", "item_lr"),
    "ks": ("evaluation", "ks"), "exclude_seen": ("evaluation", "exclude_seen"),
    "filter_seen": ("evaluation", "exclude_seen"),
    "sampled_metrics": ("evaluation", "sampled_metrics"), "popularity_baseline": ("evaluation", "popularity_baseline"),
    "gated_residual": ("block", "residual"),
    "cpu_fastpath": ("speed", "cpu_fastpath"), "compile": ("speed", "compile"),
    "compile_backend": ("speed", "compile_backend"),
}


def upgrade_hparams(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """`hparams` in the grouped layout: old flat names moved into their groups; grouped ones kept as they are.

    `gated_residual: true` becomes `block.residual: gated`; `filter_seen: null` (the old default) is dropped.

    Raises:
        ValueError: a setting given both flat and in its group (`core.nn.options.regroup`).
    """
    flat = {key: value for key, value in hparams.items() if not (key == "filter_seen" and value is None)}
    if "gated_residual" in flat:
        flat["gated_residual"] = "gated" if flat["gated_residual"] else "plain"
    return regroup(flat, RENAMED)
