"""`python -m translate predict`: translations written as a text file, one line per input sentence.

    python -m translate predict --config configs/translate/demo.yaml --config configs/translate/predict_demo.yaml \\
        --ckpt_path runs/translate_demo/checkpoints/best.ckpt

`TranslationModule.predict_step` decodes the data module's `predict` sentences (`data.predict`,
else the source side of `data.test`) as `test` does; `TranslationWriter` stores them. Under DDP
each rank writes its (index, translation) pairs to `OUTPUT.rank{N}.jsonl`; after a barrier rank 0
merges the parts into OUTPUT, in input order, with the sentences that two ranks decoded (the batch
sampler repeats a few batches so that ranks run equally many steps) written once, and deletes the
parts (`merge: false` keeps them instead, for ranks on machines without a shared folder: each line
is a JSON `[index, translation]`). Every file is written atomically (`core.atomic`); one run at a
time writes an output (`OUTPUT.lock`).

From Python, `translate.Translator` translates lists of sentences with the checkpoint alone.
"""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from lightning.pytorch.callbacks import BasePredictionWriter

from core.atomic import atomic_path, stale_temporaries
from core.errors import InputError
from core.lock import OutputLock


class TranslationWriter(BasePredictionWriter):
    """Writes `predict`'s translations to one text file, one line per input sentence, in input order.

    Args:
        output: the text file to write; its folder must exist.
        merge: rank 0 merges the ranks' `OUTPUT.rank{N}.jsonl` parts into `output` and deletes them;
            false keeps the parts (JSON lines `[index, translation]`), e.g. for ranks on machines that
            share no folder.
    """

    def __init__(self, output: str, merge: bool = True):
        super().__init__("batch")
        self.output, self.merge = Path(output), merge
        self._pairs: list[tuple[int, str]] = []
        self._lock: OutputLock | None = None

    def part(self, rank: int) -> Path:
        """The file rank `rank` writes its translations to."""
        return self.output.with_name(f"{self.output.name}.rank{rank}.jsonl")

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if stage != "predict":
            return
        if self.output.is_dir() or not self.output.parent.is_dir():
            raise InputError(f"TranslationWriter: output {self.output}: " + (
                "is a folder; name a text file" if self.output.is_dir()
                else f"the folder {self.output.parent} does not exist; create it first"))
        if trainer.is_global_zero:  # the launching rank stands for the run: a second run stops at once
            self._lock = OutputLock(self.output, "translate predict").acquire()
            for path in (self.output, *(self.part(r) for r in range(trainer.world_size))):
                for tmp in stale_temporaries(path):  # left by a killed run; we hold the lock, so no one owns them
                    tmp.unlink()
        # TokenBatchSampler yields every index (repeats across ranks are dropped when merging); Lightning
        # cannot check that for a batch sampler of its own and would warn on every run.
        warnings.filterwarnings("ignore", message="You are using a custom batch sampler `TokenBatchSampler`")
        self._pairs = []

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: list[tuple[int, str]],
                           batch_indices: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._pairs.extend(prediction)

    def on_predict_epoch_end(self, trainer: Any, pl_module: Any) -> None:
        super().on_predict_epoch_end(trainer, pl_module)
        pairs, self._pairs = self._pairs, []
        if self.merge and trainer.world_size == 1:
            self._write_text(pairs)
            return
        with atomic_path(self.part(trainer.global_rank)) as tmp:
            tmp.write_text("".join(json.dumps(p, ensure_ascii=False) + "\n" for p in pairs), encoding="utf-8")
        if not self.merge:
            return
        trainer.strategy.barrier()  # every rank's part is complete
        if trainer.is_global_zero:
            parts = [self.part(r) for r in range(trainer.world_size)]
            self._write_text([tuple(json.loads(line)) for p in parts for line in p.read_text("utf-8").splitlines()])
            for p in parts:
                p.unlink()

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.teardown(trainer, pl_module, "predict")

    def _write_text(self, pairs: list[tuple[int, str]]) -> None:
        """The translations in index order, each sentence once, one per line."""
        by_index = dict(pairs)  # a sentence decoded twice (DDP padding) is decoded identically
        assert sorted(by_index) == list(range(len(by_index))), "every input sentence is translated once"
        with atomic_path(self.output) as tmp:
            tmp.write_text("".join(by_index[i] + "\n" for i in range(len(by_index))), encoding="utf-8")
