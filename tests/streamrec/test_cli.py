"""The `python -m streamrec` CLI: help, every YAML config, user errors, and DDP parity."""

import re
import runpy
import sys
import warnings
from pathlib import Path

import pytest
import yaml

from core.runtime import precision
from core.runtime.checkpoint import load_checkpoint
from streamrec.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "streamrec").glob("*.yaml"))
TINY_MODEL = ["--model.d_model", "16", "--model.n_heads", "2", "--model.n_layers", "1", "--model.d_ff", "32"]


def _run(args):
    return main(args)


@pytest.mark.parametrize("sub", [["fit"], ["validate"], ["test"]])  # the top level's: the test naming tune
def test_help(sub, capsys):
    with pytest.raises(SystemExit) as exit_:
        _run([*sub, "--help"])
    assert exit_.value.code == 0
    assert "usage" in capsys.readouterr().out


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_runs_one_fast_dev_batch(config, tiny_log, tmp_path, monkeypatch):
    """Each YAML parses and trains one batch; its data is swapped for the tiny log (real data is not in CI)."""
    monkeypatch.chdir(tmp_path)
    features = []
    if "item_features" in (yaml.safe_load(config.read_text(encoding="utf-8")).get("data") or {}):
        items = sorted({line.split(",")[1] for line in tiny_log.read_text(encoding="utf-8").splitlines()[1:]})
        (tmp_path / "items.csv").write_text("item_id,genres\n" + "".join(f"{i},a|b\n" for i in items), encoding="utf-8")
        features = ["--data.item_features", "items.csv"]
    cli = _run(["fit", "--config", str(config), "--data.path", str(tiny_log), "--data.format", "csv", *features,
                "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false",
                "--trainer.accelerator", "cpu", "--trainer.devices", "1"])
    assert cli.model.hparams.num_items == cli.datamodule.num_items  # linked, not typed
    assert cli.model.hparams.max_len == cli.datamodule.max_len
    assert cli.model.hparams.num_features == cli.datamodule.num_features


@pytest.mark.parametrize("fast", [False, True], ids=["slow_bf16_cpu", "fast_bf16_cpu"])
def test_bf16_trains_in_fp32_where_the_cpu_has_no_fast_bf16(fast, tiny_log, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: fast)
    cli = _run(["fit", "--config", str(REPO / "configs" / "streamrec" / "demo.yaml"), "--data.path", str(tiny_log),
                "--data.format", "csv", "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false",
                "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "bf16-mixed"])
    assert cli.trainer.precision == ("bf16-mixed" if fast else "32-true")
    err = capfd.readouterr().err
    warned = "trainer.precision bf16-mixed: " in err and "so training runs in 32-true" in err
    assert warned is not fast


def test_fit_warns_when_last_ckpt_would_only_follow_the_best(tiny_log, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {monitor: val_ndcg@10, mode: max, save_last: true}\n")
    _run(["fit", "--config", str(REPO / "configs" / "streamrec" / "demo.yaml"), "--config", "old.yaml",
          "--data.path", str(tiny_log), "--data.format", "csv", "--trainer.fast_dev_run", "true",
          "--trainer.enable_progress_bar", "false", "--trainer.precision", "32-true"])
    assert "streamrec: ModelCheckpoint(monitor='val_ndcg@10', save_last=true) rewrites" in capfd.readouterr().err


def test_wrong_config_key_is_one_line_naming_the_key(tiny_log, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        _run(["fit", "--data.path", str(tiny_log), "--model.d_modle", "32"])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and err.count("error:") == 1  # no 80 lines of usage around it
    err = err[err.index("error:"):]
    assert err.count("\n") == 1 and "--model.d_modle" in err
    assert "`python -m streamrec fit --help` lists the accepted keys" in err


def test_missing_data_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: .*nope\.csv"):
        _run(["fit", "--data.path", str(tmp_path / "nope.csv")])


def _validate(ckpt, data, devices, strategy="auto"):
    cli = _run(["validate", "--data.path", str(data), "--data.max_len", "8", "--model.d_model", "16",
                "--model.n_heads", "2", "--model.n_layers", "1", "--model.d_ff", "32",
                "--ckpt_path", str(ckpt), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                "--trainer.accelerator", "cpu", "--trainer.devices", str(devices), "--trainer.strategy", strategy])
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("val_")}


def test_a_checkpoint_trained_on_other_data_is_one_line(tiny_ckpt, demo, tmp_path, monkeypatch, exit_line):
    """The data decides the item table's size: a checkpoint of another catalogue is refused naming the tensor."""
    monkeypatch.chdir(tmp_path)
    other = tmp_path / "other.csv"
    demo.write_csv(demo.generate(users=30, items=55, seed=2, min_len=5, max_len=9), other)
    message = exit_line(main, ["test", "--data.path", str(other), "--data.max_len", "8", "--model.d_model", "16",
                               "--model.n_heads", "2", "--model.n_layers", "1", "--model.d_ff", "32",
                               "--ckpt_path", str(tiny_ckpt), "--trainer.logger", "false"])
    assert message.startswith(f"error: checkpoint {tiny_ckpt} does not fit this model: ")
    assert re.search(r"model\.item_embedding\.embedding\.weight is 41 x 16 there but (\d+) x 16 here", message)
    assert "trained on other data or settings" in message


@pytest.mark.slow
def test_ddp_validation_equals_single_process(tiny_ckpt, tiny_log, tmp_path, monkeypatch, capfd):
    """Two DDP ranks (ddp_fork: `ddp` would relaunch pytest itself) must give the single-process
    full-ranking metrics; tolerance 1e-6, since only the order of float sums differs. The metrics are
    reduced across ranks before they are logged, so Lightning has no `sync_dist` warning to print."""
    monkeypatch.chdir(tmp_path)
    single = _validate(tiny_ckpt, tiny_log, 1)
    ddp = _validate(tiny_ckpt, tiny_log, 2, "ddp_fork")
    assert single and set(single) == set(ddp)
    for name in single:
        assert ddp[name] == pytest.approx(single[name], abs=1e-6), name
    assert "sync_dist" not in capfd.readouterr().err  # the forked ranks write to the captured stderr too


def test_a_second_fit_into_one_run_folder_is_refused_and_a_fit_reads_safely_and_resumes_exactly(
        tiny_log, tmp_path, monkeypatch):
    from core.runtime.checkpoint_io import SafeCheckpointIO
    from core.runtime.lock import OutputLock
    from core.runtime.resume import ExactResume

    monkeypatch.chdir(tmp_path)
    root = tmp_path / "runs" / "one"
    root.mkdir(parents=True)
    args = ["fit", "--config", str(REPO / "configs" / "streamrec" / "demo.yaml"), "--data.path", str(tiny_log),
            "--trainer.default_root_dir", str(root), "--trainer.fast_dev_run", "true",
            "--trainer.enable_progress_bar", "false", "--trainer.precision", "32-true"]
    with OutputLock(root, "fit"), pytest.raises(SystemExit) as exit_:
        _run(args)
    message = str(exit_.value.code)
    assert "another run is writing it (fit, pid" in message and f"lock file {root / 'fit.lock'}" in message
    assert "\n" not in message
    cli = _run(args)  # free again: runs, and releases the folder when done
    assert not (root / "fit.lock").exists()
    # The demo config's trainer, which that run built: it reads checkpoints safely, saves last.ckpt before
    # best.ckpt, and resumes exactly.
    assert isinstance(cli.trainer.strategy.checkpoint_io, SafeCheckpointIO)
    assert sum(isinstance(cb, ExactResume) for cb in cli.trainer.callbacks) == 1
    assert [cb.monitor for cb in cli.trainer.checkpoint_callbacks] == [None, "val_ndcg@10"]  # last.ckpt first


def _fit_epochs(tiny_log, *extra):
    cli = _run(["fit", "--data.path", str(tiny_log), "--data.max_len", "8", "--model.d_model", "16",
                "--model.n_heads", "2", "--model.n_layers", "1", "--model.d_ff", "32", "--model.lr", "0",
                "--model.evaluation.popularity_baseline", "false", "--trainer.max_epochs", "6",
                "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1",
                "--trainer.num_sanity_val_steps", "0", "--trainer.logger", "false",
                "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false", *extra])
    return cli.trainer.current_epoch, [cb for cb in cli.trainer.callbacks if type(cb).__name__ == "EarlyStopping"]


def test_fit_stops_early_on_validation_ndcg_by_default(tiny_log, tmp_path, monkeypatch):
    """lr 0: validation never improves, so fit stops `patience` epochs after the first, unless told otherwise
    (one batch of each split an epoch: the same metric every epoch needs no more)."""
    monkeypatch.chdir(tmp_path)
    epochs, stoppers = _fit_epochs(tiny_log, "--early_stopping", "2")
    assert epochs == 3 and len(stoppers) == 1 and stoppers[0].monitor == "val_ndcg@10"
    epochs, stoppers = _fit_epochs(tiny_log, "--early_stopping", "0")
    assert epochs == 6 and not stoppers
    own = ("--trainer.callbacks+=lightning.pytorch.callbacks.EarlyStopping",
           "--trainer.callbacks.monitor=val_hr@10", "--trainer.callbacks.patience=1", "--trainer.callbacks.mode=max")
    epochs, stoppers = _fit_epochs(tiny_log, *own)
    assert epochs == 2 and [s.monitor for s in stoppers] == ["val_hr@10"]  # the user's replaces the default


def _tiny_fit(tiny_log, *extra, loggers=False):
    """One short epoch (two training batches, one validation batch, no sanity check) of a tiny model with
    configs/streamrec/demo.yaml's checkpoints, and its loggers only with `loggers` (drawing curves.png at the end
    costs more than the epoch)."""
    return _run(["fit", "--config", str(REPO / "configs" / "streamrec" / "demo.yaml"), "--data.path", str(tiny_log),
                 "--data.max_len", "8", *TINY_MODEL, "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
                 "--trainer.limit_val_batches", "1", "--trainer.num_sanity_val_steps", "0",
                 "--trainer.enable_progress_bar", "false", "--trainer.precision", "32-true",
                 *([] if loggers else ["--trainer.logger", "false"]), *extra])


def test_every_output_of_fit_goes_under_default_root_dir(tiny_log, tmp_path, monkeypatch):
    """Checkpoints, CSV and TensorBoard logs, config.yaml and curves.png follow `--trainer.default_root_dir`."""
    monkeypatch.chdir(tmp_path)
    _tiny_fit(tiny_log, "--trainer.default_root_dir", "other", loggers=True)
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert files and all(f.startswith("other/") for f in files), files
    logs = "other/lightning_logs/version_0"
    assert {"other/checkpoints/best.ckpt", "other/checkpoints/last.ckpt", f"{logs}/metrics.csv",
            f"{logs}/config.yaml", f"{logs}/curves.png"} <= set(files)
    assert any(f.startswith("other/tensorboard/version_0/events.out.tfevents.") for f in files)
    assert (tmp_path / logs / "curves.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_a_second_fit_keeps_the_first_runs_checkpoints_unless_told_to_overwrite(tiny_log, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    ckpts = Path("runs/streamrec_demo/checkpoints")
    _tiny_fit(tiny_log)
    best = (ckpts / "best.ckpt").read_bytes()
    with pytest.raises(SystemExit) as exit_:
        _tiny_fit(tiny_log)
    assert str(exit_.value.code) == (
        f"error: {ckpts} already holds best.ckpt, last.ckpt from an earlier fit; to keep them, fit into another folder "
        f"with --trainer.default_root_dir NEW_FOLDER, resume it with --ckpt_path {ckpts / 'last.ckpt'}, "
        "or pass --overwrite to replace them")
    assert (ckpts / "best.ckpt").read_bytes() == best
    assert not Path("runs/streamrec_demo/fit.lock").exists()  # released: the next command may use the folder
    _tiny_fit(tiny_log, "--ckpt_path", str(ckpts / "last.ckpt"), "--trainer.max_epochs", "2")  # resume: allowed
    assert load_checkpoint(ckpts / "last.ckpt", "fit")["epoch"] == 1
    cli = _tiny_fit(tiny_log, "--overwrite")  # a new run from scratch, replacing them
    assert load_checkpoint(ckpts / "last.ckpt", "fit")["epoch"] == 0
    saved = Path(cli.trainer.log_dir) / "config.yaml"
    assert "overwrite: false" in saved.read_text()  # rerunning the saved config must not overwrite silently


@pytest.mark.parametrize("arch", ["bert4rec", "gru"])
def test_the_other_networks_fit_score_and_export_from_the_command_line(arch, tiny_log, tmp_path, monkeypatch):
    """`--model.arch` is all a user adds: the same data, checkpoints, batch scoring and safetensors export."""
    import pyarrow.parquet as pq

    from streamrec import Recommender, score
    from streamrec.data.readers import read_interactions
    from streamrec.export import export_safetensors

    monkeypatch.chdir(tmp_path)
    _tiny_fit(tiny_log, "--model.arch", arch, "--trainer.default_root_dir", "run")
    ckpt = tmp_path / "run/checkpoints/best.ckpt"
    rec = Recommender.load(ckpt)
    assert rec.model.arch == arch
    score.main(["--ckpt", str(ckpt), "--input", str(tiny_log), "--output", "recs.parquet", "--top-k", "3"])
    rows = pq.read_table("recs.parquet").to_pylist()
    assert len(rows) == 3 * 81 and {r["rank"] for r in rows} == {1, 2, 3}
    first = [r["item_id"] for r in rows if r["user_id"] == rows[0]["user_id"]]
    history = read_interactions(tiny_log).items[rows[0]["user_id"]]  # the reader `score` uses
    assert first == [i for i, _ in rec.recommend([history], top_k=3)[0]]
    exported = Recommender.load(export_safetensors(ckpt, tmp_path / "st"))
    assert exported.recommend([history], top_k=3)[0] == rec.recommend([history], top_k=3)[0]


def test_the_command_line_runs_without_lightnings_args_warning(monkeypatch, capfd):
    """`python -m streamrec` leaves sys.argv to LightningCLI: given both, Lightning warns on every run. Its
    `__main__` in this process, with the command line a user types in sys.argv and every warning recorded:
    a second interpreter would only import torch and Lightning again."""
    monkeypatch.setattr(sys, "argv", ["streamrec", "fit", "--help"])
    with warnings.catch_warnings(record=True) as caught, pytest.raises(SystemExit) as exit_:
        warnings.simplefilter("always")
        runpy.run_module("streamrec", run_name="__main__")
    assert exit_.value.code == 0
    out, err = capfd.readouterr()
    assert "usage" in out
    assert not [w for w in caught if "args parameter is intended" in str(w.message)], [str(w.message) for w in caught]
    assert "args parameter is intended" not in err, err


def test_the_top_level_help_names_tune(capsys) -> None:
    from streamrec.cli import main

    with pytest.raises(SystemExit) as exit_:
        main(["--help"])
    assert exit_.value.code == 0
    printed = " ".join(capsys.readouterr().out.split())
    assert "usage" in printed
    assert "python -m streamrec tune --config CONFIG" in printed and "{fit,validate,test,predict}" in printed


def test_test_prints_4_decimals_with_the_baseline_beside_the_model(tiny_log, tiny_ckpt, tmp_path, monkeypatch,
                                                                    capsys) -> None:
    from streamrec.cli import main

    monkeypatch.chdir(tmp_path)
    main(["test", "--data.path", str(tiny_log), "--data.max_len", "8", "--ckpt_path", str(tiny_ckpt),
          "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"])
    out = capsys.readouterr().out
    rows = {line.split()[0]: line.split()[1:] for line in out.splitlines() if line.startswith("test_")}
    assert "test_ndcg@10" in rows and not any("mostpop" in key for key in rows)  # beside, not among
    model, popular = rows["test_ndcg@10"]
    assert len(model.split(".")[1]) == 4 and len(popular.split(".")[1]) == 4
