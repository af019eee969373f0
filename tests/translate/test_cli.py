"""The `python -m translate` CLI: help of every entry point, every YAML config, user errors, DDP parity."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from core.runtime import precision
from translate import average, infer
from translate.cli import main

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "configs" / "translate").glob("*.yaml"))
TINY_MODEL = ["--model.d_model", "16", "--model.n_heads", "2", "--model.n_encoder_layers", "1",
              "--model.n_decoder_layers", "1", "--model.d_ff", "32"]


def _data(demo_dir: Path) -> list[str]:
    return [f"--data.{split}={demo_dir / split}" for split in ("train", "val", "test")]


@pytest.mark.parametrize("sub", [[], ["fit"], ["validate"], ["test"]])
def test_help(sub, capsys):
    with pytest.raises(SystemExit) as exit_:
        main([*sub, "--help"])
    assert exit_.value.code == 0
    out = capsys.readouterr().out
    assert "usage" in out
    if sub:
        assert "--model.objective.label_smoothing" in out and "--data.max_tokens" in out


@pytest.mark.parametrize("entry", [infer.main, average.main], ids=["infer", "average"])
def test_script_help(entry, capsys):
    with pytest.raises(SystemExit) as exit_:
        entry(["--help"])
    assert exit_.value.code == 0
    assert "--output" in capsys.readouterr().out


def test_configs_exist():
    assert {p.name for p in CONFIGS} >= {"demo.yaml", "multi30k_en_de.yaml"}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda p: p.name)
def test_every_config_runs_one_fast_dev_batch(config, demo_dir, tmp_path, monkeypatch):
    """Each YAML parses and trains one batch; its data is swapped for the tiny demo corpus (real data is not in CI)
    and its layers for tiny ones of the same architecture: what is checked is the file, not the model's size."""
    monkeypatch.chdir(tmp_path)
    cli = main(["fit", "--config", str(config), *_data(demo_dir), "--data.cache_dir", str(tmp_path / "spm"),
                *TINY_MODEL, "--model.rnn.hidden_size", "16", "--data.max_tokens", "256",
                "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false",
                "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "32-true"])
    hp, dm = cli.model.hparams, cli.datamodule
    assert (hp.src_vocab_size, hp.tgt_vocab_size, hp.pad_id) == (dm.src_vocab_size, dm.tgt_vocab_size, dm.pad_id)
    assert hp.max_len == dm.hparams.max_len  # linked, not typed
    assert cli.config.fit.trainer.use_distributed_sampler is False  # the data module shards by rank itself
    assert "val_bleu" in cli.trainer.callback_metrics


def test_wrong_config_key_is_one_line_naming_the_key_and_its_file(demo_dir, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("model:\n  d_modle: 32\n")
    with pytest.raises(SystemExit) as exit_:
        main(["fit", "--config", str(CONFIGS[0]), "--config", "mine.yaml", *_data(demo_dir)])
    assert exit_.value.code == 2
    err = capsys.readouterr().err
    assert "usage:" not in err and err.count("error:") == 1  # no 80 lines of usage around it
    err = err[err.index("error:"):]
    assert err.count("\n") == 1 and "model.d_modle" in err and "(set in mine.yaml)" in err
    assert "`python -m translate fit --help` lists the accepted keys" in err


def test_config_that_is_not_yaml_names_file_and_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.yaml").write_text("model:\n  d_model: [32\n")
    with pytest.raises(SystemExit, match=r"^error: mine\.yaml:3:1: not valid YAML: ") as exit_:
        main(["fit", "--config", "mine.yaml"])
    assert "\n" not in str(exit_.value.code)


def test_missing_data_file_is_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: .*nope\.en: no such file") as exit_:
        main(["fit", f"--data.train={tmp_path / 'nope'}", f"--data.val={tmp_path / 'nope'}"])
    assert "\n" not in str(exit_.value.code)


@pytest.fixture(scope="module")
def tiny_ckpt(demo_dir, tmp_path_factory, train_tiny_checkpoint) -> Path:
    """A checkpoint of a tiny model after a few training steps, written by a real fit."""
    return train_tiny_checkpoint(demo_dir, tmp_path_factory.mktemp("cli_ckpt"))[0]


def _validate(ckpt: Path, demo_dir: Path, devices: int, strategy: str = "auto") -> dict[str, float]:
    cli = main(["validate", *_data(demo_dir), "--data.max_len", "32", "--data.max_tokens", "200", *TINY_MODEL,
                "--ckpt_path", str(ckpt), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false",
                "--trainer.accelerator", "cpu", "--trainer.devices", str(devices), "--trainer.strategy", strategy])
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items() if k.startswith("val_")}


@pytest.mark.slow
def test_ddp_validation_equals_single_process(tiny_ckpt, demo_dir, tmp_path, monkeypatch, capfd):
    """Two DDP ranks (ddp_fork: `ddp` would relaunch pytest itself; the `ddp` launcher runs below) must give the
    single-process BLEU and chrF exactly: the hypotheses of both ranks are gathered and the sampler's repeated
    batches deduplicated (30 sentences in an odd number of batches, so one batch is decoded twice). val_loss is
    a mean of per-rank means over a repeated batch, so it only matches approximately. Every logged value is
    synced across ranks, so Lightning has no `sync_dist` warning to print."""
    monkeypatch.chdir(tmp_path)
    single = _validate(tiny_ckpt, demo_dir, 1)
    ddp = _validate(tiny_ckpt, demo_dir, 2, "ddp_fork")
    assert set(single) == set(ddp) == {"val_loss", "val_bleu", "val_chrf"}
    assert single["val_chrf"] > 0
    assert ddp["val_bleu"] == pytest.approx(single["val_bleu"], abs=1e-4)
    assert ddp["val_chrf"] == pytest.approx(single["val_chrf"], abs=1e-4)
    assert ddp["val_loss"] == pytest.approx(single["val_loss"], rel=0.05)
    assert "sync_dist" not in capfd.readouterr().err  # the forked ranks write to the captured stderr too


def test_spawned_ranks_can_unpickle_the_cli():
    """`--trainer.strategy ddp_spawn` pickles the CLI for its new processes, which import it by its module path:
    a CLI class defined in `translate/__main__.py` could not be found there, and rank 0 waited forever."""
    import pickle

    from translate.cli import TranslateCLI

    assert TranslateCLI.__module__ == "translate.cli"
    assert pickle.loads(pickle.dumps(TranslateCLI)) is TranslateCLI
    assert "class " not in (REPO / "translate" / "__main__.py").read_text()


@pytest.mark.slow
def test_fit_under_the_ddp_launcher_on_two_cpu_processes(demo_dir, tmp_path):
    """`fit --trainer.strategy=ddp --trainer.devices=2` as a user runs it (a subprocess: inside pytest the ddp
    launcher would start pytest again as rank 1). Both ranks train the same steps, one checkpoint is written,
    and rank-zero-only lines (the BLEU signature) appear once."""
    args = [sys.executable, "-m", "translate", "fit", *_data(demo_dir), *TINY_MODEL, "--data.vocab_size", "120",
            "--data.cache_dir", str(tmp_path / "spm"), "--data.max_tokens", "256", "--trainer.strategy", "ddp",
            "--trainer.devices", "2", "--trainer.accelerator", "cpu", "--trainer.max_steps", "3",
            "--trainer.limit_val_batches", "1", "--trainer.enable_progress_bar", "false", "--trainer.logger", "false",
            "--trainer.default_root_dir", str(tmp_path)]
    run = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert run.returncode == 0, run.stderr[-2000:]
    assert run.stderr.count("val BLEU signature: nrefs:1") == 1  # from the sanity check, rank zero only
    assert "sync_dist" not in run.stderr
    ckpts = list(tmp_path.glob("checkpoints/*.ckpt"))
    assert len(ckpts) == 1
    assert torch.load(ckpts[0], map_location="cpu", weights_only=True)["global_step"] == 3


def test_separate_vocabularies_with_shared_embeddings_is_one_line(demo_dir, tmp_path, monkeypatch):
    """Equal vocabulary sizes must not let source piece k and target piece k share an embedding row."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: model\.share_embeddings: true .* needs data\.joint_vocab: true"):
        main(["fit", *_data(demo_dir), "--data.joint_vocab", "false"])


def test_fit_prints_the_data_counts_on_stderr(demo_dir, tmp_path, monkeypatch, capfd):
    """The `translate` loggers' INFO lines (skipped blank pairs, filters) reach the user of `fit`."""
    monkeypatch.chdir(tmp_path)
    lines = {lang: (demo_dir / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:200] for lang in ("en", "de")}
    lines["de"][3] = ""
    for lang, text in lines.items():
        (tmp_path / f"train.{lang}").write_text("\n".join(text) + "\n", encoding="utf-8")
    main(["fit", f"--data.train={tmp_path / 'train'}", f"--data.val={demo_dir / 'val'}", *TINY_MODEL,
          "--data.vocab_size", "120", "--data.cache_dir", str(tmp_path / "spm"), "--trainer.fast_dev_run", "true",
          "--trainer.enable_progress_bar", "false", "--trainer.accelerator", "cpu", "--trainer.devices", "1"])
    err = capfd.readouterr().err
    assert f"{tmp_path / 'train.en'} / {tmp_path / 'train.de'}: skipped 1 of 200 pairs with a blank side" in err
    assert "train: kept 199 of 199 pairs" in err


@pytest.mark.parametrize("fast", [False, True], ids=["slow_bf16_cpu", "fast_bf16_cpu"])
def test_bf16_config_trains_in_fp32_where_the_cpu_has_no_fast_bf16(fast, demo_dir, tmp_path, monkeypatch, capfd):
    """The configs ask for bf16-mixed; on a CPU whose bf16 matmul is a slow fallback, fit runs in fp32 and says so."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(precision, "cpu_has_fast_bf16", lambda: fast)
    cli = main(["fit", *_data(demo_dir), *TINY_MODEL, "--data.vocab_size", "120", "--data.cache_dir",
                str(tmp_path / "spm"), "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false",
                "--trainer.accelerator", "cpu", "--trainer.devices", "1", "--trainer.precision", "bf16-mixed"])
    assert cli.trainer.precision == ("bf16-mixed" if fast else "32-true")
    err = capfd.readouterr().err
    warned = "trainer.precision bf16-mixed: " in err and "so training runs in 32-true" in err
    assert warned is not fast


def test_fit_warns_when_last_ckpt_would_only_follow_the_best(demo_dir, tmp_path, monkeypatch, capfd):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "old.yaml").write_text(
        "trainer:\n  callbacks:\n    - class_path: lightning.pytorch.callbacks.ModelCheckpoint\n"
        "      init_args: {monitor: val_bleu, mode: max, save_last: true}\n")
    main(["fit", "--config", str(REPO / "configs" / "translate" / "demo.yaml"), "--config", "old.yaml",
          *_data(demo_dir), *TINY_MODEL, "--data.vocab_size", "120", "--data.cache_dir", str(tmp_path / "spm"),
          "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false", "--trainer.precision", "32-true"])
    err = capfd.readouterr().err
    assert "translate: ModelCheckpoint(monitor='val_bleu', save_last=true) rewrites last.ckpt only" in err


@pytest.mark.parametrize("schedule", ["cosine", "inverse_sqrt"])
def test_fit_with_max_time_warns_that_the_cosine_may_not_finish(schedule, demo_dir, tmp_path, monkeypatch):
    """A run the clock (trainer.max_time) may stop ends anywhere; only inverse_sqrt needs no run length."""
    monkeypatch.chdir(tmp_path)
    args = ["fit", *_data(demo_dir), *TINY_MODEL, "--data.vocab_size", "120", "--data.cache_dir", str(tmp_path / "spm"),
            "--model.optimizer.schedule", schedule, "--trainer.max_time", "00:01:00:00", "--trainer.max_epochs", "1",
            "--trainer.limit_train_batches", "1", "--trainer.limit_val_batches", "1", "--trainer.logger", "false",
            "--trainer.enable_checkpointing", "false", "--trainer.enable_progress_bar", "false",
            "--trainer.precision", "32-true", "--trainer.num_sanity_val_steps", "0"]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        main(args)
    warned = [str(w.message) for w in caught if "trainer.max_time: the warmup-cosine schedule" in str(w.message)]
    assert len(warned) == (schedule == "cosine")
    assert all(w.endswith("or use model.optimizer.schedule: inverse_sqrt, which needs no run length") for w in warned)


def test_demo_config_logs_metrics_and_the_signature_to_csv_under_default_root_dir(demo_dir, tmp_path, monkeypatch):
    """Every output of fit (checkpoints, CSV and TensorBoard logs, config.yaml, curves.png) follows
    `--trainer.default_root_dir`; the BLEU signature sits beside the metrics it qualifies."""
    monkeypatch.chdir(tmp_path)
    main(["fit", "--config", str(REPO / "configs" / "translate" / "demo.yaml"), *_data(demo_dir), *TINY_MODEL,
          "--data.cache_dir", "spm", "--trainer.max_epochs", "1", "--trainer.limit_train_batches", "2",
          "--trainer.limit_val_batches", "2", "--trainer.enable_progress_bar", "false",
          "--trainer.precision", "32-true", "--trainer.num_sanity_val_steps", "0",
          "--trainer.default_root_dir", "other"])
    files = sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*") if p.is_file())
    assert all(f.startswith(("other/", "spm/")) for f in files), files  # spm/: the vocabulary cache, not the run's
    logs = "other/lightning_logs/version_0"
    assert {"other/checkpoints/best.ckpt", "other/checkpoints/last.ckpt", f"{logs}/config.yaml",
            f"{logs}/curves.png"} <= set(files)
    assert any(f.startswith("other/tensorboard/version_0/events.out.tfevents.") for f in files)
    metrics = tmp_path / logs / "metrics.csv"
    header, *rows = metrics.read_text().splitlines()
    assert {"val_bleu", "val_chrf", "val_loss"} <= set(header.split(",")) and rows
    hparams = metrics.with_name("hparams.yaml").read_text()
    assert "val_bleu_signature: nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:" in hparams


def test_demo_config_keeps_the_best_bleu_checkpoint_and_the_test_command_scores_it(demo_dir, tmp_path, monkeypatch):
    """best.ckpt is the epoch with the highest validation BLEU in metrics.csv (the first of equals), and
    `python -m translate test --ckpt_path best.ckpt` decodes the test split with it."""
    monkeypatch.chdir(tmp_path)
    common = ["--config", str(REPO / "configs" / "translate" / "demo.yaml"), *_data(demo_dir), *TINY_MODEL,
              "--data.cache_dir", str(tmp_path / "spm"), "--trainer.enable_progress_bar", "false",
              "--trainer.precision", "32-true", "--trainer.limit_val_batches", "3", "--trainer.limit_test_batches", "3"]
    main(["fit", *common, "--trainer.max_epochs", "4", "--trainer.limit_train_batches", "30", "--model.lr", "0.01",
          "--model.d_model", "64", "--model.d_ff", "128", "--model.optimizer.warmup_steps", "20",
          "--trainer.num_sanity_val_steps", "0"])
    (metrics,) = (tmp_path / "runs" / "translate_demo").glob("lightning_logs/version_*/metrics.csv")
    header, *rows = (line.split(",") for line in metrics.read_text().splitlines())
    epoch, val_bleu = header.index("epoch"), header.index("val_bleu")
    bleu = {int(r[epoch]): float(r[val_bleu]) for r in rows if r[val_bleu]}
    assert sorted(bleu) == [0, 1, 2, 3]
    assert len(set(bleu.values())) > 1  # else any epoch would do
    best = tmp_path / "runs" / "translate_demo" / "checkpoints" / "best.ckpt"
    assert torch.load(best, weights_only=True)["epoch"] == max(bleu, key=lambda e: (bleu[e], -e))
    cli = main(["test", *common, "--ckpt_path", str(best)])
    assert "test_bleu" in cli.trainer.callback_metrics


def test_checkpoint_of_other_data_settings_is_one_line(tiny_ckpt, demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    # The checkpoint's own hyperparameters win over --model.*, but the vocabulary sizes are linked from the
    # data: a data setting other than the checkpoint's (here its sentencepiece size) builds another model.
    with pytest.raises(SystemExit) as exit_:
        main(["validate", *_data(demo_dir), "--data.max_len", "32", "--data.max_tokens", "200", *TINY_MODEL,
              "--data.vocab_size", "300", "--data.cache_dir", str(tmp_path / "spm"),
              "--ckpt_path", str(tiny_ckpt), "--trainer.logger", "false", "--trainer.enable_progress_bar", "false"])
    message = str(exit_.value.code)
    assert message.startswith(f"error: checkpoint {tiny_ckpt} does not fit this model: ")
    assert re.search(r"model\.\w+_embed\.embedding\.weight is \d+ x 16 there but 300 x 16 here", message)
    assert "trained on other data or settings" in message and "\n" not in message


def _tsv(demo_dir: Path, split: str, out: Path) -> Path:
    """The demo split as one `source<TAB>target` file, the common bitext layout."""
    src = (demo_dir / f"{split}.en").read_text(encoding="utf-8").splitlines()
    tgt = (demo_dir / f"{split}.de").read_text(encoding="utf-8").splitlines()
    path = out / f"{split}.tsv"
    path.write_text("".join(f"{s}\t{t}\n" for s, t in zip(src, tgt, strict=True)), encoding="utf-8")
    return path


def test_fit_reads_a_two_column_tsv_of_pairs(demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    train, val = _tsv(demo_dir, "train", tmp_path), _tsv(demo_dir, "val", tmp_path)
    cli = main(["fit", f"--data.train={train}", f"--data.val={val}", "--data.cache_dir", str(tmp_path / "spm"),
                *TINY_MODEL, "--trainer.fast_dev_run", "true", "--trainer.enable_progress_bar", "false",
                "--trainer.accelerator", "cpu", "--trainer.precision", "32-true"])
    data = cli.datamodule.dataset("train")
    assert data.sources[0] == (demo_dir / "train.en").read_text(encoding="utf-8").splitlines()[0]
    assert data.refs[0] == (demo_dir / "train.de").read_text(encoding="utf-8").splitlines()[0]
    assert "val_bleu" in cli.trainer.callback_metrics


@pytest.mark.parametrize("row, tabs", [("a dog\tein Hund\textra", 2), ("no tab here", 0)])
def test_tsv_row_without_exactly_one_tab_is_one_line_naming_file_and_line(tmp_path, monkeypatch, row, tabs):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "train.tsv").write_text(f"a cat\teine Katze\nthe dog\tder Hund\n{row}\n", encoding="utf-8")
    with pytest.raises(SystemExit, match=rf"^error: train\.tsv:3: {tabs} tabs; a TSV split needs exactly one tab") \
            as exit_:
        main(["fit", "--data.train=train.tsv", "--data.val=train.tsv"])
    assert "\n" not in str(exit_.value.code)


def _evaluate(sub: str, args: list[str], ckpt: Path, capsys) -> tuple[dict[str, float], str]:
    cli = main([sub, *args, "--ckpt_path", str(ckpt), "--trainer.logger", "false",
                "--trainer.enable_progress_bar", "false", "--trainer.accelerator", "cpu"])
    return {k: float(v) for k, v in cli.trainer.callback_metrics.items()}, capsys.readouterr().out


@pytest.mark.parametrize("sub, split", [("test", "test"), ("validate", "val")])
def test_evaluating_a_checkpoint_needs_only_its_split(tiny_ckpt, demo_dir, tmp_path, monkeypatch, capsys, sub, split):
    """`python -m translate test --ckpt_path CKPT --data.test FILES`: the vocabulary and max_len come from the
    checkpoint, and the scores are those of a run given the training text and the training max_len."""
    monkeypatch.chdir(tmp_path)
    alone, table = _evaluate(sub, [f"--data.{split}={demo_dir / split}"], tiny_ckpt, capsys)
    assert f"{split}_bleu" in table and f"{split}_chrf" in table
    full, _ = _evaluate(sub, [*_data(demo_dir), "--data.max_len", "32", "--data.cache_dir",
                              str(tiny_ckpt.parent / "spm")], tiny_ckpt, capsys)
    assert alone == full


def test_evaluating_without_training_text_or_checkpoint_says_what_is_needed(demo_dir, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit, match=r"^error: data\.train: no training files; .* need --ckpt_path CKPT"):
        main(["test", f"--data.test={demo_dir / 'test'}"])
