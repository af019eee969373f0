"""Exact resume: a run resumed from any checkpoint ends with an uninterrupted run's weights, bit for bit on the CPU.
`ExactResume` stores the generator states in every checkpoint as tensors and plain numbers (loadable without an
allow-list) and restores them just before the first batch. The samplers here shuffle from (seed, epoch) alone, so
fetching data draws nothing dropout also draws from; after a mid-epoch checkpoint they skip ahead.

Limits: under DDP Lightning's `DistributedSampler` replaces the sampler (a mid-epoch resume restarts the
epoch); DataLoader workers' random streams and sentencepiece's sampling generator are not stored."""

from __future__ import annotations

import random
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch.utils.data import RandomSampler, Sampler


class EpochRandomSampler(RandomSampler):
    """A random permutation of `data` per epoch, drawn from (seed, epoch) alone; a `RandomSampler`, so Lightning
    still recognises a shuffled loader (and swaps in its `DistributedSampler` under DDP)."""

    def __init__(self, data: Sized, seed: int = 0):
        super().__init__(data)
        self.seed, self.epoch, self.skip = seed, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip_samples(self, n: int) -> None:
        """Leave out the first `n` indices of the next iteration only (a mid-epoch resume)."""
        self.skip = n

    def __iter__(self) -> Iterator[int]:
        generator = torch.Generator().manual_seed(self.seed * 1_000_003 + self.epoch)
        order = torch.randperm(len(self.data_source), generator=generator)
        start, self.skip = self.skip, 0
        yield from order[start:].tolist()


class EpochBatchSampler(Sampler[list[int]]):
    """Batches drawn from (seed, epoch) alone; subclasses give `epoch_batches`. Each `iter()` uses the current epoch and
    advances it (Lightning calls `set_epoch` on samplers, not on batch samplers, so the advance is what gives a new
    order each epoch); `ExactResume` pins it each epoch."""

    def __init__(self, seed: int = 0):
        self.seed, self.epoch, self.skip = seed, 0, 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def skip_batches(self, n: int) -> None:
        """Leave out this process's first `n` batches of the next iteration only (a mid-epoch resume)."""
        self.skip = n

    def epoch_batches(self, rng: np.random.Generator) -> list[np.ndarray]:
        """This process's batches of one epoch, in order, from the epoch's generator."""
        raise NotImplementedError

    def __iter__(self) -> Iterator[list[int]]:
        epoch, self.epoch = self.epoch, self.epoch + 1
        batches = self.epoch_batches(np.random.default_rng([self.seed, epoch]))
        start, self.skip = self.skip, 0
        yield from (batch.tolist() for batch in batches[start:])


def collect_rng_states() -> dict[str, Any]:
    """The global generators' states as tensors and plain numbers."""
    kind, keys, pos, has_gauss, gauss = np.random.get_state()
    states: dict[str, Any] = {
        "torch": torch.get_rng_state(),
        "numpy": {"kind": str(kind), "keys": torch.from_numpy(keys.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "python": _plain(random.getstate()),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        states["cuda"] = torch.cuda.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Restore what `collect_rng_states` returned."""
    torch.set_rng_state(states["torch"])
    np_state = states["numpy"]
    np.random.set_state((np_state["kind"], np_state["keys"].numpy().astype(np.uint32), np_state["pos"],
                         np_state["has_gauss"], np_state["gauss"]))
    version, internal, gauss = states["python"]
    random.setstate((version, tuple(internal), gauss))
    if "cuda" in states and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(states["cuda"])


def _plain(value: Any) -> Any:
    # random.getstate() is (version, tuple of 625 ints, gauss); lists pickle as plain data too.
    return [_plain(v) for v in value] if isinstance(value, tuple) else value


class ExactResume(Callback):
    """Stores the random states and the sampler position in checkpoints and restores them on resume."""

    def __init__(self) -> None:
        self._pending: dict[str, Any] | None = None

    def state_dict(self) -> dict[str, Any]:
        # Called while the checkpoint is assembled: these are the states the next batch would start from.
        trainer = getattr(self, "_trainer", None)
        # Batches whose optimizer step the checkpoint holds (at on_train_batch_end the current one is processed,
        # not yet completed).
        done = trainer.fit_loop.epoch_loop.batch_progress.current.processed if trainer is not None else 0
        return {"rng": collect_rng_states(), "batches_done": int(done)}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        self._pending = state_dict

    def setup(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        self._trainer = trainer

    def on_train_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        # After the sanity check and the loader's iter(), before the first batch: nothing draws in between.
        self._set_epoch(trainer)
        if self._pending is None:
            return
        pending, self._pending = self._pending, None
        if trainer.fit_loop.restarted_mid_epoch and pending.get("batches_done"):
            self._skip(trainer, int(pending["batches_done"]))
        set_rng_states(pending["rng"])

    def on_train_epoch_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self._set_epoch(trainer)

    @staticmethod
    def _loaders(trainer: Trainer) -> list[Any]:
        loader = trainer.fit_loop._combined_loader
        return list(loader.flattened) if loader is not None else []

    def _set_epoch(self, trainer: Trainer) -> None:
        for loader in self._loaders(trainer):
            for part in (getattr(loader, "batch_sampler", None), getattr(loader, "dataset", None)):
                if part is not None and callable(getattr(part, "set_epoch", None)):
                    part.set_epoch(trainer.current_epoch)

    def _skip(self, trainer: Trainer, batches: int) -> None:
        for loader in self._loaders(trainer):
            batch_sampler = getattr(loader, "batch_sampler", None)
            if callable(getattr(batch_sampler, "skip_batches", None)):
                batch_sampler.skip_batches(batches)
            elif isinstance(getattr(batch_sampler, "sampler", None), EpochRandomSampler):
                batch_sampler.sampler.skip_samples(batches * batch_sampler.batch_size)
