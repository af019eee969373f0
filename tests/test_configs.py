"""configs/: a data set's YAML, read after the base it names, sets up the run its full YAML set up before."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest
import yaml

from streamrec import tune
from streamrec.cli import main as streamrec_main
from streamrec.lightning_cli import build_cli
from translate.cli import main as translate_main
from translate.model.hparams import upgrade_hparams

REPO = Path(__file__).resolve().parents[1]
FULL = "b9a3532"  # the last commit whose data-set YAMLs each spelled out the whole trainer, logger and checkpoints
DATA_SETS = [("streamrec", "demo"), ("streamrec", "beauty"), ("streamrec", "ml1m"), ("streamrec", "seed_m4"),
             ("translate", "demo"), ("translate", "multi30k_en_de")]
MAINS = {"streamrec": streamrec_main, "translate": translate_main}
# Values changed on purpose since FULL (a recipe picked later), laid over the full YAML's before comparing.
CHANGED_SINCE_FULL = {
    ("streamrec", "beauty"): {"trainer": {"max_epochs": 50}, "early_stopping": 10,
                              "model": {"n_heads": 2, "dropout": 0.35, "attn_dropout": 0.2, "label_smoothing": 0.3,
                                        "contrastive_weight": 0.1, "second_pass_softmax": False,
                                        "weight_decay": 0.01}},
    ("streamrec", "ml1m"): {"trainer": {"max_epochs": 40}, "early_stopping": 10,
                            "model": {"d_model": 128, "n_layers": 3}},
}


def _full(app: str, name: str, tmp_path: Path) -> Path:
    """The data set's YAML as it stood at FULL, written to tmp_path."""
    try:
        text = subprocess.run(["git", "-C", str(REPO), "show", f"{FULL}:configs/{app}/{name}.yaml"],
                              capture_output=True, text=True, check=True).stdout
    except (OSError, subprocess.CalledProcessError):
        pytest.skip(f"needs the git history with commit {FULL}")
    path = tmp_path / f"{app}_{name}.yaml"
    path.write_text(text, encoding="utf-8")
    if app == "translate":  # its flat model keys of then, in today's option groups
        config = yaml.safe_load(text)
        config["model"] = upgrade_hparams(config.get("model") or {})
        path.write_text(yaml.safe_dump(config, sort_keys=False), encoding="utf-8")
    return path


def _printed(app: str, config: Path, capsys) -> dict:
    """Everything `fit` would run with (defaults included, `${...}` resolved), as `fit --print_config` shows it."""
    with pytest.raises(SystemExit) as exit_:
        MAINS[app](["fit", "--config", str(config), "--print_config"])
    assert exit_.value.code in (0, None)
    return yaml.safe_load(capsys.readouterr().out)


def _callbacks(config: Path, tiny_log: Path) -> list[str]:
    """The instantiated StreamRec trainer's callbacks with their settings, in a stable order."""
    cli = build_cli(["--config", str(config), "--data.path", str(tiny_log), "--data.format", "csv",
                     "--trainer.accelerator", "cpu", "--trainer.devices", "1"], run=False)
    def settings(cb) -> list:
        return sorted((k, v) for k, v in vars(cb).items() if v is None or isinstance(v, (str, int, float)))

    return sorted(f"{type(cb).__name__} {settings(cb)}" for cb in cli.trainer.callbacks)


@pytest.mark.parametrize(("app", "name"), DATA_SETS, ids=lambda x: x)
def test_a_data_set_on_its_base_is_the_full_yaml_it_replaced(app, name, tmp_path, capsys, tiny_log, monkeypatch):
    monkeypatch.chdir(tmp_path)
    full, new = _full(app, name, tmp_path), REPO / "configs" / app / f"{name}.yaml"
    assert "base" in yaml.safe_load(new.read_text(encoding="utf-8"))  # it does build on a base
    before, after = _printed(app, full, capsys), _printed(app, new, capsys)
    assert "base" not in after  # a printed or saved config holds every value itself
    changed = dict(CHANGED_SINCE_FULL.get((app, name), {}))
    if app == "streamrec":  # an EarlyStopping callback in the full YAML is `early_stopping: N` now, the CLI's option
        for config in (before, after):
            del config["trainer"]["callbacks"], config["early_stopping"]
        patience = changed.pop("early_stopping", None)
        full_callbacks = _callbacks(full, tiny_log)
        changed_callbacks = [re.sub(r"\('patience', \d+\)", f"('patience', {patience})", c)
                             if patience is not None and c.startswith("EarlyStopping ") else c for c in full_callbacks]
        assert changed_callbacks != full_callbacks or patience is None  # the patience did change
        assert changed_callbacks == _callbacks(new, tiny_log)
    for section, values in changed.items():
        assert all(before[section][k] != v for k, v in values.items())  # each change is still a change
        before[section].update(values)
    assert after == before


def test_tune_merges_the_base_into_best_yaml(tmp_path, capsys):
    beauty = REPO / "configs" / "streamrec" / "beauty.yaml"
    args = tune.parse_args(["--config", str(beauty), "--out", str(tmp_path)])
    assert args.config == (str(beauty.with_name("base.yaml")), str(beauty))
    best = tmp_path / "best.yaml"  # in another folder, as tune writes it: it must name no base
    best.write_text(tune.best_config(args.config, {}, "header"), encoding="utf-8")
    assert _printed("streamrec", best, capsys) == _printed("streamrec", beauty, capsys)


@pytest.mark.parametrize("app", sorted(MAINS))
@pytest.mark.parametrize(("base", "wrong"), [("no_such.yaml", "no such file"), ("a.yaml", "comes back"),
                                             ("[1]", "must name a YAML file")])
def test_a_wrong_base_is_one_line_naming_the_file_and_key(app, base, wrong, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a.yaml").write_text(f"base: {base}\ntrainer:\n  max_epochs: 1\n", encoding="utf-8")
    with pytest.raises(SystemExit) as exit_:
        MAINS[app](["fit", "--config", "a.yaml"])
    message = str(exit_.value.code)
    assert message.startswith("error: a.yaml: `base") and wrong in message and "\n" not in message
