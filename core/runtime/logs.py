"""Show an app's own INFO log lines (data counts, filters, caches) while Lightning runs it."""

from __future__ import annotations

import logging
import os
import sys


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
    """Print INFO and above of `package`'s loggers on stderr, from the first process only.

    Python shows only WARNING and above by default, so lines such as "skipped 2 of 4 pairs with
    a blank side" would vanish from a `fit` run. Other libraries' loggers are left as they are.
    Calling it again adds no second handler.
    """
    log = logging.getLogger(package)
    if not any(isinstance(h, _StderrHandler) for h in log.handlers):
        log.addHandler(_StderrHandler())
    log.setLevel(logging.INFO)
