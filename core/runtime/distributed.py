"""The DDP process group: whether one runs, and its end on CPU (gloo), which Lightning leaves to shutdown."""

from __future__ import annotations

import atexit

import torch.distributed as dist

_registered = False


def process_group_running() -> bool:
    return dist.is_available() and dist.is_initialized()


def destroy_process_group_at_exit() -> None:
    """Destroy the default process group when this process exits, as Lightning does only for NCCL. Left to interpreter
    shutdown, a gloo group's C++ threads are torn down in no fixed order, and a worker sometimes aborts after its work
    is done, failing the run. Call it in every rank once the group exists (`LightningModule.setup`); safe to repeat."""
    global _registered
    if _registered or not process_group_running():
        return
    atexit.register(_destroy)
    _registered = True


def _destroy() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()
