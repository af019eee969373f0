"""What a search leaves: trials.csv, trials.png, a table of the best trials, and best.yaml."""

from __future__ import annotations

import csv
import dataclasses
import importlib
import math
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import optuna
import yaml
from jsonargparse import ArgumentError, ArgumentParser
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator
from optuna.trial import TrialState
from rich.console import Console
from rich.table import Table

from core.runtime.atomic import atomic_path
from streamrec.tuning.space import overrides
from streamrec.tuning.trial import METRIC

Row = dict[str, Any]


def trial_rows(study: optuna.Study) -> list[Row]:
    """One row per finished (complete or pruned) trial: its value, epochs, minutes and parameters."""
    rows = []
    for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE, TrialState.PRUNED)):
        reported = list(t.intermediate_values.values())
        value = t.value if t.value is not None else (max(reported) if reported else math.nan)
        best_epoch = t.user_attrs.get("best_epoch", reported.index(value) + 1 if value in reported else "")
        rows.append({"trial": t.number, "state": t.state.name.lower(), METRIC: value,
                     "best_epoch": best_epoch, "epochs": t.user_attrs.get("epochs", len(reported)),
                     "minutes": round(t.user_attrs.get("minutes", math.nan), 2), **t.params})
    return rows


def write_table(rows: list[Row], path: Path, params: tuple[str, ...]) -> None:
    fields = ["trial", "state", METRIC, "best_epoch", "epochs", "minutes", *params]
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def trials_figure(rows: list[Row]) -> Figure:
    """Left: each trial's validation NDCG@10 and the best so far; right: against the learning rate."""
    fig = Figure(figsize=(11, 4), layout="constrained")  # no pyplot: no backend, no global figure state
    ax, ax_lr = fig.subplots(1, 2)
    for state, marker in (("complete", "o"), ("pruned", "x")):
        pts = [(r["trial"], r[METRIC], r.get("lr")) for r in rows if r["state"] == state]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], marker=marker, label=state)
            if all(p[2] is not None for p in pts):
                ax_lr.scatter([p[2] for p in pts], [p[1] for p in pts], marker=marker, label=state)
    done = sorted((r["trial"], r[METRIC]) for r in rows if r["state"] == "complete")
    if done:
        best = [max(v for _, v in done[: i + 1]) for i in range(len(done))]
        ax.step([n for n, _ in done], best, where="post", color="black", label="best so far")
    ax.set(xlabel="trial", ylabel=f"{METRIC} (pruned: last reported)", title="trials")
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))  # trials are numbered: no tick at 0.5
    ax_lr.set(xlabel="learning rate", ylabel=METRIC, xscale="log", title="learning rate")
    ax.legend()
    return fig


def print_table(rows: list[Row], params: tuple[str, ...], top: int = 10) -> None:
    """The `top` trials by validation NDCG@10, as a table on stdout."""
    table = Table(title=f"best {min(top, len(rows))} of {len(rows)} trials by {METRIC} (validation only)",
                  title_justify="left")
    for col in ("trial", "state", METRIC, "epoch", "min", *params):
        table.add_column(col, justify="right")
    ranked = sorted((r for r in rows if not math.isnan(r[METRIC])), key=lambda r: -r[METRIC])
    for r in ranked[:top]:
        table.add_row(str(r["trial"]), r["state"], f"{r[METRIC]:.4f}", f"{r['best_epoch']}/{r['epochs']}",
                      f"{r['minutes']:.1f}", *(fmt(r.get(p)) for p in params))
    Console(width=None if sys.stdout.isatty() else 140).print(table)


def fmt(value: Any) -> str:
    """A parameter value as the tables show it: floats to 3 significant digits."""
    return f"{value:.3g}" if isinstance(value, float) else str(value)


def best_config(parser: ArgumentParser, config_args: Sequence[str], values: dict[str, Any], header: str) -> str:
    """The config `fit` parses from `config_args` with the winning `values`, as YAML listing only what differs from
    fit's defaults, after `header` as comment lines. Read and written by fit's own parser, so the file holds what the
    trials trained with. An option group is written as its keys (`objective: {loss: gbce}`) when the parser reads that
    back to the same config; else as the parser dumps it (class_path, init_args)."""
    config = parser.parse_args([*config_args, *overrides(values)])
    text = parser.dump(config, skip_default=True)
    plain = yaml.safe_dump(_plain_groups(yaml.safe_load(text)), sort_keys=False)
    exits = parser.exit_on_error
    parser.exit_on_error = False  # a refusal here only means: keep the parser's own form
    try:
        if parser.dump(parser.parse_string(plain)) == parser.dump(config):
            text = plain
    except ArgumentError:
        pass
    finally:
        parser.exit_on_error = exits
    return "".join(f"# {line}\n" for line in header.splitlines()) + text


def _plain_groups(node: Any) -> Any:
    """`node` with each {class_path, init_args} mapping of an option group (a dataclass) replaced by its init_args."""
    if isinstance(node, dict):
        if set(node) == {"class_path", "init_args"} and _is_dataclass(node["class_path"]):
            return _plain_groups(node["init_args"])
        return {key: _plain_groups(value) for key, value in node.items()}
    return node


def _is_dataclass(class_path: object) -> bool:
    module, _, name = str(class_path).rpartition(".")
    try:
        return dataclasses.is_dataclass(getattr(importlib.import_module(module), name))
    except (ImportError, AttributeError, ValueError):
        return False
