"""StreamRec's LightningCLI: `fit|validate|test|predict` over `StreamRecModule` and `StreamRecDataModule`. YAML may
interpolate `${...}`, resolved after the command line (omegaconf+ mode: `--trainer.default_root_dir X` moves the
checkpoints and logs the configs put under `${trainer.default_root_dir}`).

The CLI class lives in a module, not in `__main__`: `ddp_spawn` pickles it into its worker processes, which cannot
import a package's `__main__` module."""

from __future__ import annotations

from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import EarlyStopping

from core.runtime.cli import AppCLI, OneLineErrorParser
from core.runtime.errors import InputError
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.model.module import StreamRecModule

MONITOR = "val_ndcg@10"
EARLY_STOPPING_PATIENCE = 10  # validations; a default, so `fit` stops where validation NDCG stops improving


class StreamRecCLI(AppCLI):
    """Links the values only the data knows into the model's arguments; early stopping on by default."""

    log_name = "streamrec"
    written_by = "python -m streamrec fit"
    baseline, baseline_label = "mostpop", "most popular"  # `model.evaluation.popularity_baseline`'s metrics

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.max_len", "model.max_len")
        parser.link_arguments("data.num_items", "model.num_items", apply_on="instantiate")
        parser.link_arguments("data.num_features", "model.num_features", apply_on="instantiate")
        parser.link_arguments("data.features_per_item", "model.features_per_item", apply_on="instantiate")
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


# `tune` is not a Lightning subcommand (streamrec.cli hands it to streamrec.tune), so the top level names it here.
TUNE_EPILOG = ("also: python -m streamrec tune --config CONFIG --budget N --out DIR  searches hyper-parameters with "
               "validation-only fits (`python -m streamrec tune --help`)")


def build_cli(args: list[str] | None = None, run: bool = True) -> StreamRecCLI:
    """The CLI over `args`; with run=False, parse and instantiate only (no subcommand: `tune` builds trials so)."""
    parser_kwargs = {"parser_mode": "omegaconf+", "prog": "python -m streamrec", "epilog": TUNE_EPILOG}
    return StreamRecCLI(StreamRecModule, StreamRecDataModule, run=run, parser_kwargs=parser_kwargs,
                        parser_class=OneLineErrorParser, save_config_kwargs={"overwrite": True}, args=args)
