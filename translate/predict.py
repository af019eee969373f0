"""`python -m translate predict`: translations written as a text file, one line per input sentence.

    python -m translate predict --config configs/translate/demo.yaml --config configs/translate/predict_demo.yaml \\
        --ckpt_path runs/translate_demo/checkpoints/best.ckpt

Under DDP the ranks' parts are merged as `core.runtime.prediction` says, a sentence that two ranks decoded written once;
each line of a part kept with `merge: false` is a JSON `[index, translation]`."""

from __future__ import annotations

import json
import warnings
from pathlib import Path
from typing import Any

from core.runtime.atomic import atomic_write_text
from core.runtime.prediction import PartsWriter


class TranslationWriter(PartsWriter):
    """Writes `predict`'s translations to `output` (its folder must exist), one line per input sentence, in input order.
    With `merge` false rank 0 leaves the ranks' `OUTPUT.rank{N}.jsonl` parts unmerged (machines sharing no folder)."""

    part_suffix, written_by, file_kind = ".jsonl", "translate predict", "a text file"

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        super().setup(trainer, pl_module, stage)
        # TokenBatchSampler yields every index (repeats across ranks are dropped when merging); Lightning
        # cannot check that for a batch sampler of its own and would warn on every run.
        warnings.filterwarnings("ignore", message="You are using a custom batch sampler `TokenBatchSampler`")

    def write_on_batch_end(self, trainer: Any, pl_module: Any, prediction: list[tuple[int, str]],
                           batch_indices: Any, batch: Any, batch_idx: int, dataloader_idx: int = 0) -> None:
        self._rows.extend(prediction)

    def write_part(self, rows: list[tuple[int, str]], path: Path) -> None:
        atomic_write_text(path, "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in rows))

    def read_part(self, path: Path) -> list[tuple[int, str]]:
        return [tuple(json.loads(line)) for line in path.read_text("utf-8").splitlines()]

    def write_output(self, rows: list[tuple[int, str]]) -> None:
        by_index = dict(rows)  # a sentence decoded twice (DDP padding) is decoded identically
        assert sorted(by_index) == list(range(len(by_index))), "every input sentence is translated once"
        atomic_write_text(self.output, "".join(by_index[i] + "\n" for i in range(len(by_index))))
