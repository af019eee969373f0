"""`python -m translate fit|validate|test|predict --config configs/translate/NAME.yaml`. LightningCLI over
`TranslationModule` and `TranslationDataModule` (YAML may interpolate `${...}`, resolved after the command line). The
vocabulary sizes and pad id come from the data module, `model.max_len` from `data.max_len`. `validate`, `test` and
`predict` with `--ckpt_path CKPT` and no `data.train` take CKPT's vocabularies and, unless given, its `max_len`.

The CLI lives here, not in `__main__`: `ddp_spawn` pickles it into its worker processes, which cannot import a package's
`__main__` module."""

from __future__ import annotations

import inspect
from pathlib import Path

from core.runtime.checkpoint import load_checkpoint
from core.runtime.cli import AppCLI, OneLineErrorParser
from core.runtime.errors import exit_on_error
from core.runtime.logs import log_info_to_stderr, quiet_library_noise
from translate.data.corpus import TranslationDataModule
from translate.model.module import TranslationModule

# Subcommands that evaluate a trained model: with --ckpt_path and no data.train they read its vocabularies.
CHECKPOINT_VOCAB_SUBCOMMANDS = ("validate", "test", "predict")


class TranslateCLI(AppCLI):
    """Links the values only the data knows into the model's arguments."""

    log_name = "translate"
    written_by = "python -m translate fit"

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.max_len", "model.max_len")
        for name in ("src_vocab_size", "tgt_vocab_size", "pad_id"):
            parser.link_arguments(f"data.{name}", f"model.{name}", apply_on="instantiate")
        parser.set_defaults({"trainer.use_distributed_sampler": False})

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        if config.model.share_embeddings and not config.data.joint_vocab:
            # Equal sizes would hide it: source piece k and target piece k would share one vector.
            raise ValueError("model.share_embeddings: true ties the source embedding to the target one, which needs "
                             "data.joint_vocab: true; set model.share_embeddings: false for separate vocabularies")
        if self.subcommand in CHECKPOINT_VOCAB_SUBCOMMANDS and config.data.train is None and config.data.vocab is None:
            self._read_data_from_checkpoint(config)
        super().before_instantiate_classes()

    def _read_data_from_checkpoint(self, config) -> None:
        """Without training files, evaluate with what `--ckpt_path` carries: its vocabularies, and its `max_len`
        unless `--data.max_len` is given (a different one would change truncation and the output cap)."""
        ckpt_path = config.get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        config.data.vocab = ckpt_path
        default = inspect.signature(TranslationDataModule).parameters["max_len"].default
        trained = load_checkpoint(ckpt_path, self.written_by, mmap=True).get("hyper_parameters", {}).get("max_len")
        if config.data.max_len == default and isinstance(trained, int):
            config.data.max_len = config.model.max_len = trained


def main(args: list[str] | None = None) -> TranslateCLI:
    """Run the CLI; a user's mistake (bad file, bad value) ends with one line, not a traceback."""
    quiet_library_noise()
    log_info_to_stderr("translate")  # data counts (skipped blank pairs, length filters), vocabulary cache
    with exit_on_error():  # also an unwritable run folder, a full disk while saving a checkpoint
        return TranslateCLI(TranslationModule, TranslationDataModule,
                            parser_kwargs={"parser_mode": "omegaconf+", "prog": "python -m translate"},
                            parser_class=OneLineErrorParser, save_config_kwargs={"overwrite": True}, args=args)

