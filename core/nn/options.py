"""Typed option groups: a model's settings that belong together, as one frozen, validated object. A LightningModule
takes each group as one argument (`speed: SpeedOptions = SpeedOptions()`), which LightningCLI exposes as
`--model.speed.compile default` and YAML as a nested mapping. Each group checks its own rules in `__post_init__`, so a
bad value is refused in one place, before anything is built."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, TypeVar

from core.nn.compile import CompileMode, check_backend, compile_mode

Group = TypeVar("Group", bound="OptionGroup")


def check_choice(name: str, value: object, choices: tuple[str, ...]) -> None:
    """ValueError naming `name` and the accepted values unless `value` is one of `choices`."""
    if value not in choices:
        raise ValueError(f"`{name}` must be {', '.join(choices[:-1])} or {choices[-1]}, got {value!r}")


@dataclasses.dataclass(frozen=True)
class OptionGroup:
    """Base of the frozen dataclasses that hold one group of a module's settings. A dataclass itself (with no fields):
    jsonargparse exposes a dataclass's fields as `--model.GROUP.FIELD` only when every class it derives from is one."""

    @classmethod
    def of(cls: type[Group], value: Group | Mapping[str, Any] | None, name: str = "") -> Group:
        """`value` as this group: itself, or built from a mapping (a checkpoint's, a config's); None: defaults. A key
        the group lacks is a one-line ValueError naming `name` (the class when empty) and the keys it has."""
        if value is None:
            return cls()
        if isinstance(value, cls):
            return value
        if not isinstance(value, Mapping):
            raise ValueError(f"`{name or cls.__name__}` must be a mapping of its keys, got {value!r}")
        fields = [f.name for f in dataclasses.fields(cls)]  # type: ignore[arg-type]
        unknown = [key for key in value if key not in fields]
        if unknown:
            raise ValueError(f"`{name or cls.__name__}` has no key {unknown[0]!r}; its keys are {', '.join(fields)}")
        return cls(**dict(value))

    def as_dict(self) -> dict[str, Any]:
        """The group's fields as plain values (tuples as lists), as checkpoints and exports store them: the safe loader
        unpickles no class of ours, and `of` turns such a dict back into the group."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}  # type: ignore[call-overload]


@dataclasses.dataclass(frozen=True)
class SpeedOptions(OptionGroup):
    """How a network runs, not what it computes: a checkpoint is the same under every setting.

    Args:
        cpu_fastpath: fp32 CPU linears in oneDNN and a cheaper dropout mask (`core.nn.cpu_fastpath`; off: plain
            `nn.Linear` / `nn.Dropout`). Off by default: what it gains depends on the CPU
            (`benchmarks/cpu_fastpath.py` measures it).
        compile: torch.compile the stacks when a trainer sets the module up (`core.nn.compile`): null or false
            (default) runs eager; default, reduce-overhead (CUDA graphs; lengths are then rounded up to a multiple
            of 16 so that a few graphs serve every batch), max-autotune or max-autotune-no-cudagraphs. The first
            steps are slower while it compiles; `load_from_checkpoint` outside a trainer stays eager.
        compile_backend: torch.compile backend; "eager" or "aot_eager" check the plumbing without inductor."""

    cpu_fastpath: bool = False
    compile: bool | CompileMode | None = None
    compile_backend: str = "inductor"

    def __post_init__(self) -> None:
        compile_mode(self.compile, "model.speed.compile")  # refuse a bad value before any training
        check_backend(self.compile_backend, "model.speed.compile_backend")

    @property
    def compile_mode(self) -> str | None:  # None: eager
        return compile_mode(self.compile)


def regroup(hparams: Mapping[str, Any], moved: Mapping[str, tuple[str, str]]) -> dict[str, Any]:
    """`hparams` with the flat names of an older layout moved into their groups: `moved` maps an old name to its
    (group, name in the group). Other keys are kept as they are; a group already given as a mapping is merged. The
    loaders of old checkpoints call it (`streamrec.model.hparams`, `translate.model.hparams`); the old names are never
    constructor options. A group that is not a mapping, or a setting given flat and in its group, is a ValueError."""
    out: dict[str, Any] = {}
    found: dict[str, dict[str, Any]] = {}
    for key, value in hparams.items():
        if key in moved:
            group, name = moved[key]
            found.setdefault(group, {})[name] = value
        else:
            out[key] = dict(value) if isinstance(value, Mapping) else value
    for group, values in found.items():
        given = out.get(group) or {}
        if not isinstance(given, Mapping):
            raise ValueError(f"hyper-parameter `{group}` must be a mapping, got {given!r}")
        both = [name for name in values if name in given]
        if both:
            raise ValueError(f"hyper-parameter `{group}.{both[0]}` is given twice, flat and in `{group}`; keep one")
        out[group] = {**given, **values}
    return out
