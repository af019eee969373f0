"""What one search is: its budget and the options `python -m streamrec tune` reads from its command line."""

from __future__ import annotations

import argparse
import hashlib
import json
import re
from dataclasses import dataclass
from pathlib import Path

from streamrec.tuning.space import PARAMS, space_spec


@dataclass(frozen=True)
class Budget:
    """How long the search runs: `trials` finished trials in the study, or `seconds` of this invocation."""

    trials: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> Budget:
        """`30` (trials), or a time: `600s`, `45m`, `2h`; an argparse type."""
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
        if not match or float(match.group(1)) <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: give a number of trials (30) or a time (45m, 2h, 600s)")
        value, unit = float(match.group(1)), match.group(2)
        if not unit:
            if value != int(value):
                raise argparse.ArgumentTypeError(f"{text!r}: a number of trials is a whole number")
            return cls(trials=int(value))
        return cls(seconds=value * {"s": 1, "m": 60, "h": 3600}[unit])

    def __str__(self) -> str:
        return f"{self.trials} trials" if self.trials else f"{self.seconds / 60:g} minutes"


@dataclass(frozen=True)
class TuneOptions:
    """One search: tune's flags (`--help`) as `streamrec.tune.parse_args` reads them; `config` lists each of fit's
    --config files after the files it builds on (`base: FILE`), `overrides` fit's other --section.key arguments."""

    config: tuple[str, ...]
    overrides: tuple[str, ...]
    out: Path
    budget: Budget = Budget(trials=20)
    params: tuple[str, ...] = PARAMS
    max_epochs: int | None = None
    patience: int = 10
    startup_trials: int = 5
    seed: int = 0

    @property
    def config_args(self) -> list[str]:
        return [a for name in self.config for a in ("--config", name)] + list(self.overrides)

    def trial_epochs(self, config_max_epochs: int | None) -> int:
        """The epochs a trial may run: `max_epochs`, else the config's `trainer.max_epochs`, else 100."""
        return self.max_epochs or config_max_epochs or 100

    def trial_dir(self, number: int) -> Path:
        """Where a running trial keeps its best epoch's weights until `keep_if_best` moves or deletes them."""
        return self.out / "trials" / str(number)

    def fingerprint(self) -> str:
        """What makes two runs one study: the configs' text, the overrides, the space and the trial rules."""
        h = hashlib.sha256()
        for name in self.config:
            h.update(Path(name).read_bytes())
        h.update(json.dumps([self.overrides, self.params, self.max_epochs, self.patience, self.startup_trials,
                             self.seed, space_spec()]).encode())
        return h.hexdigest()[:16]
