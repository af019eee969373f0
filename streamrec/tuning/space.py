"""The search space: each searched parameter, the config key it sets, and its range or choices.

`SPACE` is the one table of names: a name is what `--params` takes, what Optuna records and a trials.csv column; its
`key` is fit's config key (`--model.objective.loss`)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass
from typing import Any

import optuna
from jsonargparse import Namespace


@dataclass(frozen=True)
class Param:
    """One searched parameter at fit's dotted config `key`: a float range (`low`, `high`, `log`) or `choices`."""

    key: str
    low: float | None = None
    high: float | None = None
    log: bool = False
    choices: tuple[Any, ...] = ()

    def contains(self, value: Any) -> bool:
        """Whether `value` lies in the space (a float in the range, a choice among the choices)."""
        if self.choices:
            return value in self.choices
        return isinstance(value, int | float) and self.low <= value <= self.high


SPACE: dict[str, Param] = {
    "lr": Param("model.lr", 1e-4, 3e-2, log=True),
    "weight_decay": Param("model.weight_decay", 1e-4, 1.0, log=True),
    "dropout": Param("model.dropout", 0.0, 0.7),
    "d_model": Param("model.d_model", choices=(32, 64, 128)),
    "max_len": Param("data.max_len", choices=(20, 50, 100, 200)),
    "loss": Param("model.objective.loss", choices=("full", "gbce")),
}
PARAMS = tuple(SPACE)


def space_spec() -> dict[str, dict[str, Any]]:
    """The table as plain data (a study's fingerprint holds it: another space is another study)."""
    return {name: asdict(param) for name, param in SPACE.items()}


def suggest(trial: optuna.Trial, params: tuple[str, ...], n_heads: int) -> dict[str, Any]:
    """The trial's proposal for each searched parameter (d_model: only the widths that `n_heads` divides)."""
    return {name: trial.suggest_categorical(name, [c for c in p.choices if name != "d_model" or c % n_heads == 0])
            if p.choices else trial.suggest_float(name, p.low, p.high, log=p.log)
            for name, p in ((name, SPACE[name]) for name in params)}


def starting_point(values: Mapping[str, Any], params: tuple[str, ...]) -> dict[str, Any]:
    """The config's own `values` of the searched parameters that lie in the space: trial 0 trains them, so the
    search's best is at least what the user would have trained; values outside are left to the sampler."""
    return {name: values[name] if SPACE[name].choices else float(values[name])
            for name in params if SPACE[name].contains(values[name])}


def overrides(values: Mapping[str, Any]) -> list[str]:
    """fit's command-line overrides for the searched `values`: --model.lr 0.003 ..."""
    return [arg for name, value in values.items() for arg in (f"--{SPACE[name].key}", str(value))]


def config_value(config: Namespace, key: str) -> Any:
    """The value of the dotted `key` in a parsed config, through an option group's `init_args`."""
    node: Any = config
    for part in key.split("."):
        if part not in node and "init_args" in node:
            node = node["init_args"]
        node = node[part]
    return node


def config_values(config: Namespace, params: tuple[str, ...]) -> dict[str, Any]:
    return {name: config_value(config, SPACE[name].key) for name in params}
