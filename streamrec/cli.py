"""`python -m streamrec fit|validate|test|predict --config configs/streamrec/NAME.yaml`, and `tune`.

The Lightning subcommands run `streamrec.lightning_cli`; `tune` (a search of many fits) runs `streamrec.tune`."""

from __future__ import annotations

import sys

from core.runtime.errors import exit_on_error
from core.runtime.logs import log_info_to_stderr, quiet_library_noise
from streamrec import tune
from streamrec.lightning_cli import StreamRecCLI, build_cli


def main(args: list[str] | None = None) -> StreamRecCLI:
    """Run the CLI; a user's mistake (bad file, bad value) ends with one line, not a traceback."""
    quiet_library_noise()
    log_info_to_stderr("streamrec")  # data counts (skipped users and ids, cold starts)
    argv = sys.argv[1:] if args is None else args
    if argv[:1] == ["tune"]:  # not a Lightning subcommand: a search of many fits (streamrec.tune)
        return tune.main(argv[1:])
    # `args` as given: LightningCLI reads sys.argv itself when it is None, and warns when given both
    with exit_on_error():  # also an unwritable run folder, a full disk while saving a checkpoint
        return build_cli(args)

