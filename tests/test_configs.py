"""configs/: a data set's YAML is read after the base it names, and changes only the keys it sets."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from streamrec.cli import main as streamrec_main
from translate.cli import main as translate_main

sys.path.insert(0, str(Path(__file__).parent))
import program_help  # noqa: E402 (by name: tests/test_overlays.py prints the same data sets' configs)

REPO = Path(__file__).resolve().parents[1]
DATA_SETS = [("streamrec", "demo"), ("streamrec", "beauty"), ("streamrec", "ml1m"), ("streamrec", "seed_m4"),
             ("translate", "demo"), ("translate", "multi30k_en_de")]
MAINS = {"streamrec": streamrec_main, "translate": translate_main}


def _leaves(tree: object, prefix: tuple = ()) -> dict[tuple, object]:
    """A YAML mapping's scalar and list values by key path (`${...}` strings and the `base` key left out)."""
    if not isinstance(tree, dict):
        return {} if isinstance(tree, str) and "${" in tree else {prefix: tree}
    return {path: value for key, sub in tree.items() if key != "base"
            for path, value in _leaves(sub, (*prefix, key)).items()}


def _at(tree: dict, path: tuple) -> object:
    for key in path:
        tree = tree[key]
    return tree


@pytest.mark.parametrize(("app", "name"), DATA_SETS, ids=lambda x: x)
def test_a_data_set_reads_its_base_first_and_changes_only_its_own_keys(app, name, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    data_set = REPO / "configs" / app / f"{name}.yaml"
    own = yaml.safe_load(data_set.read_text(encoding="utf-8"))
    base = yaml.safe_load((data_set.parent / own["base"]).read_text(encoding="utf-8"))
    printed = program_help.printed_config(app, [data_set])
    assert "base" not in printed  # a printed or saved config holds every value itself
    own_leaves = _leaves(own)
    checked = [(path, value) for path, value in own_leaves.items()]  # the data set's own values hold ...
    checked += [(path, value) for path, value in _leaves(base).items() if path not in own_leaves]  # ... and the base's
    for path, value in checked:
        if any(str(key).endswith("+") for key in path):  # `callbacks+:` appends to the base's list
            continue
        if isinstance(value, list) and any(isinstance(v, dict) for v in value):  # loggers, callbacks: by class
            want = [v["class_path"] if isinstance(v, dict) else v for v in value]
            got = [v["class_path"] if isinstance(v, dict) else v for v in _at(printed, path)]
            want, got = [w.rsplit(".", 1)[-1] for w in want], [g.rsplit(".", 1)[-1] for g in got]
            assert got[: len(want)] == want, ".".join(path)  # a data set's `callbacks+:` comes after
        else:
            assert _at(printed, path) == value, ".".join(map(str, path))


# Every wrong base for one app; the other reads its bases with the same code (core.runtime.cli), so one case
# checks that it does.
@pytest.mark.parametrize(("app", "base", "wrong"), [
    ("streamrec", "no_such.yaml", "no such file"), ("streamrec", "a.yaml", "comes back"),
    ("streamrec", "[1]", "must name a YAML file"), ("translate", "a.yaml", "comes back")])
def test_a_wrong_base_is_one_line_naming_the_file_and_key(app, base, wrong, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text(f"base: {base}\ntrainer:\n  max_epochs: 1\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        MAINS[app](["fit", "--config", "a.yaml"])
    message = str(exit_.value.code)
    assert message.startswith("error: a.yaml: `base") and wrong in message and "\n" not in message
