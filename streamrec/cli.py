"""`python -m streamrec fit|validate|test|predict --config configs/streamrec/NAME.yaml`

LightningCLI over `StreamRecModule` and `StreamRecDataModule`. YAML may interpolate
`${...}` (omegaconf mode); `num_items` and `max_len` come from the data module.

The CLI lives here, not in `__main__`: `ddp_spawn` pickles it into its worker processes, which
cannot import a package's `__main__` module.
"""

from __future__ import annotations

import logging
import sys

from lightning.pytorch.cli import LightningCLI

from core.checkpoint import stale_last_checkpoint_warnings
from core.cli import OneLineErrorParser
from core.logs import log_info_to_stderr
from core.precision import cpu_precision_fallback
from streamrec.data import StreamRecDataModule
from streamrec.module import StreamRecModule


class StreamRecCLI(LightningCLI):
    """Links the values only the data knows into the model's arguments."""

    def add_arguments_to_parser(self, parser) -> None:
        parser.link_arguments("data.max_len", "model.max_len")
        parser.link_arguments("data.num_items", "model.num_items", apply_on="instantiate")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        fallback = cpu_precision_fallback(config.trainer.precision, config.trainer.accelerator)
        if fallback is not None:
            config.trainer.precision, reason = fallback
            logging.getLogger("streamrec").warning(reason)  # shown by log_info_to_stderr

    def before_fit(self) -> None:
        for line in stale_last_checkpoint_warnings(self.trainer.callbacks):
            logging.getLogger("streamrec").warning(line)


def main(args: list[str] | None = None) -> StreamRecCLI:
    """Run the CLI; a user's mistake (bad file, bad value) ends with one line, not a traceback."""
    log_info_to_stderr("streamrec")  # data counts (skipped users and ids, cold starts)
    try:
        return StreamRecCLI(
            StreamRecModule, StreamRecDataModule,
            parser_kwargs={"parser_mode": "omegaconf", "prog": "python -m streamrec"},
            parser_class=OneLineErrorParser, save_config_kwargs={"overwrite": True}, args=args,
        )
    except (ValueError, FileNotFoundError) as err:
        sys.exit(f"error: {err}")

