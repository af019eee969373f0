"""A checkpoint's hyper-parameters in the layout `TranslationModule` takes now.

Checkpoints written before the module's options were grouped hold every setting flat (`lr_floor`, `attention`,
...). Every loader goes through `upgrade_hparams`, so all read both layouts."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from core.nn.options import regroup

# flat name in an older checkpoint -> (group, the name in the group)
MOVED: dict[str, tuple[str, str]] = {
    **{name: ("block", name) for name in ("n_kv_heads", "attn_dropout", "ff_dropout", "positions", "activation",
                                          "norm_first")},
    **{name: ("objective", name) for name in ("label_smoothing", "rdrop_alpha")},
    **{name: ("optimizer", name) for name in ("betas", "warmup_steps", "lr_floor", "schedule")},
    **{name: ("evaluation", name) for name in ("val_beam_size", "test_beam_size", "alpha", "bleu_tokenize",
                                               "bleu_lowercase")},
    "cell": ("rnn", "cell"), "attention": ("rnn", "score"), "hidden_size": ("rnn", "hidden_size"),
    **{name: ("speed", name) for name in ("cpu_fastpath", "compile", "compile_backend")},
}


def upgrade_hparams(hparams: Mapping[str, Any]) -> dict[str, Any]:
    """`hparams` (a checkpoint's or an export's) with the flat names of older checkpoints moved into their groups. Keys
    starting with "_" (LightningCLI's bookkeeping, such as `_instantiator`) are left out; every other key is kept as it
    is, so a key the module does not know is still refused where the module or network is built. A setting given both
    flat and in its group is a `ValueError` (`core.nn.options.regroup`)."""
    return regroup({k: v for k, v in hparams.items() if not k.startswith("_")}, MOVED)
