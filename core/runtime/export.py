"""Weights without pickle: a folder with `model.safetensors` and `config.json` (docs/export.md).

Nothing on this path unpickles: safetensors holds raw tensors, config.json plain JSON with the
LightningModule's constructor arguments, so the module is rebuilt as `load_module` rebuilds it from a
checkpoint. Tied weights are stored once and tied again on loading."""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from torch import nn

from core.runtime.atomic import atomic_path, atomic_write_text
from core.runtime.checkpoint import accepted_arguments, build_from_hparams
from core.runtime.errors import InputError, exit_on_error

WEIGHTS = "model.safetensors"
CONFIG = "config.json"
VERSION = 1

Module = TypeVar("Module", bound=nn.Module)


def is_export_folder(path: str | Path) -> bool:
    """Whether `path` is an export folder (with a `config.json`), not a checkpoint file."""
    return Path(path).is_dir() and (Path(path) / CONFIG).is_file()


def constructor_arguments(cls: type, hparams: dict[str, Any]) -> dict[str, Any]:
    """The hyper-parameters `cls` accepts, as JSON values (tuples become lists)."""
    return json.loads(json.dumps(accepted_arguments(cls, hparams), default=_refuse))


def _refuse(value: object) -> Any:
    if isinstance(value, tuple | set):
        return list(value)
    raise InputError(f"hyper-parameter value {value!r} ({type(value).__name__}) has no JSON form; "
                     "only numbers, strings, booleans, None and lists of them can be exported")


def save_folder(out: str | Path, model: nn.Module, app: str, hparams: dict[str, Any],
                extra: dict[str, Any] | None = None) -> Path:
    """Write `model`'s weights as `out/model.safetensors` and `out/config.json` (format "<app>-safetensors",
    `hparams` from `constructor_arguments`, `extra` keys), each atomically; returns `out`."""
    from safetensors.torch import save_model

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / WEIGHTS) as tmp:
        save_model(model, str(tmp), metadata={"format": "pt"})
    config = {"format": f"{app}-safetensors", "version": VERSION, "hyper_parameters": hparams, **(extra or {})}
    write_json(out / CONFIG, config)
    return out


def write_json(path: Path, data: Any) -> None:
    """`data` as indented JSON at `path`, written atomically."""
    atomic_write_text(path, json.dumps(data, indent=2, ensure_ascii=False) + "\n")


def read_config(folder: str | Path, app: str, written_by: str) -> dict[str, Any]:
    """config.json of an export folder of `app`, checked for its format and version."""
    folder = Path(folder)
    for name in (CONFIG, WEIGHTS):
        if not (folder / name).is_file():
            raise FileNotFoundError(f"{folder}: no {name}; pass a folder written by `{written_by}`")
    try:
        config = json.loads((folder / CONFIG).read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise InputError(f"{folder / CONFIG}: not valid JSON ({err}); "
                         f"pass a folder written by `{written_by}`") from None
    expected = f"{app}-safetensors"
    if not isinstance(config, dict) or config.get("format") != expected:
        found = config.get("format") if isinstance(config, dict) else type(config).__name__
        raise InputError(f"{folder}: format {found!r}, not {expected!r}; pass a folder written by `{written_by}`")
    if config.get("version") != VERSION or not isinstance(config.get("hyper_parameters"), dict):
        raise InputError(f"{folder / CONFIG}: version {config.get('version')!r} (this code reads {VERSION}) or no "
                         f"hyper_parameters; export it again with `{written_by}`")
    return config


def load_folder(cls: type[Module], folder: str | Path, app: str, written_by: str) -> tuple[Module, dict[str, Any]]:
    """The network (`cls`, or a factory) rebuilt from an export folder (eval mode, CPU), and its config.json."""
    from safetensors import SafetensorError
    from safetensors.torch import load_model

    config = read_config(folder, app, written_by)
    try:
        module = build_from_hparams(cls, config["hyper_parameters"])
        load_model(module, str(Path(folder) / WEIGHTS), strict=True)
    except (RuntimeError, TypeError, ValueError, SafetensorError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"{folder}: weights do not fit the stored hyper-parameters ({first}); "
                         f"export it again with `{written_by}`") from None
    return module.eval(), config


def run_export(write: Callable[[], Path], fmt: str, output: str) -> None:
    """Run an export command's `write()`; a user's mistake, a full disk or a missing extra ends in one line."""
    folder = Path(output)
    created = not folder.exists()
    try:
        with exit_on_error(output):
            try:
                out = write()
            except ModuleNotFoundError as err:
                sys.exit(f"error: --format {fmt} needs {err.name}; install it with "
                         f"`pip install -c constraints.txt -e \".[export]\"`")
    except BaseException:
        if created and folder.is_dir() and not any(folder.iterdir()):  # a failed export leaves no empty folder
            folder.rmdir()
        raise
    print(f"wrote {out}")
