"""What the two apps' LightningCLI entry points share: config mistakes in one line, and `AppCLI`'s hooks.

jsonargparse answers a wrong key with the whole usage and names neither the YAML file that set it nor, for a
syntax error, the file at all: here both are one line naming the key or FILE:LINE:COLUMN. A config file may
name the file it builds on (`base: base.yaml`), so a data set's YAML lists only what differs."""

from __future__ import annotations

import logging
import os
import re
import shlex
import signal
import sys
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, NoReturn

import yaml
from jsonargparse import Namespace, set_parsing_settings
from lightning.fabric.plugins.environments import SLURMEnvironment
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.fabric.utilities.rank_zero import rank_zero_only
from lightning.pytorch import Callback, LightningModule, Trainer
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningArgumentParser, LightningCLI
from lightning.pytorch.loggers import CSVLogger
from lightning.pytorch.utilities import rank_zero_info, rank_zero_warn
from lightning.pytorch.utilities.exceptions import SIGTERMException

from core.runtime.checkpoint import load_checkpoint, stale_last_checkpoint_warnings
from core.runtime.checkpoint_io import SafeCheckpointIO
from core.runtime.curves import plot_curves, read_metrics
from core.runtime.errors import InputError
from core.runtime.lock import OutputLock
from core.runtime.precision import cpu_precision_fallback
from core.runtime.resume import ExactResume
from core.runtime.signals import FILENAME as STOPPED_FILENAME
from core.runtime.signals import StopOnSignal, StopRequested, slurm_requeues
from core.runtime.summary import summary_callback
from core.runtime.threads import set_threads

BASE = "base"  # the key of a config file that names the file it builds on
# Model arguments that say how this process runs the network, not what it is: on resume or test the command line's
# value holds, not the checkpoint's (a run compiled on a GPU is tested eager on a CPU).
RUNTIME_HPARAMS = ("speed", "compile", "compile_backend")
RESUME_KEYWORDS = ("last", "hpc")  # `--ckpt_path` values with which Lightning resumes the run's own checkpoints
_KEY = re.compile(r"""(?:option|key) ["']([\w.]+)["']""", re.IGNORECASE)
_SUBCOMMAND = re.compile(r"^Subcommand '(\w+)'")


def _config_flags(args: Sequence[str]) -> Iterator[tuple[int, str]]:
    """(position of the flag, file) of each `--config FILE`, `--config=FILE` or `-c FILE` in `args`, in order."""
    for i, arg in enumerate(args):
        if arg in ("--config", "-c") and i + 1 < len(args):
            yield i, args[i + 1]
        elif arg.startswith("--config="):
            yield i, arg.removeprefix("--config=")


def config_files(args: Sequence[str]) -> list[str]:
    """The files given as `--config FILE`, `--config=FILE` or `-c FILE`, in order."""
    return [name for _, name in _config_flags(args)]


def read_yaml(name: str) -> Any:
    """The YAML in the file `name`; InputError naming FILE:LINE:COLUMN where it does not parse."""
    try:
        return yaml.safe_load(Path(name).read_text(encoding="utf-8"))
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{name}:{mark.line + 1}:{mark.column + 1}" if mark else name
        raise InputError(f"{where}: not valid YAML: {err.problem or err.context}") from None
    except (yaml.YAMLError, UnicodeDecodeError) as err:
        raise InputError(f"{name}: not a readable YAML file ({type(err).__name__})") from None


def config_chain(name: str) -> list[str]:
    """The config file `name` after the files it builds on: its `base: FILE` (relative to it), that one's, and so on.
    A missing `name` is left to jsonargparse, which names it."""
    chain = [name]
    while Path(chain[0]).is_file() and isinstance(node := read_yaml(chain[0]), dict) and BASE in node:
        base, here = node[BASE], chain[0]
        if not isinstance(base, str) or not base.strip():
            raise InputError(f"{here}: `{BASE}` must name a YAML file relative to it (`{BASE}: base.yaml`), "
                             f"got {base!r}")
        path = os.path.normpath(os.path.join(os.path.dirname(here), base))
        if not Path(path).is_file():
            raise InputError(f"{here}: `{BASE}: {base}`: no such file {path}; name a YAML file relative to {here}")
        if any(os.path.samefile(path, seen) for seen in chain):
            raise InputError(f"{here}: `{BASE}: {base}` comes back to a file of its own chain "
                             f"({' -> '.join([*reversed(chain), path])}); a base must not build on the files above it")
        chain.insert(0, path)
    return chain


def with_bases(args: Sequence[str]) -> list[str]:
    """`args` with each `--config FILE` preceded by a `--config` for every file FILE builds on (`config_chain`):
    jsonargparse merges successive `--config` files key by key, so a file changes only the keys it sets."""
    bases = {i: config_chain(name)[:-1] for i, name in _config_flags(args)}
    out: list[str] = []
    for i, arg in enumerate(args):
        out += [f for base in bases.get(i, ()) for f in ("--config", base)]
        out.append(arg)
    return out


def file_setting(files: Sequence[str], key: str) -> str | None:
    """The last of `files` whose YAML sets the dotted `key` (the one that wins), or None."""
    for name in reversed(files):
        try:
            node: Any = read_yaml(name)
        except (OSError, InputError):
            continue
        for part in key.split("."):
            node = node.get(part) if isinstance(node, dict) else None
        if node is not None:
            return name
    return None


class OneLineErrorParser(LightningArgumentParser):
    """A LightningCLI parser whose errors are one line: what is wrong, which key, which file, and where help is.
    `parse_args` remembers the arguments, to name the file or flag that set a bad key."""

    _argv: Sequence[str] = ()

    def parse_args(self, args: Sequence[str] | None = None, *rest: Any, **kwargs: Any) -> Any:
        self._argv = with_bases(sys.argv[1:] if args is None else args)
        return super().parse_args(self._argv, *rest, **kwargs)

    def dump(self, cfg: Namespace, *args: Any, **kwargs: Any) -> str:
        """The config without `base`: a dumped config (the run's config.yaml) holds every value itself."""
        if BASE in cfg:
            cfg = cfg.clone()
            del cfg[BASE]
        return super().dump(cfg, *args, **kwargs)

    def error(self, message: str, ex: Exception | None = None) -> NoReturn:
        if not self.exit_on_error:  # a parent parser handles it (subcommands) or the caller wants the exception
            super().error(message, ex)
        line = " ".join(message.split())
        key = _KEY.search(message)
        if key is not None:
            flag = f"--{key.group(1)}"
            if any(arg == flag or arg.startswith(f"{flag}=") for arg in self._argv):
                line += " (given on the command line)"
            elif (source := file_setting(config_files(self._argv), key.group(1))) is not None:
                line += f" (set in {source})"
        prog = self.prog.replace(" [options]", "")
        if sub := _SUBCOMMAND.search(message):  # raised by the main parser about a subcommand's key
            prog += f" {sub.group(1)}"
        self.exit(2, f"error: {line}; `{prog} --help` lists the accepted keys\n")


def checkpoints_last_first(callbacks: list) -> list:
    """`callbacks` with every unmonitored ModelCheckpoint (the every-epoch `last.ckpt`) before the monitored ones:
    both save at the same hook, in list order, so a kill between the saves leaves `last.ckpt` never behind."""
    ckpts = [cb for cb in callbacks if isinstance(cb, ModelCheckpoint)]
    ordered = iter(sorted(ckpts, key=lambda cb: cb.monitor is not None))  # stable: config order otherwise
    return [next(ordered) if isinstance(cb, ModelCheckpoint) else cb for cb in callbacks]


def _shown(path: Path) -> str:
    """`path` relative to the working folder when it lies under it (as the user typed it), else absolute."""
    path = Path(os.path.abspath(path))
    return str(path.relative_to(Path.cwd())) if path.is_relative_to(Path.cwd()) else str(path)


def resume_point(folder: Path) -> Path | None:
    """`stopped.ckpt` (a signal-stopped fit) where it is newer than `last.ckpt` (the last whole epoch), else
    `last.ckpt`; None without either."""
    stopped, last = folder / STOPPED_FILENAME, folder / "last.ckpt"
    if stopped.is_file() and (not last.is_file() or stopped.stat().st_mtime >= last.stat().st_mtime):
        return stopped
    return last if last.is_file() else None


def overwrite_refusal(folders: Iterable[str | Path], root: str | Path, ckpt_path: str | None) -> str | None:
    """Why a `fit` into the run folder `root` would replace an earlier fit's checkpoints in `folders`; else None.
    A `ckpt_path` under `root` or one of `folders`, or "last", resumes that run: replacing them is what was asked."""
    folders = [Path(f) for f in folders]
    if ckpt_path in RESUME_KEYWORDS:
        return None
    resumed = Path(os.path.realpath(ckpt_path)) if ckpt_path else None
    if resumed is not None and any(resumed.is_relative_to(os.path.realpath(f)) for f in [root, *folders]):
        return None
    for folder in folders:
        found = sorted(p.name for p in folder.glob("*.ckpt")) if folder.is_dir() else []
        if found:
            shown = ", ".join(found[:3]) + (f" and {len(found) - 3} more" if len(found) > 3 else "")
            latest = resume_point(folder)
            resume = f", resume it with --ckpt_path {_shown(latest)}" if latest is not None else ""
            return (f"{_shown(folder)} already holds {shown} from an earlier fit; to keep them, fit into another "
                    f"folder with --trainer.default_root_dir NEW_FOLDER{resume}, or pass --overwrite to replace them")
    return None


def without_ckpt_path(args: Sequence[str]) -> list[str]:
    """`args` without its `--ckpt_path FILE` or `--ckpt_path=FILE`."""
    out, rest = [], iter(args)
    for arg in rest:
        if arg == "--ckpt_path":
            next(rest, None)  # its value
        elif not arg.startswith("--ckpt_path="):
            out.append(arg)
    return out


def resume_command(program: str, args: Sequence[str], ckpt_path: str | Path) -> str:
    """The shell command that reruns `program` with `args`, resumed from `ckpt_path` (instead of any `--ckpt_path`)."""
    return shlex.join([*shlex.split(program), *without_ckpt_path(args), "--ckpt_path", _shown(Path(ckpt_path))])


class PlotCurves(Callback):
    """Draws each CSVLogger's metrics.csv to `curves.png` beside it when `fit` ends, on an error or Ctrl-C too,
    so a long run cut short still gets its curves (`core.runtime.curves`)."""

    def on_fit_end(self, trainer: Trainer, pl_module: LightningModule) -> None:
        self.draw(trainer)

    def on_exception(self, trainer: Trainer, pl_module: LightningModule, exception: BaseException) -> None:
        self.draw(trainer)

    def draw(self, trainer: Trainer) -> None:
        if not trainer.is_global_zero:
            return
        for logger in trainer.loggers:
            if not isinstance(logger, CSVLogger):
                continue
            try:
                logger.save()  # rows still buffered in the logger
                metrics = Path(logger.experiment.metrics_file_path)
                curves = read_metrics(metrics) if metrics.is_file() else {}
                if curves:
                    rank_zero_info(f"training curves: {plot_curves(curves, metrics.with_name('curves.png'))}")
            except (ValueError, OSError) as err:  # a finished fit must not fail on its plot
                rank_zero_warn(f"training curves not drawn: {err}; draw them later with python -m core.runtime.curves")


def metrics_table(metrics: dict[str, float], baseline: str = "", baseline_label: str = "baseline") -> str:
    """`test` / `validate` results as a table with 4 decimals: each model metric on one row, a baseline's value of
    the same metric (logged as `<split>_<baseline>_<name>`) beside it rather than sorted among the model's rows."""
    infix = f"_{baseline}_" if baseline else None
    rows = []
    for key, value in metrics.items():
        if not (infix and infix in key):
            other = metrics.get(key.replace("_", infix, 1)) if infix else None
            rows.append((key, f"{float(value):.4f}", "" if other is None else f"{float(other):.4f}"))
    rows += [(key, f"{float(value):.4f}", "") for key, value in metrics.items()  # baselines the model lacks: last
             if infix and infix in key and key.replace(infix, "_", 1) not in metrics]
    header = ("metric", "model", baseline_label) if any(r[2] for r in rows) else ("metric", "value")
    rows = [r[: len(header)] for r in rows]
    widths = [max(len(str(r[i])) for r in (header, *rows)) for i in range(len(header))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths, strict=True)))
             for r in (header, *rows)]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


class AppCLI(LightningCLI):
    """The LightningCLI hooks both apps share; warnings go to the logger named `log_name`."""

    log_name = "core"
    baseline = ""  # the infix of a baseline's logged metrics, shown beside the model's (`metrics_table`)
    baseline_label = "baseline"
    written_by = "python -m <app> fit"
    _run_lock: OutputLock | None = None

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        argv = sys.argv[1:] if kwargs.get("args") is None else kwargs["args"]
        self._named = argv[0] if isinstance(argv, list | tuple) and argv else None
        super().__init__(*args, **kwargs)

    def subcommands(self) -> dict[str, set[str]]:
        """Only the subcommand the command line starts with gets a parser (each costs a quarter second of every
        command's start); `--help`, a misspelt name or options before it get them all."""
        every = LightningCLI.subcommands()
        return {self._named: every[self._named]} if self._named in every else every

    def test(self, **kwargs: Any) -> list[dict[str, float]]:
        """`trainer.test` with our table instead of Lightning's (every digit, baselines sorted among the rows)."""
        return self._evaluate(self.trainer.test, kwargs)

    def validate(self, **kwargs: Any) -> list[dict[str, float]]:
        return self._evaluate(self.trainer.validate, kwargs)

    def _evaluate(self, run: Any, kwargs: dict[str, Any]) -> list[dict[str, float]]:
        verbose = kwargs.pop("verbose", True)
        results = run(**kwargs, verbose=False)
        if verbose and rank_zero_only.rank == 0:
            for metrics in results:
                print(metrics_table(metrics, self.baseline, self.baseline_label))
        return results

    def instantiate_trainer(self, **kwargs) -> Trainer:
        trainer = super().instantiate_trainer(**kwargs)
        if type(trainer.strategy.checkpoint_io) is TorchCheckpointIO:  # a user's own plugin stays
            trainer.strategy.checkpoint_io = SafeCheckpointIO(self.written_by)
        if not any(isinstance(cb, ExactResume) for cb in trainer.callbacks):
            trainer.callbacks.insert(0, ExactResume())
        if not any(isinstance(cb, StopOnSignal) for cb in trainer.callbacks):
            trainer.callbacks.append(StopOnSignal())  # last: the step's other callbacks have run when it saves
        trainer.callbacks[:] = checkpoints_last_first(trainer.callbacks)
        trainer.callbacks[:] = [summary_callback(cb) for cb in trainer.callbacks]  # no column of 0 FLOPs
        if not any(isinstance(cb, PlotCurves) for cb in trainer.callbacks):
            trainer.callbacks.append(PlotCurves())
        return trainer

    def init_parser(self, **kwargs: Any) -> LightningArgumentParser:
        # The configs write `${trainer.default_root_dir}` from the top of a config file, but omegaconf+ mode
        # (interpolation after the command line) resolves it under the subcommand (`fit.trainer...`): read
        # such paths as relative to where they stand. A process-wide jsonargparse setting; omegaconf+ only.
        set_parsing_settings(omegaconf_absolute_to_relative_paths=True)
        return super().init_parser(**kwargs)

    def add_default_arguments_to_parser(self, parser: LightningArgumentParser) -> None:
        super().add_default_arguments_to_parser(parser)
        parser.add_argument("--overwrite", type=bool, nargs="?", const=True, default=False,
                            help="fit only: write into a run folder whose checkpoints an earlier fit left, replacing "
                                 "them (without it that fit stops at once; resuming with --ckpt_path from that folder "
                                 "needs no --overwrite)")
        parser.add_argument(f"--{BASE}", type=str | None, default=None,
                            help="in a config file: the YAML it builds on, relative to it (`base: base.yaml`); "
                                 "that file is read first, and this one changes only the keys it sets")
        parser.add_argument("--threads", type=int | None, default=None,
                            help="torch threads (default: OMP_NUM_THREADS where set, else the CPUs this process may "
                                 "use: its affinity and the container's CPU quota, not the host's cores); 1 on a "
                                 "machine other jobs share")

    def before_instantiate_classes(self) -> None:
        config = self.config[self.subcommand] if self.subcommand else self.config
        try:
            threads = set_threads(config.get("threads"))
        except ValueError as err:
            raise InputError(str(err)) from None
        logging.getLogger(self.log_name).info(f"computing with {threads} torch thread{'s' * (threads != 1)}")
        fallback = cpu_precision_fallback(config.trainer.precision, config.trainer.accelerator)
        if fallback is not None:
            config.trainer.precision, reason = fallback
            logging.getLogger(self.log_name).warning(reason)  # shown by log_info_to_stderr

    def before_fit(self) -> None:
        for line in stale_last_checkpoint_warnings(self.trainer.callbacks):
            logging.getLogger(self.log_name).warning(line)
        config = self.config[self.subcommand]
        # Read, then cleared: config.yaml is saved from this namespace; a rerun of it must not inherit the permission.
        overwrite, config.overwrite = config.get("overwrite", False), False
        if rank_zero_only.rank == 0:  # DDP workers re-run this CLI; the launching process holds the lock
            root = Path(self.trainer.default_root_dir)
            root.mkdir(parents=True, exist_ok=True)
            self._run_lock = OutputLock(root, "fit").acquire()
            folders = [cb.dirpath for cb in self.trainer.checkpoint_callbacks  # None: Lightning versions it
                       if getattr(cb, "dirpath", None) and "://" not in str(cb.dirpath)]
            ckpt_path = config.get("ckpt_path")
            if ckpt_path is None and SLURMEnvironment.detect() and any(root.glob("hpc_ckpt_*.ckpt")):
                ckpt_path = "hpc"  # a requeued SLURM job: Lightning resumes from the checkpoint its requeue saved
            if not overwrite and (refusal := overwrite_refusal(folders, root, ckpt_path)):
                raise InputError(refusal)
            for folder in folders:  # temporaries of a killed save: no live writer owns them
                for tmp in Path(folder).glob(".*.ckpt.*.tmp"):
                    tmp.unlink(missing_ok=True)

    def _parse_ckpt_path(self) -> None:
        """LightningCLI's reading of `--ckpt_path`'s hyper-parameters, through `load_checkpoint` (Lightning's calls
        `torch.load` directly, so a refused file ended in a traceback), without the `RUNTIME_HPARAMS`."""
        if not self.config.get("subcommand"):
            return
        ckpt_path = self.config[self.config.subcommand].get("ckpt_path")
        if not ckpt_path or not Path(ckpt_path).is_file():
            return
        hparams = load_checkpoint(ckpt_path, self.written_by, mmap=True).get("hyper_parameters", {})  # weights unread
        upgrade = getattr(self.model_class, "upgrade_hparams", None)
        if upgrade is not None and isinstance(hparams, dict):
            hparams = upgrade(hparams)
        dropped = ("_instantiator", *RUNTIME_HPARAMS)
        hparams = {k: v for k, v in hparams.items() if k not in dropped} if isinstance(hparams, dict) else {}
        if not hparams:
            return
        if "_class_path" in hparams:
            hparams = {"class_path": hparams.pop("_class_path"), "dict_kwargs": hparams}
        self.config = self.parser.parse_object({self.config.subcommand: {"model": hparams}}, self.config)

    def parse_arguments(self, parser: LightningArgumentParser, args: Any) -> None:
        # The arguments as given, for the resume command a stopped fit prints.
        self._given_args = list(sys.argv[1:] if args is None else args) if not isinstance(args, dict) else []
        super().parse_arguments(parser, args)

    def _unsaved_stop_line(self, subcommand: str, program: str) -> str:
        args = getattr(self, "_given_args", [])
        last = [Path(cb.dirpath) / "last.ckpt" for cb in self.trainer.checkpoint_callbacks
                if getattr(cb, "dirpath", None) and (Path(cb.dirpath) / "last.ckpt").is_file()]
        then = (f"resume from the last whole epoch with: {resume_command(program, args, last[0])}" if last
                else f"rerun: {shlex.join([*shlex.split(program), *args])}")
        return f"{subcommand} stopped by SIGTERM outside a training step: no checkpoint saved; {then}"

    def _run_subcommand(self, subcommand: str) -> None:
        program = self.written_by.removesuffix(" fit")  # "python -m <app>"
        try:
            super()._run_subcommand(subcommand)
        except StopRequested as stop:  # StopOnSignal saved a checkpoint: say how to resume from it
            if rank_zero_only.rank == 0:
                resume = resume_command(program, getattr(self, "_given_args", []), stop.ckpt_path)
                print(f"fit stopped by {stop.signal_name} in epoch {stop.epoch} at step {stop.step}: saved "
                      f"{_shown(Path(stop.ckpt_path))}; resume with: {resume}", file=sys.stderr, flush=True)
            raise
        except SIGTERMException:  # Lightning's handler, whose exit status is 0: outside StopOnSignal's steps, or DDP
            if slurm_requeues(self.trainer):  # Lightning saved an hpc checkpoint and requeued the job
                raise
            if rank_zero_only.rank == 0:
                print(self._unsaved_stop_line(subcommand, program), file=sys.stderr, flush=True)
            raise SystemExit(128 + signal.SIGTERM) from None
        finally:  # also when fit fails: an in-process caller (tests, notebooks) may fit into the folder again
            if self._run_lock is not None:
                self._run_lock.release()
