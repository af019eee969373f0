"""`core`'s public names are imported on first use, from a static name -> module table.

The reference is the search the table replaced: each submodule in turn until one has the name.
"""

import ast
import importlib
import subprocess
import sys
from pathlib import Path

import pytest

import core

ROOT = Path(__file__).resolve().parents[2]
SEARCHED = ("attention", "blocks", "cpu_fastpath", "distributed", "explain", "kv_cache", "loss", "masks",
            "positions", "schedule", "stacks")


def searched(name: str) -> object:
    """What `from core import name` gave before the table: the first submodule's attribute of that name."""
    for module in SEARCHED:
        value = getattr(importlib.import_module(f"core.{module}"), name, None)
        if value is not None:
            return value
    raise AttributeError(name)


def type_checking_imports() -> dict[str, str]:
    """name -> module of the `if TYPE_CHECKING:` imports in core/__init__.py (what type checkers read)."""
    tree = ast.parse((ROOT / "core" / "__init__.py").read_text(encoding="utf-8"))
    block = next(node for node in tree.body if isinstance(node, ast.If) and ast.unparse(node.test) == "TYPE_CHECKING")
    return {alias.name: node.module.removeprefix("core.") for node in block.body for alias in node.names}


def test_the_table_lists_every_public_name_where_type_checkers_see_it() -> None:
    assert set(core._MODULE_OF) == set(core.__all__)
    assert core._MODULE_OF == type_checking_imports()


@pytest.mark.parametrize("name", core.__all__)
def test_every_public_name_resolves_to_what_the_search_gave(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from core import {name}", namespace)  # the statement users write
    assert namespace[name] is searched(name) is getattr(importlib.import_module(f"core.{core._MODULE_OF[name]}"), name)


def test_other_names_are_missing_and_submodules_still_import() -> None:
    with pytest.raises(AttributeError, match="^module 'core' has no attribute 'no_such_name'$"):
        core.no_such_name  # noqa: B018
    from core import precision

    assert precision.__name__ == "core.precision"


def test_core_and_core_errors_import_no_torch() -> None:
    code = ("import core.errors, sys; assert 'torch' not in sys.modules, 'core.errors'; "
            "import core; core.__all__; assert 'torch' not in sys.modules, 'core'")
    subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True)
