"""Average the model weights of several Translate checkpoints (checkpoint averaging).

    python -m translate.average --ckpts A.ckpt B.ckpt C.ckpt --output avg.ckpt
    python -m translate.average --dir runs/NAME/checkpoints --last 5 --output avg.ckpt

The output is the last input checkpoint (by training step with `--dir`, the last listed with `--ckpts`) with its
`state_dict` replaced by the element-wise mean of all inputs' weights (floating-point tensors averaged in float64; other
tensors must be equal) and no optimizer state: `validate`, `test` and `translate.infer` take it, resuming `fit` from it
does not work. The inputs must share weight names, shapes and vocabularies. `--dir D --last N` averages the N
checkpoints of D with the highest training step; files holding the same step count once, and earlier averages (key
`averaged_from`) are skipped."""

from __future__ import annotations

import argparse
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from core.runtime.atomic import atomic_path, stale_temporaries
from core.runtime.checkpoint import load_checkpoint
from core.runtime.errors import InputError, check_output_file, exit_on_error
from core.runtime.lock import OutputLock, interrupt_on_sigterm
from translate.data.vocab import vocabs_from_checkpoint

log = logging.getLogger("translate.average")
AVERAGED_KEY = "averaged_from"


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """A Translate checkpoint as a dict (weights, hyperparameters, vocabularies); one-line errors otherwise."""
    path = Path(path)
    state = load_checkpoint(path, written_by="python -m translate fit")
    if not isinstance(state, dict) or "state_dict" not in state or vocabs_from_checkpoint(state) is None:
        raise InputError(f"{path}: not a Translate checkpoint (no vocabularies or weights); "
                         "pass checkpoints written by `python -m translate fit`")
    return state


def average_state_dicts(states: Sequence[dict[str, torch.Tensor]], names: Sequence[str]) -> dict[str, torch.Tensor]:
    """Element-wise mean of state dicts with equal keys and shapes (non-float tensors must agree); `names`
    name them in errors."""
    first, first_name = states[0], names[0]
    out: dict[str, torch.Tensor] = {}
    for state, name in zip(states[1:], names[1:], strict=True):
        if state.keys() != first.keys():
            diff = sorted(state.keys() ^ first.keys())
            raise InputError(f"{name} and {first_name} hold different weights (e.g. {diff[0]}); "
                             "average checkpoints of one training run")
    seen: dict[tuple, str] = {}
    for key, ref in first.items():
        twin = seen.setdefault(_view(ref), key)
        if twin != key and all(_view(s[key]) == _view(s[twin]) for s in states):
            # Tied weights (one tensor under several names, e.g. shared embeddings) stay one tensor, so the
            # average is saved once, not once per name.
            out[key] = out[twin]
            continue
        values = [s[key] for s in states]
        for value, name in zip(values, names, strict=True):
            if value.shape != ref.shape:
                raise InputError(f"{name}: `{key}` has shape {tuple(value.shape)} but {first_name} has "
                                 f"{tuple(ref.shape)}; average checkpoints of one model")
        if ref.is_floating_point():
            out[key] = (sum(v.double() for v in values) / len(values)).to(ref.dtype)
        else:
            if any(not torch.equal(v, ref) for v in values):
                raise InputError(f"`{key}` (a {ref.dtype} tensor) differs between checkpoints; it cannot be averaged")
            out[key] = ref.clone()
    return out


def _view(t: torch.Tensor) -> tuple:
    """What makes two tensors the same view of one storage."""
    return t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype


def average_checkpoints(paths: Sequence[str | Path]) -> dict[str, Any]:
    """The averaged checkpoint dict of `paths` (metadata of the last one; see the module docstring)."""
    if not paths:
        raise InputError("no checkpoint to average; pass --ckpts A B ... or --dir D --last N")
    states = [read_checkpoint(p) for p in paths]
    names = [str(p) for p in paths]
    vocabs = [vocabs_from_checkpoint(s) for s in states]
    for v, name in zip(vocabs[1:], names[1:], strict=True):
        if v != vocabs[0]:
            raise InputError(f"{name} and {names[0]} have different vocabularies; average checkpoints of one run")
    result = dict(states[-1])
    result["state_dict"] = average_state_dicts([s["state_dict"] for s in states], names)
    result.pop("optimizer_states", None)
    result.pop("lr_schedulers", None)
    result[AVERAGED_KEY] = [str(Path(p).resolve()) for p in paths]
    return result


def latest_checkpoints(directory: str | Path, n: int) -> list[Path]:
    """The `n` checkpoints of `directory` with the highest training step, oldest first (one per step)."""
    directory = Path(directory)
    if not directory.is_dir():
        raise FileNotFoundError(f"--dir {directory}: no such folder")
    by_step: dict[int, Path] = {}
    for path in sorted(directory.glob("*.ckpt")):
        state = read_checkpoint(path)
        if AVERAGED_KEY in state:
            continue
        by_step.setdefault(int(state.get("global_step", -1)), path)
    if len(by_step) < n:
        raise InputError(f"--dir {directory} holds checkpoints of {len(by_step)} distinct steps, fewer than "
                         f"--last {n}; keep more with ModelCheckpoint(save_top_k=...) or lower --last")
    return [by_step[step] for step in sorted(by_step)[-n:]]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m translate.average", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    source = p.add_mutually_exclusive_group(required=True)
    source.add_argument("--ckpts", nargs="+", help="checkpoints to average")
    source.add_argument("--dir", help="folder of checkpoints (with --last)")
    p.add_argument("--last", type=int, default=5, help="with --dir: average the N latest steps (default 5)")
    p.add_argument("--output", required=True, help="the averaged checkpoint to write")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    interrupt_on_sigterm()
    with exit_on_error(args.output, not_written=True, interrupted=f"nothing was written to {args.output}"):
        if args.last < 1:
            raise InputError(f"--last must be >= 1, got {args.last}")
        output = Path(args.output)
        check_output_file(output, "--output", "a .ckpt file")
        with OutputLock(output, "translate.average"):
            for tmp in stale_temporaries(output):  # left by a run killed with -9; we hold the lock
                tmp.unlink()
            paths = args.ckpts if args.ckpts else latest_checkpoints(args.dir, args.last)
            averaged = average_checkpoints(paths)
            with atomic_path(output) as tmp:  # never a half-written checkpoint
                torch.save(averaged, tmp)
    log.info("averaged %d checkpoints into %s: %s", len(paths), args.output, ", ".join(map(str, paths)))


if __name__ == "__main__":
    main()
