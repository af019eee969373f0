"""`PartsWriter`: what both apps' `predict` writers share: one output file, written atomically by one run at a
time (`OUTPUT.lock`). Under DDP each rank writes its rows to `OUTPUT.rank{N}<suffix>` and rank 0 merges them
after a barrier (`merge=False` keeps the parts, for ranks on machines without a shared folder)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import BasePredictionWriter

from core.runtime.atomic import stale_temporaries
from core.runtime.errors import check_output_file
from core.runtime.lock import OutputLock


class PartsWriter(BasePredictionWriter):
    """A `predict` writer to one file, with per-rank parts merged by rank 0.

    Args:
        output: the file to write; its folder must exist.
        merge: rank 0 merges the ranks' parts into `output` and deletes them; false keeps the parts."""

    part_suffix = ""  # the parts' file ending, e.g. ".parquet"
    written_by = ""  # the command named in the lock file, e.g. "streamrec predict"
    file_kind = "a file"  # what `output` must name, in the error for a folder

    def __init__(self, output: str, merge: bool = True):
        super().__init__("batch")
        self.output, self.merge = Path(output), merge
        self._rows: list[Any] = []
        self._lock: OutputLock | None = None

    def part(self, rank: int) -> Path:
        return self.output.with_name(f"{self.output.name}.rank{rank}{self.part_suffix}")

    def check_output(self) -> None:
        """One-line `InputError` when `output` cannot be written; apps add their own checks first."""
        check_output_file(self.output, f"{type(self).__name__}: output", self.file_kind)

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "predict":
            return
        self.check_output()
        if trainer.is_global_zero:  # the launching rank stands for the run: a second run stops at once
            self._lock = OutputLock(self.output, self.written_by).acquire()
            for path in (self.output, *(self.part(r) for r in range(trainer.world_size))):
                for tmp in stale_temporaries(path):  # left by a killed run; we hold the lock, so no one owns them
                    tmp.unlink()
        self._rows = []

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_predict_epoch_end(trainer, pl_module)
        rows, self._rows = self._rows, []
        if self.merge and trainer.world_size == 1:
            self.write_output(rows)
            return
        self.write_part(rows, self.part(trainer.global_rank))
        if not self.merge:
            return
        trainer.strategy.barrier()  # every rank's part is complete
        if trainer.is_global_zero:
            parts = [self.part(r) for r in range(trainer.world_size)]
            self.write_output([row for p in parts for row in self.read_part(p)])
            for p in parts:
                p.unlink()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "predict")

    # What an app provides: each writes atomically; `write_output` gets every rank's rows in input order.
    def write_part(self, rows: list[Any], path: Path) -> None:
        raise NotImplementedError

    def read_part(self, path: Path) -> list[Any]:
        raise NotImplementedError

    def write_output(self, rows: list[Any]) -> None:
        raise NotImplementedError
