"""torch.compile for the stacks that do the work, and the few static lengths CUDA graphs need (`SpeedOptions.compile`).
`compile_in_place` calls `nn.Module.compile` on the given stacks, which stay where they are: the state dict keys are
the eager model's, so a checkpoint written with compile on loads with it off and the other way round.

Shapes: a batch's length varies. With `dynamic=None` the first batch compiles for its own lengths, the first
batch of another length recompiles once with the lengths symbolic, and later batches reuse that graph.
"reduce-overhead" records a CUDA graph per distinct shape even so, so there the apps round each batch's length
up to a multiple of `BUCKET` (capped at `max_len`): a handful of graphs, each replayed many times. Padding is
masked, so the outputs at the real positions stay the same (to float rounding); the other modes run unpadded.

Legend: B batch, T time."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Literal, get_args

import torch
import torch.nn.functional as F
from torch import Tensor, nn

CompileMode = Literal["default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"]
COMPILE_MODES: tuple[str, ...] = get_args(CompileMode)
BUCKET = 16  # length step under CUDA graphs: max_len 200 gives at most 13 graphs


def compile_mode(value: bool | str | None, name: str = "model.compile") -> str | None:
    """The torch.compile mode `value` asks for: False and None (YAML's `off`, `false`, `null`) are off (None), True
    is "default"; anything but a mode in `COMPILE_MODES` is a ValueError naming the key `name`."""
    if value is None or value is False:
        return None
    if value is True:
        return "default"
    if value not in COMPILE_MODES:
        raise ValueError(f"`{name}` must be null (off) or one of {', '.join(COMPILE_MODES)}; got {value!r}")
    return value


def check_backend(backend: str, name: str = "model.compile_backend") -> str:
    """`backend` if torch.compile knows it ("inductor"; "eager" and "aot_eager" check the plumbing cheaply)."""
    known = torch.compiler.list_backends(exclude_tags=())
    if backend not in known:
        raise ValueError(f"`{name}` must be one of {', '.join(sorted(known))}; got {backend!r}")
    return backend


def compile_in_place(modules: Iterable[nn.Module], mode: str, backend: str = "inductor") -> None:
    """Compile each module's forward in place with `nn.Module.compile` (its state dict keys do not change); modes
    are inductor's, so other backends ignore `mode`."""
    options = {"mode": mode} if backend == "inductor" else {}
    for module in modules:
        # dynamic=None: static at first, symbolic lengths after the first batch of another length (see above).
        module.compile(backend=backend, dynamic=None, **options)


def bucket_length(length: int, limit: int, multiple: int = BUCKET) -> int:
    """`length` rounded up to a multiple of `multiple`, but not past `limit` (nor below `length`)."""
    return max(length, min(-(-length // multiple) * multiple, limit))


def pad_to_bucket(x: Tensor, limit: int, value: int, multiple: int = BUCKET) -> Tensor:
    """(B, T) -> (B, bucket_length(T)): `value` appended on the right of each row."""
    extra = bucket_length(x.shape[1], limit, multiple) - x.shape[1]
    return F.pad(x, (0, extra), value=value) if extra else x
