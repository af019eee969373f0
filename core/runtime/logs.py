"""Show an app's own INFO log lines (data counts, filters, caches) while Lightning runs it."""

from __future__ import annotations

import logging
import os
import re
import sys
import warnings


class _StderrHandler(logging.StreamHandler):
    """Writes to whatever `sys.stderr` is when a record is emitted (not when the handler was made)."""

    def __init__(self) -> None:
        super().__init__()
        self.addFilter(_is_rank_zero)
        self.setFormatter(logging.Formatter("%(name)s: %(message)s"))

    @property
    def stream(self):  # noqa: ANN201 - the StreamHandler attribute, made dynamic
        return sys.stderr

    @stream.setter
    def stream(self, _) -> None:
        pass


def _is_rank_zero(_: logging.LogRecord) -> bool:
    # Lightning's DDP launcher sets these in every worker; a single process has neither.
    return os.environ.get("LOCAL_RANK", "0") == "0" and os.environ.get("NODE_RANK", "0") == "0"


def log_info_to_stderr(package: str) -> None:
    """Print INFO and above of `package`'s loggers on stderr, from the first process only: Python shows only
    WARNING and above by default, so lines such as "skipped 2 of 4 pairs" would vanish. Safe to call again."""
    log = logging.getLogger(package)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        log.addHandler(_StderrHandler())
    log.setLevel(logging.INFO)


# Lines a normal run prints that its user cannot act on: Lightning's advertisement for its cloud logger, a
# deprecation inside Lightning's own pytree helper (torch deprecated what it calls), and the note that an epoch
# has fewer batches than the logging interval (the last step of each epoch is logged anyway).
NOISE_MESSAGES = (r"💡 Tip: For seamless cloud logging", r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                  r"The number of training batches \(\d+\) is smaller than the logging interval")


class _DropNoise(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(re.search(pattern, message) for pattern in NOISE_MESSAGES)


def quiet_library_noise() -> None:
    """Silence `NOISE_MESSAGES`, from Lightning's loggers and from Python warnings; matched by message, so a
    Lightning version that words them otherwise shows them again rather than hiding more."""
    for pattern in NOISE_MESSAGES:
        warnings.filterwarnings("ignore", message=pattern)
    # On the handlers: a logger's own filters never see its children's records, which Lightning's are.
    for name in ("lightning.pytorch", "lightning.fabric", "lightning"):
        for handler in logging.getLogger(name).handlers:
            if not any(isinstance(f, _DropNoise) for f in handler.filters):
                handler.addFilter(_DropNoise())
