"""core.runtime.curves: the metrics of a CSVLogger metrics.csv, exactly, and the PNG drawn from them."""

from __future__ import annotations

from pathlib import Path

import pytest

from core.runtime.curves import main, metrics_files, panels, plot_curves, read_metrics

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

# As Lightning's CSVLogger writes it: every row has epoch and step, and only the metrics logged at that step.
METRICS_CSV = """\
epoch,step,train_loss,val_loss,val_ndcg@10,val_mostpop_ndcg@10
0,49,2.5,,,
0,99,2.25,,,
0,99,,2.0,0.125,0.0625
1,149,1.75,,,
1,199,,1.5,0.25,0.0625
"""


def test_read_metrics_returns_every_metric_column_as_step_value_points(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text(METRICS_CSV)
    assert read_metrics(path) == {
        "train_loss": [(49, 2.5), (99, 2.25), (149, 1.75)],
        "val_loss": [(99, 2.0), (199, 1.5)],
        "val_ndcg@10": [(99, 0.125), (199, 0.25)],
        "val_mostpop_ndcg@10": [(99, 0.0625), (199, 0.0625)],
    }


def test_a_column_never_filled_is_left_out_and_bad_files_are_one_line(tmp_path: Path) -> None:
    path = tmp_path / "metrics.csv"
    path.write_text("epoch,step,train_loss,test_hr@10\n0,9,1.0,\n")
    assert read_metrics(path) == {"train_loss": [(9, 1.0)]}
    path.write_text("epoch,step,train_loss\n0,9,nan-ish\n")
    with pytest.raises(ValueError, match=rf"^{path}:2: a cell is not a number"):
        read_metrics(path)
    path.write_text("a,b\n1,2\n")
    with pytest.raises(ValueError, match="no `step` column"):
        read_metrics(path)
    with pytest.raises(FileNotFoundError, match="no such metrics file"):
        read_metrics(tmp_path / "nope.csv")


def test_train_and_val_of_one_metric_share_a_panel() -> None:
    curves = {"train_loss": [(1, 1.0)], "val_loss": [(1, 1.0)], "val_ndcg@10": [(1, 0.1)], "lr-AdamW": [(1, 0.1)]}
    assert panels(curves) == {"loss": ["train_loss", "val_loss"], "ndcg@10": ["val_ndcg@10"], "lr-AdamW": ["lr-AdamW"]}


def test_plot_writes_a_png(tmp_path: Path) -> None:
    import matplotlib.image

    metrics = tmp_path / "metrics.csv"
    metrics.write_text(METRICS_CSV)
    out = plot_curves(read_metrics(metrics), tmp_path / "curves.png", "run")
    assert out.read_bytes()[:8] == PNG_MAGIC
    height, width, _ = matplotlib.image.imread(out).shape
    assert (width, height) == (2 * 450, 320)  # 2 panels in a row (loss; ndcg@10 with its baseline), 100 dpi
    assert not list(tmp_path.glob(".*.tmp"))  # written atomically


def test_the_command_draws_beside_every_metrics_csv_of_a_run_folder(tmp_path: Path, capsys) -> None:
    for version in (0, 1):
        folder = tmp_path / "run" / "lightning_logs" / f"version_{version}"
        folder.mkdir(parents=True)
        (folder / "metrics.csv").write_text(METRICS_CSV)
    assert metrics_files(tmp_path / "run") == sorted((tmp_path / "run").rglob("metrics.csv"))
    written = main([str(tmp_path / "run")])
    assert written == [m.with_name("curves.png") for m in metrics_files(tmp_path / "run")]
    assert all(p.read_bytes()[:8] == PNG_MAGIC for p in written)
    assert capsys.readouterr().out.splitlines() == [str(p) for p in written]
    (tmp_path / "empty").mkdir()
    with pytest.raises(SystemExit, match=r"^error: .*empty: no metrics\.csv under it"):
        main([str(tmp_path / "empty")])


def test_a_baseline_joins_the_panel_of_the_models_metric() -> None:
    from core.runtime.curves import panels

    curves = {"train_loss": [(1, 2.0)], "val_loss": [(1, 2.5)], "val_ndcg@10": [(1, 0.1)],
              "val_mostpop_ndcg@10": [(1, 0.05)], "val_mostpop_hr@10": [(1, 0.09)], "val_hr@10": [(1, 0.2)]}
    assert panels(curves) == {"loss": ["train_loss", "val_loss"], "ndcg@10": ["val_ndcg@10", "val_mostpop_ndcg@10"],
                              "hr@10": ["val_mostpop_hr@10", "val_hr@10"]}
