"""`python -m streamrec tune --config CONFIG.yaml --budget 30 --out runs/tune_NAME`: a validation-only search.

Optuna's TPE sampler proposes learning rate, weight decay, dropout, d_model, max_len and loss (`--params`
picks a subset); each trial trains with `fit`'s data and model settings plus the proposal, early-stops on
validation NDCG@10 (and stops at the config's `trainer.max_time`, a per-trial time cap), and is pruned
(median rule) when its validation NDCG@10 after an epoch falls below the median of earlier trials at that
epoch. The study lives in SQLite (`OUT/study.db`): stopping the search and running the same command again
resumes it; a trial cut off mid-way is run again first. `--budget` counts finished trials (`30`) or time
(`90m`, `2h`). The first trial of a new study trains the config's own values (where they lie in the
space), so the search starts from what `fit` would have trained.

It never reads the test split: trials call `fit` and validation only, and the objective is the best
validation NDCG@10 (`tests/streamrec/test_tune.py` proves it with a log whose test items differ). Outputs in
OUT: `best.yaml` (the config, with the command line's overrides and the winning values: `python -m streamrec
fit --config OUT/best.yaml`), `best.ckpt` (the best trial's best epoch: `test --ckpt_path` it),
`trials.csv`, `trials.png`, and a table of the best trials.
"""

from __future__ import annotations

import argparse
import csv
import hashlib
import json
import logging
import math
import os
import re
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from core.runtime.atomic import atomic_path
from core.runtime.cli import BASE, config_chain
from core.runtime.errors import InputError, exit_on_error
from core.runtime.lock import OutputLock
from streamrec.lightning_cli import build_cli
from streamrec.model.module import full_softmax_terms

METRIC = "val_ndcg@10"
STUDY_NAME = "streamrec"
PARAMS = ("lr", "weight_decay", "dropout", "d_model", "max_len", "loss")
CONFIG_KEYS = {name: ("data" if name == "max_len" else "model", name) for name in PARAMS}  # (section, key)
D_MODELS = (32, 64, 128)
MAX_LENS = (20, 50, 100, 200)
LOSSES = ("full", "gbce")


@dataclass(frozen=True)
class Budget:
    """How long the search runs: `trials` finished trials in the study, or `seconds` of this invocation."""

    trials: int | None = None
    seconds: float | None = None

    @classmethod
    def parse(cls, text: str) -> Budget:
        match = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", text)
        if not match or float(match.group(1)) <= 0:
            raise argparse.ArgumentTypeError(f"{text!r}: give a number of trials (30) or a time (45m, 2h, 600s)")
        value, unit = float(match.group(1)), match.group(2)
        if not unit:
            if value != int(value):
                raise argparse.ArgumentTypeError(f"{text!r}: a number of trials is a whole number")
            return cls(trials=int(value))
        return cls(seconds=value * {"s": 1, "m": 60, "h": 3600}[unit])

    def __str__(self) -> str:
        return f"{self.trials} trials" if self.trials else f"{self.seconds / 60:g} minutes"


@dataclass(frozen=True)
class TuneOptions:
    """One search: tune's flags (`--help`) as `parse_args` reads them."""

    config: tuple[str, ...]  # fit's --config files, each after the files it builds on (`base: FILE`)
    overrides: tuple[str, ...]  # fit's other --section.key arguments, given to every trial
    out: Path
    budget: Budget = Budget(trials=20)
    params: tuple[str, ...] = PARAMS
    max_epochs: int | None = None
    patience: int = 10
    startup_trials: int = 5
    seed: int = 0

    @property
    def config_args(self) -> list[str]:
        """fit's command line: the --config files, then the overrides."""
        return [a for name in self.config for a in ("--config", name)] + list(self.overrides)

    def trial_dir(self, number: int) -> Path:
        """Where a running trial keeps its best epoch's weights until `keep_if_best` moves or deletes them."""
        return self.out / "trials" / str(number)

    def fingerprint(self) -> str:
        """What makes two runs one study: the configs' text, the overrides, the space and the trial rules."""
        h = hashlib.sha256()
        for name in self.config:
            h.update(Path(name).read_bytes())
        h.update(json.dumps([self.overrides, self.params, self.max_epochs, self.patience, self.startup_trials,
                             self.seed, D_MODELS, MAX_LENS, LOSSES]).encode())
        return h.hexdigest()[:16]


RANGES = {"lr": (1e-4, 3e-2), "weight_decay": (1e-4, 1.0), "dropout": (0.0, 0.7)}
LOG_SCALE = ("lr", "weight_decay")
CHOICES = {"d_model": D_MODELS, "max_len": MAX_LENS, "loss": LOSSES}


def suggest(trial, params: tuple[str, ...], n_heads: int) -> dict[str, Any]:
    """The trial's proposal for each searched parameter (d_model: only the widths that `n_heads` divides)."""
    values = {}
    for name in params:
        if name in RANGES:
            values[name] = trial.suggest_float(name, *RANGES[name], log=name in LOG_SCALE)
        else:
            values[name] = trial.suggest_categorical(name, [c for c in CHOICES[name]
                                                            if name != "d_model" or c % n_heads == 0])
    return values


def starting_point(config: dict[str, Any], params: tuple[str, ...]) -> dict[str, Any]:
    """The config's own values of the searched parameters that lie in the space (`suggest`): trial 0 trains
    them, so the search starts from what the user would have trained (the default recipe when the config
    names only data) and its best can only be at least that on validation. Values outside the space
    (weight decay 0, loss "sampled") are left to the sampler."""
    point = {}
    for name in params:
        value = config[name]
        if name in RANGES:
            low, high = RANGES[name]
            if low <= value <= high:
                point[name] = float(value)
        elif value in CHOICES[name]:
            point[name] = value
    return point


def overrides(values: dict[str, Any]) -> list[str]:
    """Command-line overrides for `fit`'s parser: --model.lr 0.003 ..."""
    out = []
    for name, value in values.items():
        section, key = CONFIG_KEYS[name]
        out += [f"--{section}.{key}", str(value)]
    return out


def best_config(config_files: Sequence[str], values: dict[str, Any], header: str,
                command_line: Sequence[str] = ()) -> str:
    """The user's config (files merged, later wins, then tune's --section.key overrides) with the winning values.

    Args:
        config_files: the --config files, in order.
        values: the winning trial's values, by search name.
        header: comment lines put first.
        command_line: the overrides every trial got (`--data.path X` or `--data.path=X`), so `fit` and `test`
            on the written file see the same data and settings as the trials did.
    """
    merged: dict[str, Any] = {}
    for name in config_files:
        _merge(merged, yaml.safe_load(Path(name).read_text(encoding="utf-8")) or {})
    merged.pop(BASE, None)  # the bases are merged in; best.yaml lies elsewhere and names none
    for key, value in _override_pairs(command_line):
        nested = _typed(value)
        for part in reversed(key.split(".")):  # "data.path" -> {"data": {"path": value}}
            nested = {part: nested}
        _merge(merged, nested)
    for name, value in values.items():
        section, key = CONFIG_KEYS[name]
        merged.setdefault(section, {})[key] = value
    body = yaml.safe_dump(merged, sort_keys=False, default_flow_style=False)
    return "".join(f"# {line}\n" for line in header.splitlines()) + body


def _typed(value: str) -> Any:
    """A command-line value as YAML holds it: 3e-3 a number (YAML 1.1 reads it as text), true, null; 00:08:00 text
    (YAML 1.1 would read it as a base-60 number)."""
    if not value or ":" in value:
        return value
    if re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)[eE][-+]?\d+", value):
        return float(value)
    return yaml.safe_load(value)


def _override_pairs(command_line: Sequence[str]) -> list[tuple[str, str]]:
    """("data.path", "X") for each `--data.path X` or `--data.path=X`."""
    pairs, i = [], 0
    while i < len(command_line):
        arg = command_line[i]
        i += 1
        if not arg.startswith("--"):
            continue
        key, eq, value = arg[2:].partition("=")
        if not eq and i < len(command_line) and not command_line[i].startswith("--"):
            value, i = command_line[i], i + 1
        pairs.append((key, value))
    return pairs


def _merge(into: dict[str, Any], new: dict[str, Any]) -> None:
    for key, value in new.items():
        if isinstance(value, dict) and isinstance(into.get(key), dict):
            _merge(into[key], value)
        else:
            into[key] = value


# ----------------------------------------------------------------------------- one trial


def _callbacks(trial, patience: int, progress):
    """Early stopping, pruning and progress as Lightning callbacks (built here: Lightning imports late)."""
    import optuna
    from lightning.pytorch.callbacks import Callback, EarlyStopping

    class ReportToStudy(Callback):
        """Reports validation NDCG@10 after each epoch to Optuna and stops a trial the pruner gives up on.

        Ours, not optuna-integration's PyTorchLightningPruningCallback: that package pins its own
        Lightning import path and adds a dependency for 15 lines.
        """

        def __init__(self) -> None:
            self.values: list[float] = []

        def on_validation_end(self, trainer, pl_module) -> None:
            if trainer.sanity_checking or METRIC not in trainer.callback_metrics:
                return
            value = float(trainer.callback_metrics[METRIC])
            self.values.append(value)
            epoch = len(self.values)
            trial.report(value, epoch)
            progress(f"trial {trial.number}: epoch {epoch}, {METRIC} {value:.4f} (best {max(self.values):.4f})")
            if trial.should_prune():
                raise optuna.TrialPruned(f"{METRIC} {value:.4f} at epoch {epoch}")

    report = ReportToStudy()
    stop = EarlyStopping(monitor=METRIC, mode="max", patience=patience, check_finite=False)
    return report, [stop, report]


def run_trial(trial, options: TuneOptions, n_heads: int, progress) -> float:
    """Train one proposal with `fit`'s settings; the best validation NDCG@10 over its epochs."""
    import lightning as L
    from lightning.pytorch.callbacks import ModelCheckpoint

    values = suggest(trial, options.params, n_heads)
    cli = build_cli([*options.config_args, *overrides(values)], run=False)
    base = cli.config["trainer"]
    report, callbacks = _callbacks(trial, options.patience, progress)
    keep = ModelCheckpoint(dirpath=options.trial_dir(trial.number), filename="best", monitor=METRIC, mode="max",
                           save_weights_only=True, enable_version_counter=False)
    trainer = L.Trainer(
        max_epochs=options.max_epochs or base.max_epochs or 100, max_time=base.max_time,
        accelerator=base.accelerator, devices=1, precision=cli.trainer.precision, callbacks=[*callbacks, keep],
        logger=False, enable_progress_bar=False, enable_model_summary=False, num_sanity_val_steps=0,
        limit_train_batches=base.limit_train_batches, limit_val_batches=base.limit_val_batches,
    )
    start = time.perf_counter()
    try:
        trainer.fit(cli.model, datamodule=cli.datamodule)  # fit and validation only: never the test split
    finally:
        trial.set_user_attr("epochs", len(report.values))
        trial.set_user_attr("minutes", (time.perf_counter() - start) / 60)
    if not report.values:
        raise InputError(f"no {METRIC} was logged; tune needs validation every epoch and 10 in model.ks")
    best = max(report.values)
    trial.set_user_attr("best_epoch", report.values.index(best) + 1)
    return best


# ----------------------------------------------------------------------------- outputs


def keep_if_best(study, trial, out: Path, folder: Path) -> None:
    """The best trial's weights (in `folder`) become OUT/best.ckpt (test them without training again); others are
    deleted."""
    import optuna

    ckpt = folder / "best.ckpt"
    if trial.state == optuna.trial.TrialState.COMPLETE and study.best_trial.number == trial.number and ckpt.is_file():
        os.replace(ckpt, out / "best.ckpt")  # one rename on the same disk: never half-written
    shutil.rmtree(folder, ignore_errors=True)


def _trial_rows(study) -> list[dict[str, Any]]:
    import optuna

    rows = []
    for t in study.trials:
        if t.state not in (optuna.trial.TrialState.COMPLETE, optuna.trial.TrialState.PRUNED):
            continue
        reported = list(t.intermediate_values.values())
        value = t.value if t.value is not None else (max(reported) if reported else math.nan)
        best_epoch = t.user_attrs.get("best_epoch", reported.index(value) + 1 if value in reported else "")
        rows.append({"trial": t.number, "state": t.state.name.lower(), METRIC: value,
                     "best_epoch": best_epoch, "epochs": t.user_attrs.get("epochs", len(reported)),
                     "minutes": round(t.user_attrs.get("minutes", math.nan), 2), **t.params})
    return rows


def write_table(rows: list[dict[str, Any]], path: Path, params: tuple[str, ...]) -> None:
    fields = ["trial", "state", METRIC, "best_epoch", "epochs", "minutes", *params]
    with atomic_path(path) as tmp, tmp.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=fields, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)


def plot_trials(rows: list[dict[str, Any]], path: Path) -> None:
    """Left: each trial's validation NDCG@10 and the best so far; right: against the learning rate."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, ax_lr) = plt.subplots(1, 2, figsize=(11, 4), constrained_layout=True)
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
    ax_lr.set(xlabel="learning rate", ylabel=METRIC, xscale="log", title="learning rate")
    ax.legend()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def print_table(rows: list[dict[str, Any]], params: tuple[str, ...], top: int = 10) -> None:
    from rich.console import Console
    from rich.table import Table

    table = Table(title=f"best {min(top, len(rows))} of {len(rows)} trials by {METRIC} (validation only)",
                  title_justify="left")
    for col in ("trial", "state", METRIC, "epoch", "min", *params):
        table.add_column(col, justify="right")
    ranked = sorted((r for r in rows if not math.isnan(r[METRIC])), key=lambda r: -r[METRIC])
    for r in ranked[:top]:
        table.add_row(str(r["trial"]), r["state"], f"{r[METRIC]:.4f}", f"{r['best_epoch']}/{r['epochs']}",
                      f"{r['minutes']:.1f}", *(_fmt(r.get(p)) for p in params))
    Console(width=None if sys.stdout.isatty() else 140).print(table)


def _fmt(value: Any) -> str:
    return f"{value:.3g}" if isinstance(value, float) else str(value)


# ----------------------------------------------------------------------------- the search


def parse_args(argv: list[str] | None) -> TuneOptions:
    p = argparse.ArgumentParser(
        prog="python -m streamrec tune", description=__doc__.split("\n\n", 1)[1],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="Any other --section.key VALUE goes to every trial's fit (e.g. --data.path other.csv "
               "--trainer.precision bf16-mixed).\nExample: python -m streamrec tune --config "
               "configs/streamrec/beauty.yaml --budget 2h --out runs/tune_beauty\n         python -m streamrec fit "
               "--config runs/tune_beauty/best.yaml",
    )
    p.add_argument("--config", action="append", required=True, metavar="YAML",
                   help="fit's config (repeat to merge several); its data and model settings are the starting point")
    p.add_argument("--budget", type=Budget.parse, default=Budget(trials=20),
                   help="finished trials in the study (30), or time for this run after which no trial starts "
                        "(45m, 2h); default 20 trials")
    p.add_argument("--out", type=Path, required=True,
                   help="folder for study.db, best.yaml, trials.csv, trials.png; created if missing")
    p.add_argument("--params", nargs="+", choices=PARAMS, default=list(PARAMS), help="what to search (default all)")
    p.add_argument("--max-epochs", type=int, help="epochs a trial may run (default the config's trainer.max_epochs)")
    p.add_argument("--patience", type=int, default=10, help="early stopping: epochs without a gain (default 10)")
    p.add_argument("--startup-trials", type=int, default=5,
                   help="trials before TPE and the pruner act; random proposals until then (default 5)")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    args, rest = p.parse_known_args(argv)
    for arg in rest:
        if arg.startswith("-") and not arg.startswith(("--data.", "--model.", "--trainer.", "--seed_everything")):
            p.error(f"unknown option {arg.split('=')[0]}; tune's own options are listed by --help, and fit's "
                    "go as --data.KEY, --model.KEY or --trainer.KEY")
    for name in ("max_epochs", "patience", "startup_trials"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in args.config:
        if not Path(name).is_file():
            p.error(f"--config {name}: no such file")
    try:  # each file after its bases (`base: FILE`): best.yaml and the study's fingerprint hold them too
        config = tuple(path for name in args.config for path in config_chain(name))
    except InputError as err:
        p.error(str(err))
    return TuneOptions(config, tuple(rest), args.out, args.budget, tuple(dict.fromkeys(args.params)),
                       args.max_epochs, args.patience, args.startup_trials, args.seed)


def open_study(options: TuneOptions, start: dict[str, Any]):
    """The study in OUT/study.db; a new one gets `start` (the config's values) as its first trial."""
    import optuna

    storage = f"sqlite:///{(options.out / 'study.db').resolve()}"
    sampler = optuna.samplers.TPESampler(seed=options.seed, n_startup_trials=options.startup_trials)
    pruner = optuna.pruners.MedianPruner(n_startup_trials=options.startup_trials, n_warmup_steps=2)
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction="maximize", sampler=sampler,
                                pruner=pruner, load_if_exists=True)
    stored = study.user_attrs.get("fingerprint")
    if stored is None:
        study.set_user_attr("fingerprint", options.fingerprint())
        study.set_user_attr("command", " ".join(sys.argv))
        if start and not study.trials:
            study.enqueue_trial(start)
    elif stored != options.fingerprint():
        raise InputError(f"{options.out / 'study.db'} holds a search with other settings "
                         f"({study.user_attrs.get('command', 'another command')}); pass another --out, "
                         "or delete the folder to start over")
    # The lock on OUT guarantees no other tuner is running: a RUNNING trial was cut off. Run it again first.
    for t in study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.RUNNING,)):
        study.tell(t.number, state=optuna.trial.TrialState.FAIL)
        study.enqueue_trial(t.params, skip_if_exists=False)
    return study


def finished(study) -> int:
    import optuna

    return len(study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,
                                                        optuna.trial.TrialState.PRUNED)))


def search(options: TuneOptions) -> None:
    import optuna
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric", "streamrec"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (".*does not have many workers.*", ".*args parameter is intended.*", ".*LeafSpec.*"):
        warnings.filterwarnings("ignore", message)
    base = build_cli(options.config_args, run=False)  # a wrong key or file fails here, in one line, before any trial
    if 10 not in base.model.hparams.ks:
        raise InputError(f"tune maximises {METRIC}; keep 10 in model.ks (got {list(base.model.hparams.ks)})")
    hp = base.model.hparams
    terms = full_softmax_terms(hp)
    if "loss" in options.params and terms:
        # StreamRecModule refuses these terms with another loss, so a config that sets one (beauty.yaml) keeps its
        # loss rather than failing every trial that proposes gbce
        options = replace(options, params=tuple(p for p in options.params if p != "loss"))
        print(f"tune: the loss is not searched: the config's {' and '.join(terms)} "
              f"{'needs' if len(terms) == 1 else 'need'} loss: full", file=sys.stderr)
    start = starting_point({"lr": hp.lr, "weight_decay": hp.weight_decay, "dropout": hp.dropout, "d_model": hp.d_model,
                            "loss": hp.loss, "max_len": base.datamodule.max_len}, options.params)
    del base
    study = open_study(options, start)
    done_before = finished(study)
    n_trials = None if options.budget.trials is None else max(0, options.budget.trials - done_before)
    print(f"tune: {METRIC} on the validation split over {', '.join(options.params)}; budget {options.budget} "
          f"({done_before} trials already in {options.out / 'study.db'}); the test split is never read",
          file=sys.stderr)
    total = n_trials if n_trials is not None else options.budget.seconds
    from rich.console import Console

    console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("tune", total=total)
        start = time.monotonic()

        def progress(text: str) -> None:
            bar.update(task, description=text, **({} if n_trials is not None else
                                                  {"completed": min(total, time.monotonic() - start)}))

        def after_trial(study, trial) -> None:
            keep_if_best(study, trial, options.out, options.trial_dir(trial.number))
            if n_trials is not None:
                bar.advance(task)
            if trial.state == optuna.trial.TrialState.FAIL:
                return
            reported = list(trial.intermediate_values.values())
            value = trial.value if trial.value is not None else (reported[-1] if reported else math.nan)
            what = (f"{value:.4f} at epoch {trial.user_attrs.get('best_epoch')}/{trial.user_attrs.get('epochs')}"
                    if trial.state == optuna.trial.TrialState.COMPLETE
                    else f"pruned after epoch {len(reported)} ({value:.4f})")
            best = study.best_trial if any(t.state == optuna.trial.TrialState.COMPLETE for t in study.trials) else None
            bar.console.print(f"trial {trial.number}: {METRIC} {what} in {trial.user_attrs.get('minutes', 0):.1f} min; "
                              + ", ".join(f"{k} {_fmt(v)}" for k, v in trial.params.items())
                              + (f" | best {best.value:.4f} (trial {best.number})" if best else ""))

        def objective(trial) -> float:
            try:
                return run_trial(trial, options, hp.n_heads, progress)
            except BaseException:
                # Optuna calls no callback (keep_if_best) for a trial that fails, so its weights go here (a
                # pruned one's would go there anyway). One cut off by Ctrl-C is run again from the start under
                # a new number: its weights are no use either.
                shutil.rmtree(options.trial_dir(trial.number), ignore_errors=True)
                raise

        if n_trials != 0:
            study.optimize(objective, n_trials=n_trials, timeout=options.budget.seconds, callbacks=[after_trial],
                           catch=())
    write_outputs(study, options)


def write_outputs(study, options: TuneOptions) -> None:
    import optuna

    rows = _trial_rows(study)
    if not rows:
        print("tune: no trial finished; nothing written", file=sys.stderr)
        return
    write_table(rows, options.out / "trials.csv", options.params)
    plot_trials(rows, options.out / "trials.png")
    print_table(rows, options.params)
    complete = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    if not complete:
        print("tune: every trial was pruned; no best.yaml", file=sys.stderr)
        return
    best, out = study.best_trial, options.out
    header = (f"Written by `python -m streamrec tune` (study {out / 'study.db'}): trial {best.number} of "
              f"{len(rows)},\n{METRIC} {best.value:.4f} at epoch {best.user_attrs.get('best_epoch')} on the "
              f"validation split; the test split was not read.\nIts weights: {out / 'best.ckpt'} (python -m "
              f"streamrec test --config {out / 'best.yaml'} --ckpt_path {out / 'best.ckpt'}).\nTrain it "
              f"again: python -m streamrec fit --config {out / 'best.yaml'}")
    with atomic_path(out / "best.yaml") as tmp:
        tmp.write_text(best_config(options.config, best.params, header, options.overrides), encoding="utf-8")
    print(f"tune: best {METRIC} {best.value:.4f} (trial {best.number}: "
          + ", ".join(f"{k} {_fmt(v)}" for k, v in best.params.items())
          + f"); config {out / 'best.yaml'}, table {out / 'trials.csv'}, plot {out / 'trials.png'}")


def main(argv: list[str] | None = None) -> None:
    options = parse_args(argv)
    with exit_on_error(interrupted=f"the study in {options.out / 'study.db'} keeps every finished trial; run the "
                                   "same command to go on"):
        options.out.mkdir(parents=True, exist_ok=True)
        with OutputLock(options.out, "tune"):
            search(options)
