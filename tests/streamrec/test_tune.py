"""`python -m streamrec tune`: validation only, resumable, a config `fit` takes, one-line refusals."""

from __future__ import annotations

import csv
import functools
import shutil
from pathlib import Path

import lightning
import optuna
import pytest
import yaml

from streamrec.cli import main
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.lightning_cli import build_cli
from streamrec.model.module import StreamRecModule
from streamrec.tuning.options import Budget
from streamrec.tuning.report import best_config, trials_figure
from streamrec.tuning.space import SPACE, config_value

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

BASE = """\
seed_everything: 0
trainer:
  max_epochs: 3
  accelerator: cpu
  logger: false
  enable_progress_bar: false
data:
  path: {path}
  max_len: 8
  batch_size: 32
model:
  d_model: 16
  n_heads: 2
  n_layers: 1
  d_ff: 32
  evaluation:
    popularity_baseline: false
"""
FAST = ["--max-epochs", "1", "--startup-trials", "2", "--params", "lr", "dropout", "weight_decay", "loss"]


def _config(tmp_path: Path, log: Path, name: str = "base.yaml") -> Path:
    path = tmp_path / name
    path.write_text(BASE.format(path=log))
    return path


def _trials(out: Path) -> list[dict[str, str]]:
    with (out / "trials.csv").open() as f:
        return list(csv.DictReader(f))


def _rotate_test_items(log: Path, out: Path) -> Path:
    """The same log with every user's last item (the leave-one-out test target) taken from the next user.

    The item multiset, every training history and every validation case stay as they are.
    """
    with log.open() as f:
        rows = list(csv.DictReader(f))
    last = {}
    for i, row in enumerate(rows):
        if row["user_id"] not in last or float(row["timestamp"]) >= float(rows[last[row["user_id"]]]["timestamp"]):
            last[row["user_id"]] = i
    index = list(last.values())
    items = [rows[i]["item_id"] for i in index]
    for i, item in zip(index, items[1:] + items[:1], strict=True):
        rows[i]["item_id"] = item
    with out.open("w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    return out


def _refuse_test_loader(self):
    raise AssertionError("tune built the test loader")


@pytest.fixture(scope="module")
def searched(tiny_log, tmp_path_factory) -> Path:
    """The OUT folder of a two-trial search of the base config (FAST) during which building the test loader
    fails; tests search on in a copy of it. A study is known by its config's text, not its path
    (`TuneOptions.fingerprint`), so `_config(tmp_path, tiny_log)` anywhere continues it."""
    root = tmp_path_factory.mktemp("searched")
    with pytest.MonkeyPatch.context() as m:
        m.setattr(StreamRecDataModule, "test_dataloader", _refuse_test_loader)
        main(["tune", "--config", str(_config(root, tiny_log)), "--budget", "2", "--out", str(root / "search"),
              *FAST])
    return root / "search"


def _copy(searched: Path, tmp_path: Path) -> Path:
    return shutil.copytree(searched, tmp_path / "search")


def test_tune_never_reads_the_test_split(tiny_log, searched, tmp_path, monkeypatch):
    """Another test split (every user's last item swapped) gives the same trials; the test loader is never built
    (neither here nor in the `searched` run)."""
    other = _rotate_test_items(tiny_log, tmp_path / "other_tests.csv")
    a, b = StreamRecDataModule(str(tiny_log)), StreamRecDataModule(str(other))
    assert [c.target for c in a.splits.test] != [c.target for c in b.splits.test]
    assert [list(c.history) for c in a.splits.valid] == [list(c.history) for c in b.splits.valid]

    monkeypatch.setattr(StreamRecDataModule, "test_dataloader", _refuse_test_loader)
    main(["tune", "--config", str(_config(tmp_path, other, "b.yaml")), "--budget", "2", "--out",
          str(tmp_path / "b"), *FAST])
    trials_a, trials_b = _trials(searched), _trials(tmp_path / "b")
    assert len(trials_a) == 2
    drop = ("minutes",)
    assert [{k: v for k, v in t.items() if k not in drop} for t in trials_a] == \
        [{k: v for k, v in t.items() if k not in drop} for t in trials_b]


def test_best_yaml_is_the_best_trial_and_fit_takes_it(tiny_log, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    out = tmp_path / "search"
    # The config names a log that is not there; the command line gives the real one (both forms of an override),
    # as a user tuning another data set with a shipped config does: best.yaml must carry them.
    config = _config(tmp_path, tmp_path / "not_here.csv")
    main(["tune", "--config", str(config), "--data.path", str(tiny_log), "--model.d_ff=24", "--budget", "2",
          "--out", str(out), *FAST])
    rows = [r for r in _trials(out) if r["state"] == "complete"]
    best = max(rows, key=lambda r: float(r["val_ndcg@10"]))
    text = (out / "best.yaml").read_text()
    assert "test split was not read" in text
    # Only what differs from fit's defaults, groups as configs write them; the epochs the trials ran (--max-epochs)
    written = yaml.safe_load(text)
    assert "class_path" not in text and "init_args" not in text
    assert written["trainer"] == {"max_epochs": 1, "accelerator": "cpu", "logger": False,
                                  "enable_progress_bar": False}
    assert written["model"].get("objective") == (None if best["loss"] == "full" else {"loss": best["loss"]})
    assert written["model"]["evaluation"] == {"popularity_baseline": False}
    assert (out / "trials.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    cli = main(["fit", "--config", str(out / "best.yaml"), "--trainer.fast_dev_run", "true"])
    hp = cli.model.hparams
    assert hp.lr == pytest.approx(float(best["lr"])) and hp.dropout == pytest.approx(float(best["dropout"]))
    assert hp.objective["loss"] == best["loss"]
    assert hp.d_model == 16 and cli.datamodule.max_len == 8  # the rest: the user's
    assert cli.datamodule.path == str(tiny_log) and hp.d_ff == 24  # and the command line's
    # The best trial's weights are kept: validating them gives the value the study recorded; no other trial's are.
    assert not (out / "trials").exists() or not any((out / "trials").iterdir())
    cli = main(["validate", "--config", str(out / "best.yaml"), "--ckpt_path", str(out / "best.ckpt")])
    assert float(cli.trainer.callback_metrics["val_ndcg@10"]) == pytest.approx(float(best["val_ndcg@10"]), abs=1e-4)


def test_best_config_is_fits_config_with_the_overrides_and_the_winning_values(tiny_log, tmp_path):
    """best.yaml is what fit's parser reads from the trials' command line plus the winner: bases, typed values."""
    (tmp_path / "base.yaml").write_text("trainer:\n  max_epochs: 3\nmodel:\n  lr: 0.1\n  d_model: 16\n")
    config = tmp_path / "data.yaml"
    config.write_text(f"base: base.yaml\ndata:\n  path: {tiny_log}\n")
    args = ["--config", str(config), "--trainer.precision=bf16-mixed", "--trainer.max_time", "00:00:08:00",
            "--model.weight_decay", "1e-4", "--trainer.logger", "false", "--seed_everything", "7"]
    parser = build_cli(["--config", str(config)], run=False).parser
    text = best_config(parser, args, {"dropout": 0.25, "loss": "gbce", "max_len": 20}, "header\nsecond")
    assert text.startswith("# header\n# second\n")
    assert "base" not in yaml.safe_load(text)  # the bases are read into it
    written = tmp_path / "best.yaml"
    written.write_text(text)
    parsed = parser.parse_args(["--config", str(written)])
    expected = {"trainer.max_epochs": 3, "trainer.precision": "bf16-mixed", "trainer.max_time": "00:00:08:00",
                "trainer.logger": False, "seed_everything": 7, "data.path": str(tiny_log), "model.lr": 0.1,
                "model.d_model": 16, "model.weight_decay": 1e-4, "model.dropout": 0.25,
                "model.objective.loss": "gbce", "data.max_len": 20}
    assert {key: config_value(parsed, key) for key in expected} == expected


def test_every_searched_parameter_names_a_key_fit_takes(tiny_log, tmp_path):
    parser = build_cli(["--config", str(_config(tmp_path, tiny_log))], run=False).parser
    config = parser.parse_args(["--config", str(_config(tmp_path, tiny_log))])
    assert all(config_value(config, param.key) is not None for param in SPACE.values())


def test_an_interrupted_search_resumes_and_reruns_the_cut_off_trial(tiny_log, searched, tmp_path):
    config, out = str(_config(tmp_path, tiny_log)), _copy(searched, tmp_path)
    first = _trials(out)
    study = optuna.load_study(study_name="streamrec", storage=f"sqlite:///{out / 'study.db'}")
    cut = study.ask({"lr": optuna.distributions.FloatDistribution(1e-4, 3e-2, log=True)})  # left RUNNING, as by kill
    cut_lr = cut.params["lr"]
    main(["tune", "--config", config, "--budget", "3", "--out", str(out), *FAST])
    rows = _trials(out)
    assert len(first) == 2 and len(rows) == 3 and rows[:2] == first  # finished trials are kept, not rerun
    study = optuna.load_study(study_name="streamrec", storage=f"sqlite:///{out / 'study.db'}")
    assert study.trials[cut.number].state == optuna.trial.TrialState.FAIL
    assert study.trials[cut.number + 1].params["lr"] == pytest.approx(cut_lr)  # run again first
    main(["tune", "--config", config, "--budget", "3", "--out", str(out), *FAST])  # budget already met
    assert len(_trials(out)) == 3


def test_a_resumed_search_proposes_new_trials(tiny_log, tmp_path):
    """A seeded sampler rebuilt on resume must not replay the first run's proposals (and their scores)."""
    config, out = str(_config(tmp_path, tiny_log)), tmp_path / "search"
    fast = ["--max-epochs", "1", "--startup-trials", "5", "--params", "lr", "dropout"]  # all random proposals
    main(["tune", "--config", config, "--budget", "2", "--out", str(out), *fast])  # the config's, one drawn
    main(["tune", "--config", config, "--budget", "3", "--out", str(out), *fast])  # drawn again from the seed
    proposals = [(r["lr"], r["dropout"]) for r in _trials(out)]
    assert len(proposals) == 3 and len(set(proposals)) == 3, proposals


def test_trials_png_numbers_trials_with_integer_ticks():
    rows = [{"trial": n, "state": "complete", "val_ndcg@10": 0.1 * n, "lr": 1e-3} for n in range(3)]
    ax = trials_figure(rows).axes[0]
    ticks = [t for t in ax.get_xticks() if ax.get_xlim()[0] <= t <= ax.get_xlim()[1]]
    assert ticks and all(float(t).is_integer() for t in ticks), ticks


def test_a_trial_that_raises_leaves_no_weights_behind(tiny_log, tmp_path, monkeypatch):
    """Optuna calls no callback for a failed trial: its folder (weights of its best epoch so far) must go too."""
    out, seen = tmp_path / "search", []
    real = StreamRecModule.training_step

    def fails_in_epoch_two(self, *args, **kwargs):
        if self.current_epoch == 1:
            seen.append((out / "trials" / "0" / "best.ckpt").is_file())  # epoch 1's weights were written
            raise RuntimeError("boom in epoch 2")
        return real(self, *args, **kwargs)

    monkeypatch.setattr(StreamRecModule, "training_step", fails_in_epoch_two)
    with pytest.raises(RuntimeError, match="boom in epoch 2"):  # the error still propagates
        main(["tune", "--config", str(_config(tmp_path, tiny_log)), "--budget", "2", "--out", str(out), *FAST,
              "--max-epochs", "2"])
    assert seen == [True]
    assert not (out / "trials" / "0").exists()
    assert _study_trials(out)[0].state == optuna.trial.TrialState.FAIL


def test_a_study_with_other_settings_is_refused_in_one_line(tiny_log, searched, tmp_path):
    config, out = str(_config(tmp_path, tiny_log)), _copy(searched, tmp_path)
    with pytest.raises(SystemExit, match=r"^error: .*study\.db holds a search with other settings.*another --out"):
        main(["tune", "--config", config, "--budget", "3", "--out", str(out), *FAST, "--patience", "3"])
    assert len(_trials(out)) == 2  # nothing ran


@pytest.mark.parametrize(("args", "message"), [
    (["--model.d_modle", "8"], "d_modle"),
    (["--bogus"], "unknown option --bogus"),
    (["--model.evaluation.ks", "[5]"], "keep 10 in model.evaluation.ks"),
])
def test_bad_options_fail_before_any_trial(tiny_log, tmp_path, capsys, args, message):
    out = tmp_path / "search"
    with pytest.raises(SystemExit) as exit_:
        main(["tune", "--config", str(_config(tmp_path, tiny_log)), "--out", str(out), *FAST, *args])
    said = f"{exit_.value.code}\n{capsys.readouterr().err}"  # sys.exit("error: ...") or the parser's stderr
    assert exit_.value.code != 0 and message in said
    assert not (out / "study.db").exists() or not _study_trials(out)


def _study_trials(out: Path) -> list:
    return optuna.load_study(study_name="streamrec", storage=f"sqlite:///{out / 'study.db'}").trials


@pytest.mark.parametrize(("text", "trials", "seconds"), [("30", 30, None), ("45m", None, 2700), ("2h", None, 7200),
                                                         ("90s", None, 90)])
def test_budget_in_trials_or_time(text, trials, seconds):
    assert Budget.parse(text) == Budget(trials, seconds)


@pytest.mark.parametrize("text", ["0", "1.5", "ten", "-3", "5d"])
def test_bad_budget_is_refused(text):
    with pytest.raises(Exception, match="number of trials|whole number"):
        Budget.parse(text)


def test_the_first_trial_is_the_config_and_max_time_caps_every_trial(tiny_log, tmp_path, monkeypatch):
    caps = []
    real = lightning.Trainer.__init__

    @functools.wraps(real)  # the CLI reads the Trainer's options from this signature
    def spy(self, *args, **kwargs):
        if kwargs.get("enable_model_summary") is False:  # a trial's trainer (the CLI's keep the config's)
            caps.append(kwargs.get("max_time"))
        real(self, *args, **kwargs)

    monkeypatch.setattr(lightning.Trainer, "__init__", spy)
    config = tmp_path / "start.yaml"
    text = BASE.format(path=tiny_log).replace("trainer:\n", 'trainer:\n  max_time: "00:00:10:00"\n')
    config.write_text(text + "  lr: 0.004\n  dropout: 0.35\n  objective:\n    loss: full\n"
                      "  weight_decay: 0.0\n")  # weight decay 0 lies outside the log-scale space
    out = tmp_path / "search"
    main(["tune", "--config", str(config), "--budget", "2", "--out", str(out), *FAST])
    first, second = _trials(out)
    assert float(first["lr"]) == pytest.approx(0.004) and float(first["dropout"]) == pytest.approx(0.35)
    assert first["loss"] == "full" and 1e-4 <= float(first["weight_decay"]) <= 1.0  # sampled
    assert float(second["lr"]) != pytest.approx(0.004)
    assert caps == ["00:00:10:00"] * 2


@pytest.mark.parametrize("term", ["contrastive:\n    weight: 0.1", "objective:\n    label_smoothing: 0.3"])
def test_a_config_with_a_full_softmax_term_keeps_its_loss(tiny_log, tmp_path, capsys, term):
    """Both terms need the full softmax: searching the loss would fail every trial that proposes gbce."""
    config = tmp_path / "term.yaml"
    config.write_text(BASE.format(path=tiny_log) + f"  {term}\n")
    out = tmp_path / "search"
    main(["tune", "--config", str(config), "--budget", "2", "--out", str(out), *FAST])
    rows = _trials(out)
    assert len(rows) == 2 and all("loss" not in row for row in rows)
    assert all(row["state"] == "complete" for row in rows)
    assert "the loss is not searched" in capsys.readouterr().err
