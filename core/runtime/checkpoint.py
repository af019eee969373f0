"""Open a checkpoint file a user named, safely: no code in it ever runs.

Every reader of checkpoints in both apps goes through `load_checkpoint`: PyTorch's restricted unpickler builds
tensors, plain containers and the types in `ALLOWED_GLOBALS`, and refuses any other global before calling it.
What we write holds only tensors and plain data, so older checkpoints load unchanged (tests/core/runtime checks)."""

from __future__ import annotations

import contextlib
import inspect
import io
import pickle
import pickletools
import re
import warnings
import zipfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, TypeVar

import torch
from torch import nn

from core.runtime.errors import InputError, UnsafeCheckpointError

# Types our checkpoints hold beyond what PyTorch's weights-only unpickler accepts by itself (tensors, storages, dtypes,
# OrderedDict, plain containers). None today: keep it that way, and add a type here only with a test that writes it.
ALLOWED_GLOBALS: list[Any] = []

MAX_CHECKPOINT_BYTES = 64 << 30  # a bigger file is not one of ours; refuse before reading it
_GLOBAL = re.compile(r"GLOBAL ([\w.]+)")
# Globals PyTorch's own checkpoints name, which its restricted unpickler accepts by itself.
_TORCH_GLOBAL = re.compile(r"^(torch\.|collections\.OrderedDict$|_codecs\.encode$)")


def load_checkpoint(path: str | Path, written_by: str, mmap: bool = False) -> Any:
    """The checkpoint at `path`, on CPU, unpickled with PyTorch's restricted (weights-only) unpickler. `written_by`
    (`python -m translate fit`) is named in the hints. `mmap` maps the tensors (copy-on-write) instead of reading them:
    pages nobody touches (optimizer states) stay on disk. The caller checks that the content is its own kind of
    checkpoint: only it knows which keys it needs."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: checkpoint not found; pass the .ckpt written by `{written_by}`")
    if path.stat().st_size > MAX_CHECKPOINT_BYTES:
        raise InputError(f"{path}: {path.stat().st_size:,} bytes, larger than any checkpoint this product writes "
                         f"({MAX_CHECKPOINT_BYTES:,}); pass the .ckpt written by `{written_by}`")
    # torch maps only its zip format; a legacy or raw pickle is read instead, so it is refused or read as without mmap.
    mmap = mmap and zipfile.is_zipfile(path)
    try:
        with torch.serialization.safe_globals(ALLOWED_GLOBALS), warnings.catch_warnings():
            # A raw pickle (not torch.save's) makes torch warn about its protocol before refusing or reading it.
            warnings.filterwarnings("ignore", message="Detected pickle protocol")
            return torch.load(path, map_location="cpu", weights_only=True, mmap=mmap)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" in str(err) and (refused := refusal(path, err, written_by)) is not None:
            raise refused from None
        raise InputError(f"{path}: not a readable PyTorch checkpoint (UnpicklingError); "
                         f"pass the .ckpt written by `{written_by}`") from None
    except OSError as err:
        raise InputError(f"{path}: cannot read it ({err.strerror or type(err).__name__})") from None
    except Exception as err:  # noqa: BLE001 - a corrupt file fails in many ways; all are the same user mistake
        raise InputError(f"{path}: not a readable PyTorch checkpoint ({type(err).__name__}); "
                         f"pass the .ckpt written by `{written_by}`") from None


Module = TypeVar("Module", bound=nn.Module)


def load_module(cls: type[Module], path: str | Path, written_by: str, app: str,
                required: Iterable[str] = (), mmap: bool = False, prefix: str = "") -> tuple[Module, dict[str, Any]]:
    """A `cls` rebuilt from a checkpoint's hyper-parameters and weights (eval mode, CPU), and the checkpoint dict. `cls`
    is the LightningModule, or, with `prefix` ("model."), the network it holds, so scoring and translating neither build
    the training module nor import Lightning. `required`: keys the checkpoint must hold besides those two (a
    vocabulary). With `mmap` the weights stay mapped from the file, which must not change."""
    state = load_checkpoint(path, written_by, mmap=mmap)
    missing = [key for key in ("hyper_parameters", "state_dict", *required)
               if not isinstance(state, dict) or key not in state]
    if missing or not isinstance(state["hyper_parameters"], dict):
        raise InputError(f"{path}: not a {app} checkpoint (no {(missing or ['hyper_parameters'])[0]}); "
                         f"pass a checkpoint written by `{written_by}`")
    try:
        with _skip_weight_init():
            module = build_from_hparams(cls, state["hyper_parameters"])
        weights = state["state_dict"]
        if prefix:
            weights = {k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)}
        _assign_weights(module, weights)
    except (RuntimeError, TypeError, ValueError) as err:  # torch lists every mismatching tensor; one is enough
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{path}: weights do not fit the stored hyperparameters ({first}); "
                         f"pass a checkpoint written by `{written_by}`") from None
    return module.eval(), state


def build_from_hparams(cls: Any, hparams: Mapping[str, Any]) -> Any:
    """The one handoff from stored hyper-parameters to a module: `cls.from_hparams(hparams)` where the class
    defines it (it refuses a key it does not know), else `cls` called with the arguments it takes."""
    from_hparams = getattr(cls, "from_hparams", None)
    return from_hparams(hparams) if from_hparams is not None else cls(**accepted_arguments(cls, hparams))


def accepted_arguments(cls: Any, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """The hyper-parameters `cls` takes by name, after `cls.upgrade_hparams` (old names mapped) where the class
    has it; a `cls` taking `**kwargs` (a factory) gets all but LightningCLI's bookkeeping (`_instantiator`)."""
    upgrade = getattr(cls, "upgrade_hparams", None)
    if upgrade is not None:
        hparams = upgrade(hparams)
    parameters = inspect.signature(cls).parameters
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        return {k: v for k, v in hparams.items() if not k.startswith("_")}
    return {k: v for k, v in hparams.items() if k in parameters}


_INIT_FUNCTIONS = ("uniform_", "normal_", "trunc_normal_", "constant_", "ones_", "zeros_", "eye_",
                   "xavier_uniform_", "xavier_normal_", "kaiming_uniform_", "kaiming_normal_", "orthogonal_")


@contextlib.contextmanager
def _skip_weight_init() -> Iterator[None]:
    """Build a module whose weights are about to be replaced without drawing random ones: random initialisation
    writes every page of every weight, so a large item table would be held twice. Computed buffers are unaffected."""
    saved = {name: getattr(nn.init, name) for name in _INIT_FUNCTIONS}
    for name in saved:
        setattr(nn.init, name, lambda tensor, *args, **kwargs: tensor)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(nn.init, name, fn)


def _assign_weights(module: nn.Module, state_dict: dict[str, torch.Tensor]) -> None:
    """`load_state_dict(strict=True)` that takes the checkpoint's tensors instead of copying them (one copy in
    memory); tied parameters are re-tied afterwards, since assignment gives each name its own Parameter."""
    shared: dict[int, list[str]] = {}
    for name, param in module.named_parameters(remove_duplicate=False):
        shared.setdefault(id(param), []).append(name)
    module.load_state_dict(state_dict, assign=True)
    for first, *others in (names for names in shared.values() if len(names) > 1):
        param = module.get_parameter(first)
        for name in others:
            owner, _, leaf = name.rpartition(".")
            setattr(module.get_submodule(owner), leaf, param)


def refusal(path: str | Path, err: Exception, written_by: str = "python -m <app> fit") -> UnsafeCheckpointError | None:
    """The one-line refusal of a checkpoint whose pickle names a global the restricted unpickler stopped; None
    when no such global is found (the file is then merely not a checkpoint)."""
    found = _GLOBAL.search(str(err))
    name = found.group(1) if found else first_foreign_global(path)
    if name is None:
        return None
    return UnsafeCheckpointError(
        f"{path}: refused: its pickle names the global `{name}`, which is not among the types our checkpoints "
        f"hold; this product never executes code from checkpoints; use a checkpoint written by `{written_by}`")


def first_foreign_global(path: str | Path) -> str | None:
    """The first global a pickle (plain, or a torch zip's data.pkl) names that PyTorch's own pickles do not,
    read with `pickletools.genops`, which parses opcodes and calls nothing."""
    try:
        data = Path(path).read_bytes()
        if zipfile.is_zipfile(io.BytesIO(data)):
            with zipfile.ZipFile(io.BytesIO(data)) as z:
                data = z.read(next(n for n in z.namelist() if n.endswith("data.pkl")))
        for name in _pickle_globals(data):
            if not _TORCH_GLOBAL.match(name):
                return name
    except Exception:  # noqa: BLE001 - only for the message; the file is refused either way
        return None
    return None


def _pickle_globals(data: bytes) -> Iterable[str]:
    stream = io.BytesIO(data)
    while stream.tell() < len(data):
        strings: list[str] = []
        for op, arg, _ in pickletools.genops(stream):
            if op.name in ("GLOBAL", "INST"):
                yield str(arg).replace(" ", ".")
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                yield f"{strings[-2]}.{strings[-1]}"
            elif isinstance(arg, str):
                strings.append(arg)


class SafeLoadMixin:
    """Makes a LightningModule's `load_from_checkpoint` use the restricted unpickler with a one-line refusal
    (Lightning's own default may change between versions; ours does not)."""

    @classmethod
    def load_from_checkpoint(cls, checkpoint_path: str | Path, *args: Any, **kwargs: Any) -> Any:
        upgrade = getattr(cls, "upgrade_hparams", None)
        if upgrade is not None and Path(checkpoint_path).is_file():  # old names mapped; Lightning drops the rest
            # mapped, not read: only the pickle's hyper-parameters are touched before Lightning loads the weights
            hparams = load_checkpoint(checkpoint_path, "python -m <app> fit", mmap=True).get("hyper_parameters") or {}
            # `_instantiator=None`: Lightning builds the module from these values itself, not through LightningCLI's
            kwargs = {**upgrade(hparams), "_instantiator": None, **kwargs}
        kwargs["weights_only"] = True
        try:
            with torch.serialization.safe_globals(ALLOWED_GLOBALS):
                return super().load_from_checkpoint(checkpoint_path, *args, **kwargs)  # type: ignore[misc]
        except pickle.UnpicklingError as err:
            refused = refusal(checkpoint_path, err) if "Weights only load failed" in str(err) else None
            if refused is None:
                raise
            raise refused from None

    def on_load_checkpoint(self, checkpoint: dict[str, Any]) -> None:
        """Refuse in one line a checkpoint whose tensors do not fit this module, before Lightning's
        `load_state_dict` fails with a traceback listing every tensor (`test --ckpt_path` on other data)."""
        super().on_load_checkpoint(checkpoint)  # type: ignore[misc]
        if "state_dict" not in checkpoint:  # nothing to load (a hook called with other parts only)
            return
        trainer = getattr(self, "_trainer", None)
        problem = checkpoint_mismatch(self.state_dict(), checkpoint["state_dict"],  # type: ignore[attr-defined]
                                      getattr(trainer, "ckpt_path", None), getattr(self, "strict_loading", True))
        if problem is not None:
            raise ValueError(problem)


def checkpoint_mismatch(ours: Mapping[str, Any], theirs: Mapping[str, Any], path: str | Path | None = None,
                        strict: bool = True) -> str | None:
    """One line naming the first tensor that keeps the checkpoint's state dict `theirs` from loading into `ours`,
    or None; `strict`: also tensors that only one side has (as `load_state_dict(strict=True)` would)."""
    def dims(t: Any) -> str:
        return " x ".join(map(str, t.shape)) or "a scalar"

    bad = [k for k, v in theirs.items() if k in ours and hasattr(v, "shape") and tuple(v.shape) != tuple(ours[k].shape)]
    missing = [k for k in ours if k not in theirs] if strict else []
    unexpected = [k for k in theirs if k not in ours] if strict else []
    problems = ([f"{k} is {dims(theirs[k])} there but {dims(ours[k])} here" for k in bad]
                + [f"it has no {k}" for k in missing] + [f"it has {k}, which this model does not" for k in unexpected])
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    where = f"checkpoint {path}" if path else "the checkpoint"
    return (f"{where} does not fit this model: {problems[0]}{more}; it was trained on other data or settings: "
            "pass the config and data it was trained with")


def stale_last_checkpoint_warnings(callbacks: Iterable[Any]) -> list[str]:
    """One line per `ModelCheckpoint(monitor=..., save_last=True or "link")` whose last.ckpt would go stale:
    since Lightning 2.6 it writes last.ckpt only when the monitored metric improves, so resuming repeats epochs."""
    # Read by attribute (a ModelCheckpoint or a subclass), so `core` needs no Lightning import.
    return [f"ModelCheckpoint(monitor={cb.monitor!r}, save_last=true) rewrites last.ckpt only when "
            f"{cb.monitor} improves, so resuming from it repeats epochs; drop save_last and add a ModelCheckpoint "
            f"with filename: last (no monitor), as configs/*/demo.yaml do"
            for cb in callbacks
            if getattr(cb, "save_last", None) and getattr(cb, "monitor", None) and getattr(cb, "save_top_k", -1) != -1]
