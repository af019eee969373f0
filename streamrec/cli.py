"""`python -m streamrec fit|validate|test|predict --config configs/streamrec/NAME.yaml`; `tune`: `streamrec.tune`

LightningCLI over `StreamRecModule` and `StreamRecDataModule`. YAML may interpolate
`${...}`, resolved after the command line (omegaconf+ mode: `--trainer.default_root_dir X` moves
the checkpoints and logs the configs put under `${trainer.default_root_dir}`); `num_items` and
`max_len` come from the data module.

The CLI lives here, not in `__main__`: `ddp_spawn` pickles it into its worker processes, which
cannot import a package's `__main__` module.
"""

from __future__ import annotations

import sys

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping

from core.cli import AppCLI, OneLineErrorParser
from core.errors import InputError, describe_os_error
from core.logs import log_info_to_stderr
from streamrec.data import StreamRecDataModule
from streamrec.module import StreamRecModule

MONITOR = "val_ndcg@10"
EARLY_STOPPING_PATIENCE = 10  # validations; a default, so `fit` stops where validation NDCG stops improving


class StreamRecCLI(AppCLI):
    """Links the values only the data knows into the model's arguments; early stopping on by default."""

    log_name = "streamrec"
    written_by = "python -m streamrec fit"

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.max_len", "model.max_len")
        parser.link_arguments("data.num_items", "model.num_items", apply_on="instantiate")
        parser.add_argument("--early_stopping", type=int, default=EARLY_STOPPING_PATIENCE,
                            help=f"stop fit after this many validations without a better {MONITOR} "
                                 "(0: off; an EarlyStopping in trainer.callbacks replaces it)")

    def instantiate_trainer(self, **kwargs) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        config = self.config[self.subcommand] if self.subcommand else self.config
        patience = config.get("early_stopping", EARLY_STOPPING_PATIENCE)
        if patience < 0:
            raise InputError(f"`early_stopping` must be >= 0 (0: off), got {patience}")
        validates = trainer.limit_val_batches != 0 and not trainer.sanity_checking
        if patience and validates and not any(isinstance(cb, EarlyStopping) for cb in trainer.callbacks):
            trainer.callbacks.append(EarlyStopping(monitor=MONITOR, mode="max", patience=patience))
        return trainer


def build_cli(args: list[str] | None = None, run: bool = True) -> StreamRecCLI:
    """The CLI over `args`; with run=False, parse and instantiate only (no subcommand: `tune` builds trials so)."""
    return StreamRecCLI(
        StreamRecModule, StreamRecDataModule, run=run,
        parser_kwargs={"parser_mode": "omegaconf+", "prog": "python -m streamrec"},
        parser_class=OneLineErrorParser, save_config_kwargs={"overwrite": True}, args=args,
    )


def main(args: list[str] | None = None) -> StreamRecCLI:
    """Run the CLI; a user's mistake (bad file, bad value) ends with one line, not a traceback."""
    log_info_to_stderr("streamrec")  # data counts (skipped users and ids, cold starts)
    args = sys.argv[1:] if args is None else args
    if args[:1] == ["tune"]:  # not a Lightning subcommand: a search of many fits (streamrec.tune)
        from streamrec.tune import main as tune

        return tune(args[1:])
    try:
        return build_cli(args)
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")
    except OSError as err:  # an unwritable run folder, a full disk while saving a checkpoint
        sys.exit(f"error: {describe_os_error(err)}")

