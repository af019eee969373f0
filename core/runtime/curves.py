"""Training curves: the loss and metric columns of a Lightning `metrics.csv`, drawn to a PNG beside it.

    python -m core.runtime.curves runs/streamrec_demo            # every metrics.csv under the folder -> curves.png
    python -m core.runtime.curves runs/x/lightning_logs/version_0/metrics.csv

`fit` draws them itself at its end; this command is for runs that stopped early or were made before it.
One panel per metric name without its `train_`/`val_`/`test_` prefix; a baseline's values
(`val_mostpop_ndcg@10`) are a dashed line in the model's panel."""

from __future__ import annotations

import argparse
import csv
import math
from pathlib import Path

from core.runtime.atomic import atomic_path
from core.runtime.errors import InputError, exit_on_error

AXES = ("epoch", "step")  # columns CSVLogger adds to every row: positions, not metrics
SPLITS = ("train_", "val_", "test_")
BASELINES = ("mostpop_",)  # a baseline's metric joins the panel of the model's, drawn dashed

Curves = dict[str, list[tuple[int, float]]]


def read_metrics(path: str | Path) -> Curves:
    """Each metric column of a CSVLogger `metrics.csv` as (step, value) points, in file order; a row holds only
    the metrics logged at that step, and a row without a step keeps the previous row's."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such metrics file; pass a metrics.csv written by a CSVLogger")
    with path.open(newline="", encoding="utf-8") as f:
        reader = csv.DictReader(f)
        if "step" not in (reader.fieldnames or []):
            raise InputError(f"{path}: no `step` column; pass a metrics.csv written by Lightning's CSVLogger")
        curves: Curves = {name: [] for name in reader.fieldnames or [] if name not in AXES}
        step = 0
        for line, row in enumerate(reader, start=2):
            try:
                step = int(float(row["step"])) if row["step"] else step
                for name in curves:
                    if row.get(name):
                        curves[name].append((step, float(row[name])))
            except ValueError:
                raise InputError(f"{path}:{line}: a cell is not a number; pass a metrics.csv written by "
                                 "Lightning's CSVLogger") from None
    return {name: points for name, points in curves.items() if points}


def panels(curves: Curves) -> dict[str, list[str]]:
    """Metric names grouped by name without the split prefix (`val_loss` -> `loss`), in column order."""
    grouped: dict[str, list[str]] = {}
    for name in curves:
        key = next((name.removeprefix(p) for p in SPLITS if name.startswith(p)), name)
        key = next((key.removeprefix(b) for b in BASELINES if key.startswith(b)), key)
        grouped.setdefault(key, []).append(name)
    return grouped


def plot_curves(curves: Curves, path: str | Path, title: str = "") -> Path:
    """Draw `curves` to the PNG `path`, one panel per entry of `panels`."""
    if not curves:
        raise InputError(f"{path}: nothing to draw: the metrics file holds no values yet")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grouped = panels(curves)
    cols = min(3, len(grouped))
    rows = math.ceil(len(grouped) / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(4.5 * cols, 3.2 * rows), squeeze=False, constrained_layout=True)
    for ax, (key, names) in zip(axes.flat, grouped.items(), strict=False):
        for name in names:
            steps, values = zip(*curves[name], strict=True)
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=name,
                    linestyle="--" if any(f"_{b}" in name for b in BASELINES) else "-")
        ax.set(title=key, xlabel="step")
        ax.legend(fontsize="small")
    for ax in axes.flat[len(grouped):]:
        ax.set_visible(False)
    if title:
        fig.suptitle(title)
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return Path(path)


def metrics_files(target: str | Path) -> list[Path]:
    """`target` itself if it is a file, else every `metrics.csv` under the folder `target`, sorted."""
    target = Path(target)
    if target.is_file():
        return [target]
    if not target.is_dir():
        raise FileNotFoundError(f"{target}: no such file or folder; pass a run folder or a metrics.csv")
    found = sorted(target.rglob("metrics.csv"))
    if not found:
        raise InputError(f"{target}: no metrics.csv under it; fit with a CSVLogger (the configs in configs/ have one)")
    return found


def main(argv: list[str] | None = None) -> list[Path]:
    """Draw `curves.png` beside every metrics.csv named or found; print each file written."""
    parser = argparse.ArgumentParser(prog="python -m core.runtime.curves", description=__doc__.splitlines()[0])
    parser.add_argument("targets", nargs="+", type=Path, metavar="RUN",
                        help="a run folder (every metrics.csv under it) or a metrics.csv file")
    args = parser.parse_args(argv)
    written = []
    with exit_on_error():
        for metrics in (m for target in args.targets for m in metrics_files(target)):
            written.append(plot_curves(read_metrics(metrics), metrics.with_name("curves.png"), str(metrics.parent)))
            print(written[-1])
    return written


if __name__ == "__main__":
    main()
