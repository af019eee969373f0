"""The package layout's import rules, read from the source (imports inside functions included).

Imports point down only:

    programs -> LightningModules (`<app>/model/module.py`) -> `ranking/` and `search/`
             -> the rest of `model/` (networks, losses, metrics) -> `data/` -> `core`

- `core.nn` is pure PyTorch: it imports nothing from `core.runtime`, the apps, Lightning or LitServe.
- `core` never imports an app; `streamrec` and `translate` never import each other.
- In each app a module imports only from its own layer or the layers below it: `ranking/` and `search/` never
  import `<app>.model.module`; the files of `model/` other than `module.py` never import `ranking/` or
  `search/`; `data/` imports no other part of its app; no layer below the programs imports a program (the
  app's top-level modules: CLIs, API, servers, exports, and the package itself, which re-exports the API).
- No import cycle between any two modules.
- The programs that use a trained model (scoring, serving, translating, averaging) never reach Lightning.
The reference is a plain AST walk over every file, independent of how the packages import at run time.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("core", "streamrec", "translate")
APPS = ("streamrec", "translate")

# An app's layers, bottom up; a module may import its own layer and the ones below it.
LAYERS = ("data", "model", "ranking/search", "module", "program")


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path) -> set[str]:
    """Every module of ours (and Lightning, LitServe) that `path` names in an import statement, at any depth."""
    found = set()
    package = module_name(path).split(".")
    if path.name != "__init__.py":
        package = package[:-1]
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - node.level + 1] if node.level else []  # `from ..x import y`
            module = ".".join([*base, *([node.module] if node.module else [])])
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)
    return {name for name in found if name.split(".")[0] in (*PACKAGES, "lightning", "litserve")}


GRAPH = {module_name(p): imports(p) for pkg in PACKAGES for p in (ROOT / pkg).rglob("*.py")}


def violations(rule) -> list[str]:
    return sorted(f"{src} imports {dst}" for src, targets in GRAPH.items() for dst in targets if rule(src, dst))


def layer(name: str) -> str | None:
    """The app layer of a dotted name (a module, or a name imported from one); None outside the apps.

    `streamrec.model.module.StreamRecModule` is in "module", `translate.search.decoding` in "ranking/search",
    `streamrec.model.network` in "model", `streamrec.cli` and `streamrec` itself in "program".
    """
    parts = name.split(".")
    if parts[0] not in APPS:
        return None
    if len(parts) == 1 or parts[1] not in ("data", "model", "ranking", "search"):
        return "program"
    if parts[1] == "model":
        return "module" if parts[2:3] == ["module"] else "model"
    return "ranking/search" if parts[1] in ("ranking", "search") else "data"


def upward(src: str, dst: str) -> bool:
    """True when `src` imports a module of its own app from a higher layer than its own."""
    if layer(src) is None or src.split(".")[0] != dst.split(".")[0]:
        return False
    return LAYERS.index(layer(dst)) > LAYERS.index(layer(src))


def test_the_layers_of_the_apps() -> None:
    assert [layer(n) for n in ("streamrec", "streamrec.cli", "translate.infer", "streamrec.model.module",
                               "translate.model.module.TranslationModule", "streamrec.ranking.topk",
                               "translate.search.decoding", "streamrec.model", "streamrec.model.network",
                               "translate.model.transformer", "streamrec.data.vocab", "core.nn.masks")] == [
        "program", "program", "program", "module", "module", "ranking/search", "ranking/search", "model", "model",
        "model", "data", None]


def test_the_layer_rule_finds_a_planted_upward_import() -> None:
    planted = [("streamrec.ranking.topk", "streamrec.model.module"),        # ranking above the LightningModule
               ("translate.model.transformer", "translate.search.decoding"),  # the network above search
               ("streamrec.data.vocab", "streamrec.model.network"),         # data is the bottom of the app
               ("translate.model.module", "translate.infer")]               # a LightningModule under a program
    allowed = [("streamrec.model.module", "streamrec.ranking.batch"), ("translate.model.module", "translate.search"),
               ("streamrec.ranking.batch", "streamrec.model.network"), ("streamrec.cli", "streamrec.model.module"),
               ("streamrec.model.losses", "streamrec.data.constants"), ("streamrec.data.readers", "core.runtime"),
               ("streamrec.model.module", "translate.model.module")]          # crossing apps: its own test
    assert [upward(s, d) for s, d in planted] == [True] * len(planted)
    assert [upward(s, d) for s, d in allowed] == [False] * len(allowed)


def test_imports_point_down_the_layers_of_each_app() -> None:
    assert not violations(upward), "imports that point up (programs -> module.py -> ranking/search -> model -> data)"


def test_core_nn_is_pure_pytorch() -> None:
    assert not violations(lambda s, d: s.startswith("core.nn") and not d.startswith("core.nn"))


def test_core_imports_no_app_and_the_apps_not_each_other() -> None:
    def crosses(src: str, dst: str) -> bool:
        a, b = src.split(".")[0], dst.split(".")[0]
        return a != b and b in PACKAGES and b != "core"

    assert not violations(crosses)


def strongly_connected(edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of two or more modules: the import cycles."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles: list[list[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in edges[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = stack[stack.index(v):]
            del stack[stack.index(v):]
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in edges:
        if v not in index:
            visit(v)
    return cycles


def test_the_cycle_finder_finds_a_planted_cycle() -> None:
    assert strongly_connected({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_no_import_cycles() -> None:
    edges = {src: {d for d in targets if d in GRAPH and d != src} for src, targets in GRAPH.items()}
    assert strongly_connected(edges) == []


@pytest.fixture(scope="module")
def imported_by_core() -> dict[str, list[str]]:
    """In one fresh interpreter: the modules loaded after `import core, core.runtime.errors`, then after
    `import core.nn` (the second import adds to what the first loaded)."""
    code = ("import json, sys; import core, core.runtime.errors; first = sorted(sys.modules); import core.nn; "
            "print(json.dumps({'core.runtime.errors': first, 'core.nn': sorted(sys.modules)}))")
    run = subprocess.run([sys.executable, "-c", code], cwd=ROOT, check=True, capture_output=True, text=True)
    return json.loads(run.stdout.splitlines()[-1])


def test_core_and_core_runtime_errors_import_no_torch(imported_by_core) -> None:
    assert "core.runtime.errors" in imported_by_core["core.runtime.errors"]
    assert "torch" not in imported_by_core["core.runtime.errors"]


def test_core_nn_imports_no_lightning(imported_by_core) -> None:
    loaded = imported_by_core["core.nn"]
    assert "core.nn" in loaded and "torch" in loaded
    bad = [m for m in loaded if m.split(".")[0] in ("lightning", "pytorch_lightning", "litserve")]
    assert not bad, bad


# The programs that use a trained model: they load the network alone, not the LightningModule that trained it.
INFERENCE = ("streamrec.api", "streamrec.score", "streamrec.ray_engine", "streamrec.serve", "translate.api",
             "translate.infer", "translate.serve", "translate.average")


def reached(start: str) -> set[str]:
    """Every module `start` may import, at any depth (imports inside functions included), parent packages too."""
    seen, todo = set(), [start]
    while todo:
        name = todo.pop()
        if name in seen:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in GRAPH)
        todo.extend(dst for dst in GRAPH.get(name, ()) if dst in GRAPH or dst.split(".")[0] == "lightning")
    return seen


@pytest.mark.parametrize("program", INFERENCE)
def test_inference_programs_never_import_lightning(program: str) -> None:
    lightning = sorted(m for m in reached(program) if m.split(".")[0] == "lightning")
    assert not lightning, f"{program} reaches {lightning[:3]}"
    assert "lightning" in {m.split(".")[0] for m in reached("streamrec.model.module")}  # the walk does find it
