"""`python -m streamrec tune --config CONFIG.yaml --budget 30 --out runs/tune_NAME`: a validation-only search.

Optuna's TPE sampler proposes learning rate, weight decay, dropout, d_model, max_len and loss (`--params` picks a
subset); each trial trains with `fit`'s data and model settings plus the proposal, early-stops on validation NDCG@10
(and stops at the config's `trainer.max_time`, a per-trial time cap), and is pruned (median rule) when its validation
NDCG@10 after an epoch falls below the median of earlier trials at that epoch. The study lives in SQLite
(`OUT/study.db`): stopping the search and running the same command again resumes it; a trial cut off mid-way is run
again first. `--budget` counts finished trials (`30`) or time (`90m`, `2h`). The first trial of a new study trains the
config's own values (where they lie in the space), so the search starts from what `fit` would have trained.

It never reads the test split: trials call `fit` and validation only, and the objective is the best validation NDCG@10
(`tests/streamrec/test_tune.py` proves it with a log whose test items differ). Outputs in OUT: `best.yaml` (fit's config
of the winning trial, the command line's overrides and the trials' epochs included, listing what differs from fit's
defaults: `python -m streamrec fit --config OUT/best.yaml`), `best.ckpt` (the best trial's best epoch: `test
--ckpt_path` it), `trials.csv`, `trials.png`, and a table of the best trials."""

from __future__ import annotations

import argparse
import logging
import math
import shutil
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import optuna
from jsonargparse import ArgumentParser
from optuna.trial import FrozenTrial, TrialState
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from core.runtime.atomic import atomic_path, atomic_write_text
from core.runtime.cli import config_chain
from core.runtime.errors import InputError, exit_on_error
from core.runtime.lock import OutputLock, interrupt_on_sigterm
from streamrec.lightning_cli import build_cli
from streamrec.model.module import full_softmax_terms
from streamrec.tuning.options import Budget, TuneOptions
from streamrec.tuning.report import best_config, fmt, print_table, trial_rows, trials_figure, write_table
from streamrec.tuning.space import PARAMS, SPACE, config_value, config_values, starting_point
from streamrec.tuning.trial import METRIC, keep_if_best, run_trial

STUDY_NAME = "streamrec"
KS_KEY = "model.evaluation.ks"  # tune maximises NDCG@10: 10 must be among these cutoffs
FINISHED = (TrialState.COMPLETE, TrialState.PRUNED)
FIT_OPTIONS = ("--data.", "--model.", "--trainer.", "--seed_everything", "--threads")  # passed on to every trial


def parse_args(argv: list[str] | None) -> TuneOptions:
    """tune's own options; any other --section.key goes to every trial's fit."""
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
    p.add_argument("--params", nargs="+", choices=PARAMS, default=list(PARAMS),
                   help="what to search (default all): " + ", ".join(f"{n} (--{p.key})" for n, p in SPACE.items()))
    p.add_argument("--max-epochs", type=int, help="epochs a trial may run (default the config's trainer.max_epochs)")
    p.add_argument("--patience", type=int, default=10, help="early stopping: epochs without a gain (default 10)")
    p.add_argument("--startup-trials", type=int, default=5,
                   help="trials before TPE and the pruner act; random proposals until then (default 5)")
    p.add_argument("--seed", type=int, default=0, help="the sampler's seed (default 0)")
    args, rest = p.parse_known_args(argv)
    for arg in rest:
        if arg.startswith("-") and not arg.startswith(FIT_OPTIONS):
            p.error(f"unknown option {arg.split('=')[0]}; tune's own options are listed by --help, and fit's "
                    "go as --data.KEY, --model.KEY, --trainer.KEY, --seed_everything or --threads")
    for name in ("max_epochs", "patience", "startup_trials"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1, got {getattr(args, name)}")
    for name in args.config:
        if not Path(name).is_file():
            p.error(f"--config {name}: no such file")
    try:  # each file after its bases (`base: FILE`): the study's fingerprint holds them too
        config = tuple(path for name in args.config for path in config_chain(name))
    except InputError as err:
        p.error(str(err))
    return TuneOptions(config, tuple(rest), args.out, args.budget, tuple(dict.fromkeys(args.params)),
                       args.max_epochs, args.patience, args.startup_trials, args.seed)


def open_study(options: TuneOptions, start: dict[str, Any]) -> optuna.Study:
    """The study in OUT/study.db; a new one gets `start` (the config's values) as its first trial. The sampler's seed is
    `--seed` plus the trials the study already holds: seeded as the first run, a resumed search would propose the first
    run's trials again."""
    # A reader of the study (a dashboard, a script) holds SQLite's lock for a moment: wait for it, as SQLite's
    # default 5 s can fail a trial's commit on a loaded machine.
    storage = optuna.storages.RDBStorage(f"sqlite:///{(options.out / 'study.db').resolve()}",
                                         engine_kwargs={"connect_args": {"timeout": 60}})
    pruner = optuna.pruners.MedianPruner(n_startup_trials=options.startup_trials, n_warmup_steps=2)
    study = optuna.create_study(study_name=STUDY_NAME, storage=storage, direction="maximize", pruner=pruner,
                                load_if_exists=True)
    study.sampler = optuna.samplers.TPESampler(seed=options.seed + len(study.trials),
                                               n_startup_trials=options.startup_trials)
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
    for t in study.get_trials(deepcopy=False, states=(TrialState.RUNNING,)):
        study.tell(t.number, state=TrialState.FAIL)
        study.enqueue_trial(t.params, skip_if_exists=False)
    return study


def quiet() -> None:
    """Optuna's and Lightning's per-trial chatter off: the progress bar and one line a trial say it all."""
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    for name in ("lightning", "lightning.pytorch", "lightning.fabric", "lightning_fabric", "streamrec"):
        logging.getLogger(name).setLevel(logging.WARNING)
    for message in (".*does not have many workers.*", ".*args parameter is intended.*", ".*LeafSpec.*"):
        warnings.filterwarnings("ignore", message)


def prepare(options: TuneOptions) -> tuple[TuneOptions, ArgumentParser, dict[str, Any], int, int]:
    """Check the config once before any trial (a wrong key or file fails here, in one line) and read from it the
    options (the loss left out where a full-softmax term needs it), fit's parser, the start, n_heads, epochs."""
    base = build_cli(options.config_args, run=False)
    config = base.config
    ks = config_value(config, KS_KEY)
    if 10 not in ks:
        raise InputError(f"tune maximises {METRIC}; keep 10 in {KS_KEY} (got {list(ks)})")
    terms = full_softmax_terms(base.model.hparams)
    if "loss" in options.params and terms:
        # StreamRecModule refuses these terms with another loss, so a config that sets one (beauty.yaml) keeps its
        # loss rather than failing every trial that proposes gbce
        options = replace(options, params=tuple(p for p in options.params if p != "loss"))
        print(f"tune: the loss is not searched: the config's {' and '.join(terms)} "
              f"{'needs' if len(terms) == 1 else 'need'} {SPACE['loss'].key}: full", file=sys.stderr)
    start = starting_point(config_values(config, options.params), options.params)
    epochs = options.trial_epochs(config_value(config, "trainer.max_epochs"))
    return options, base.parser, start, config_value(config, "model.n_heads"), epochs


def search(options: TuneOptions) -> None:
    """Run the study until its budget is spent, then write its outputs."""
    quiet()
    options, parser, start, n_heads, epochs = prepare(options)
    study = open_study(options, start)
    done_before = len(study.get_trials(deepcopy=False, states=FINISHED))  # what a budget of trials counts
    n_trials = None if options.budget.trials is None else max(0, options.budget.trials - done_before)
    print(f"tune: {METRIC} on the validation split over {', '.join(options.params)}; budget {options.budget} "
          f"({done_before} trials already in {options.out / 'study.db'}); the test split is never read",
          file=sys.stderr)
    total = n_trials if n_trials is not None else options.budget.seconds
    console = Console(stderr=True, width=None if sys.stderr.isatty() else 140)
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed:.0f}/{task.total:.0f}"),
                  TimeElapsedColumn(), console=console) as bar:
        task = bar.add_task("tune", total=total)
        began = time.monotonic()

        def progress(text: str) -> None:
            bar.update(task, description=text, **({} if n_trials is not None else
                                                  {"completed": min(total, time.monotonic() - began)}))

        def after_trial(study: optuna.Study, trial: FrozenTrial) -> None:
            keep_if_best(study, trial, options.out, options.trial_dir(trial.number))
            if n_trials is not None:
                bar.advance(task)
            if trial.state != TrialState.FAIL:
                bar.console.print(trial_line(study, trial))

        def objective(trial: optuna.Trial) -> float:
            try:
                return run_trial(trial, options, n_heads, progress)
            except BaseException as err:
                # Optuna calls no callback (keep_if_best) for a trial that fails, so its weights go here (a
                # pruned one's would go there anyway). One cut off by Ctrl-C or SIGTERM is run again from the
                # start under a new number: its weights are no use either. It stays RUNNING, what the next run
                # reruns, as a SystemExit (what Lightning's fit makes of it), which Optuna does not mark failed.
                shutil.rmtree(options.trial_dir(trial.number), ignore_errors=True)
                if isinstance(err, KeyboardInterrupt):
                    raise SystemExit(1) from err
                raise

        if n_trials != 0:
            study.optimize(objective, n_trials=n_trials, timeout=options.budget.seconds, callbacks=[after_trial],
                           catch=())
    write_outputs(study, options, parser, epochs)


def trial_line(study: optuna.Study, trial: FrozenTrial) -> str:
    """One line on a finished trial: its value, epochs, minutes, parameters, and the best so far."""
    reported = list(trial.intermediate_values.values())
    value = trial.value if trial.value is not None else (reported[-1] if reported else math.nan)
    what = (f"{value:.4f} at epoch {trial.user_attrs.get('best_epoch')}/{trial.user_attrs.get('epochs')}"
            if trial.state == TrialState.COMPLETE else f"pruned after epoch {len(reported)} ({value:.4f})")
    best = study.best_trial if any(t.state == TrialState.COMPLETE for t in study.trials) else None
    return (f"trial {trial.number}: {METRIC} {what} in {trial.user_attrs.get('minutes', 0):.1f} min; "
            + ", ".join(f"{k} {fmt(v)}" for k, v in trial.params.items())
            + (f" | best {best.value:.4f} (trial {best.number})" if best else ""))


def write_outputs(study: optuna.Study, options: TuneOptions, parser: ArgumentParser, epochs: int) -> None:
    """trials.csv, trials.png and the table; best.yaml when a trial completed, with the trials' max_epochs and
    patience, so that fit trains the winner as the trial did."""
    rows = trial_rows(study)
    if not rows:
        print("tune: no trial finished; nothing written", file=sys.stderr)
        return
    write_table(rows, options.out / "trials.csv", options.params)
    with atomic_path(options.out / "trials.png") as tmp:
        trials_figure(rows).savefig(tmp, format="png", dpi=110)
    print_table(rows, options.params)
    if not any(t.state == TrialState.COMPLETE for t in study.get_trials(deepcopy=False)):
        print("tune: every trial was pruned; no best.yaml", file=sys.stderr)
        return
    best, out = study.best_trial, options.out
    header = (f"Written by `python -m streamrec tune` (study {out / 'study.db'}): trial {best.number} of "
              f"{len(rows)},\n{METRIC} {best.value:.4f} at epoch {best.user_attrs.get('best_epoch')} on the "
              f"validation split; the test split was not read.\nIts weights: {out / 'best.ckpt'} (python -m "
              f"streamrec test --config {out / 'best.yaml'} --ckpt_path {out / 'best.ckpt'}).\nTrain it "
              f"again: python -m streamrec fit --config {out / 'best.yaml'}")
    trained_as = ["--trainer.max_epochs", str(epochs), "--early_stopping", str(options.patience)]
    text = best_config(parser, [*options.config_args, *trained_as], best.params, header)
    atomic_write_text(out / "best.yaml", text)
    print(f"tune: best {METRIC} {best.value:.4f} (trial {best.number}: "
          + ", ".join(f"{k} {fmt(v)}" for k, v in best.params.items())
          + f"); config {out / 'best.yaml'}, table {out / 'trials.csv'}, plot {out / 'trials.png'}")


def main(argv: list[str] | None = None) -> None:
    """CLI entry point: a search, resumable; a user's mistake ends with one line."""
    options = parse_args(argv)
    interrupt_on_sigterm()
    with exit_on_error(interrupted=f"the study in {options.out / 'study.db'} keeps every finished trial; run the "
                                   "same command to go on"):
        options.out.mkdir(parents=True, exist_ok=True)
        with OutputLock(options.out, "tune"):
            search(options)
