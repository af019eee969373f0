"""Every program's `--help`, captured in-process (no child processes: the imports are paid once per run).

A program is named as it is typed: `python -m streamrec fit`, `python -m translate.infer`, or a script,
`python data/make_streamrec_demo.py`. Shared by tests/test_help_text.py and tests/test_docs_examples.py.
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import re
import runpy
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# `python -m PROG [SUBCOMMAND]` -> (the module whose main(argv) runs it, the subcommand's argv)
PROGRAMS: dict[str, tuple[str, list[str]]] = {
    **{f"python -m streamrec {sub}": ("streamrec.cli", [sub])
       for sub in ("fit", "validate", "test", "predict", "tune")},
    "python -m streamrec": ("streamrec.cli", []),
    **{f"python -m streamrec.{name}": (f"streamrec.{name}", []) for name in ("score", "explain", "serve", "export")},
    "python -m streamrec.shards": ("streamrec.shards", []),
    "python -m streamrec.shards merge": ("streamrec.shards", ["merge"]),
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
        return _captured(run)
    finally:
        sys.path[:] = saved
