"""Every program's `--help`, captured in-process (no child processes: the imports are paid once per run), and
whether a dotted name of ours (`core.nn.attention.MultiHeadAttention`) names something in the tree.

A program is named as it is typed: `python -m streamrec fit`, `python -m translate.infer`, or a script,
`python data/make_streamrec_demo.py`. Shared by tests/test_help_text.py and tests/test_docs_examples.py; and
what `fit --print_config` prints for a stack of configs, shared by tests/test_configs.py and tests/test_overlays.py.

The test files import it by name (tests/ on sys.path), so that one module, and one cache of each text, serves them
all; under `--import-mode=importlib` a file loaded by path would be a module of its own.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import importlib
import io
import os
import re
import runpy
import sys
from collections.abc import Iterator
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]

# `python -m PROG [SUBCOMMAND]` -> (the module whose main(argv) runs it, the subcommand's argv)
PROGRAMS: dict[str, tuple[str, list[str]]] = {
    **{f"python -m streamrec {sub}": ("streamrec.cli", [sub])
       for sub in ("fit", "validate", "test", "predict", "tune")},
    "python -m streamrec": ("streamrec.cli", []),
    **{f"python -m streamrec.{name}": (f"streamrec.{name}", []) for name in ("score", "explain", "serve", "export")},
    "python -m streamrec.shards": ("streamrec.shards", []),
    "python -m streamrec.shards merge": ("streamrec.shards", ["merge"]),
    "python -m translate.shards": ("translate.shards", []),
    "python -m translate.shards merge": ("translate.shards", ["merge"]),
    **{f"python -m translate {sub}": ("translate.cli", [sub]) for sub in ("fit", "validate", "test", "predict")},
    "python -m translate": ("translate.cli", []),
    **{f"python -m translate.{name}": (f"translate.{name}", []) for name in ("infer", "average", "serve", "export")},
    "python -m core.runtime.curves": ("core.runtime.curves", []),
}


def _captured(run) -> str:
    """What `run()` prints, and its exit; sys.argv holds no pytest arguments meanwhile (LightningCLI warns on them)."""
    out, saved = io.StringIO(), sys.argv
    sys.argv = saved[:1]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
        try:
            run()
        except SystemExit as exit_:
            assert exit_.code in (0, None), f"--help exited with {exit_.code}:\n{out.getvalue()}"
        finally:
            sys.argv = saved
    return out.getvalue()


@functools.cache
def help_text(program: str) -> str:
    """The `--help` output of `program`: a key of PROGRAMS, or `python PATH.py` for a script of the repository.

    For a LightningCLI program, the help of each `--model.GROUP` option group follows the main help.
    """
    if program in PROGRAMS:
        module, argv = PROGRAMS[program]
        main = importlib.import_module(module).main
        text = _captured(lambda: main([*argv, "--help"]))
        # An option group typed by a class (`--model.objective`) lists its fields in its own help only.
        groups = re.findall(r"(--model\.\w+)\.help \[CLASS_PATH_OR_NAME\]\s+Show the help for the given subclass of\s+"
                            r"(\w+)", text)
        return "\n".join([text, *(_captured(lambda g=g, c=c: main([*argv, f"{g}.help", c])) for g, c in groups)])
    script = REPO / program.removeprefix("python ").strip()
    saved = sys.path[:]
    sys.path[:0] = [str(script.parent)]  # as `python PATH.py` sets it

    def run() -> None:
        sys.argv = [str(script), "--help"]
        runpy.run_path(str(script), run_name="__main__")

    try:
        with _in_this_process(script):
            return _captured(run)
    finally:
        sys.path[:] = saved


@contextlib.contextmanager
def _in_this_process(script: Path) -> Iterator[None]:
    """A benchmark re-runs itself (`os.execv`) in its peer venv where one exists, which would replace the test
    process: its options are its own argparse's in either venv, so the re-run is skipped, and any other exec
    fails the test instead."""
    def refused(path: str, *args: object) -> None:
        raise AssertionError(f"`{script.name} --help` tried to replace the test process with {path}")

    common = importlib.import_module("_common") if (script.parent / "_common.py").is_file() else None
    saved = os.execv, os.execve, os.execvp
    peer = getattr(common, "ensure_peer_venv", None)
    os.execv = os.execve = os.execvp = refused
    if peer is not None:
        common.ensure_peer_venv = lambda *args, **kwargs: None
    try:
        yield
    finally:
        os.execv, os.execve, os.execvp = saved
        if peer is not None:
            common.ensure_peer_venv = peer


@functools.cache
def _print_config(app: str, configs: tuple[str, ...]) -> str:
    main = importlib.import_module(f"{app}.cli").main
    out, saved = io.StringIO(), sys.argv
    sys.argv = saved[:1]
    try:
        with contextlib.redirect_stdout(out):
            main(["fit", *(arg for c in configs for arg in ("--config", c)), "--print_config"])
    except SystemExit as exit_:
        assert exit_.code in (0, None), f"--print_config exited with {exit_.code}"
    finally:
        sys.argv = saved
    return out.getvalue()


def printed_config(app: str, configs: list[Path]) -> dict:
    """Everything `python -m APP fit` would run with for `--config` each of `configs` in turn (defaults included,
    `${...}` resolved), as `fit --print_config` shows it; a fresh dict on each call, for the caller to change."""
    return yaml.safe_load(_print_config(app, tuple(str(c) for c in configs)))


DOTTED = re.compile(r"(?<![\w./-])((?:core|streamrec|translate)(?:\.[A-Za-z_]\w*)+)")  # `core.nn.masks`
NOT_PYTHON = {"streamrec.provenance"}  # the Parquet metadata key of streamrec.score's outputs


def defined_names(path: Path) -> dict[str, str | None]:
    """The names bound at the top of a module (and `Class.method`), each mapped to where an import took it from
    (`Recommender` -> `streamrec.api.Recommender`), or None for a name the module defines itself."""
    names: dict[str, str | None] = {}
    body = list(ast.parse(path.read_text(encoding="utf-8")).body)
    for node in body:
        if isinstance(node, ast.If):  # `if TYPE_CHECKING:` names a lazily imported one (`streamrec.Recommender`)
            body.extend(node.body)
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names[node.name] = None
            if isinstance(node, ast.ClassDef):
                names.update({f"{node.name}.{n.name}": None for n in node.body
                              if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))})
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names.update({n.id: None for n in ast.walk(target) if isinstance(n, ast.Name)})
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.update({a.asname or a.name: f"{node.module}.{a.name}" for a in node.names})
        elif isinstance(node, ast.Import):
            names.update({(a.asname or a.name).split(".")[0]: None for a in node.names})
    return names


@functools.cache
def missing_name(dotted: str) -> str | None:
    """Why `dotted` names nothing in the tree, or None when it names a module, or a name in one (a name a module
    imports is followed to its source: `streamrec.Recommender.load` is `streamrec.api.Recommender.load`)."""
    if dotted in NOT_PYTHON:
        return None
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        base = REPO.joinpath(*parts[:cut])
        module = base / "__init__.py" if base.is_dir() else base.with_suffix(".py")
        if module.is_file():
            rest = parts[cut:]
            names = defined_names(module)
            if not rest or ".".join(rest) in names or rest[0] in ("py", "md"):
                return None
            source = names.get(rest[0])
            if source and source.split(".")[0] in ("core", "streamrec", "translate") and len(rest) > 1:
                return missing_name(".".join([source, *rest[1:]]))
            return f"`{'.'.join(parts[:cut])}` has no `{'.'.join(rest)}`"
    return f"no module `{parts[0]}`"
