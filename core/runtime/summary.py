"""The model summary `fit` prints, without Lightning's FLOPs column and "Total FLOPs" line when nothing was counted.

Lightning counts FLOPs only for a module with an `example_input_array`; without one (both apps' modules) its
summary prints a column of zeros. Lightning's `summarize` hook has changed between releases: where its
arguments are not `SUMMARIZE_ARGUMENTS` (`hook_matches` is False), `summary_callback` keeps Lightning's callback."""

from __future__ import annotations

import inspect
import logging
from typing import Any

from lightning.pytorch.callbacks import ModelSummary, RichModelSummary
from lightning.pytorch.utilities.model_summary import get_formatted_model_size, get_human_readable_count
from lightning.pytorch.utilities.model_summary.model_summary import _format_summary_table

FLOPS = "FLOPs"  # the column's header in Lightning's summary data
SUMMARIZE_ARGUMENTS = ("summary_data", "total_parameters", "trainable_parameters", "model_size",
                       "total_training_modes", "total_flops")
# Lightning's rich column styles: the row number dim, counts and sizes right-aligned.
COLUMN_STYLES: dict[str, dict[str, Any]] = {
    " ": {"style": "dim"}, "Name": {"justify": "left", "no_wrap": True}, "Params": {"justify": "right"},
    "Params per Device": {"justify": "right"}, "In sizes": {"justify": "right", "style": "white"},
    "Out sizes": {"justify": "right", "style": "white"},
}
log = logging.getLogger("lightning.pytorch.callbacks.model_summary")  # where Lightning's plain summary goes


def hook_matches() -> bool:
    """Whether Lightning's `summarize` hooks (plain and rich) take `SUMMARIZE_ARGUMENTS`, as ours do."""
    return all(tuple(inspect.signature(cls.summarize).parameters)[: len(SUMMARIZE_ARGUMENTS)] == SUMMARIZE_ARGUMENTS
               for cls in (ModelSummary, RichModelSummary))


def flops_counted(summary_data: list[tuple[str, list[str]]], total_flops: int) -> bool:
    """Whether the summary has a FLOPs count other than 0 (a total, or a layer's; "n/a" rows count as none)."""
    column = dict(summary_data).get(FLOPS, [])
    return bool(total_flops) or any(str(value).strip() not in ("0", "n/a", "") for value in column)


def without_flops(summary_data: list[tuple[str, list[str]]]) -> list[tuple[str, list[str]]]:
    return [(name, values) for name, values in summary_data if name != FLOPS]


class PlainSummary(ModelSummary):
    """Lightning's `ModelSummary`, with no FLOPs column or "Total Flops" line when no FLOPs were counted."""

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int,
                  **summarize_kwargs: Any) -> None:
        if flops_counted(summary_data, total_flops):
            ModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                   total_training_modes, total_flops, **summarize_kwargs)
            return
        table = _format_summary_table(total_parameters, trainable_parameters, model_size, total_training_modes,
                                      total_flops, *without_flops(summary_data))
        log.info("\n" + "\n".join(line for line in table.split("\n") if not line.lower().endswith("total flops")))


class RichSummary(RichModelSummary):
    """Lightning's `RichModelSummary`, with no FLOPs column or "Total FLOPs" line when no FLOPs were counted."""

    @staticmethod
    def summarize(summary_data: list[tuple[str, list[str]]], total_parameters: int, trainable_parameters: int,
                  model_size: float, total_training_modes: dict[str, int], total_flops: int,
                  **summarize_kwargs: Any) -> None:
        if flops_counted(summary_data, total_flops):
            RichModelSummary.summarize(summary_data, total_parameters, trainable_parameters, model_size,
                                       total_training_modes, total_flops, **summarize_kwargs)
            return
        from rich import get_console
        from rich.table import Table

        columns = without_flops(summary_data)
        table = Table(header_style=summarize_kwargs.get("header_style", "bold magenta"))
        for name, _ in columns:
            table.add_column(name, **COLUMN_STYLES.get(name, {}))
        for row in zip(*(values for _, values in columns), strict=True):
            table.add_row(*row)
        console = get_console()
        console.print(table)
        grid = Table.grid(expand=True)
        grid.add_column()
        grid.add_column()
        for label, value in (
                ("Trainable params", get_human_readable_count(int(trainable_parameters))),
                ("Non-trainable params", get_human_readable_count(int(total_parameters - trainable_parameters))),
                ("Total params", get_human_readable_count(int(total_parameters))),
                ("Total estimated model params size (MB)", get_formatted_model_size(model_size))):
            grid.add_row(f"[bold]{label}[/]: {value:<10}")
        grid.add_row(f"[bold]Modules in train mode[/]: {total_training_modes['train']}")
        grid.add_row(f"[bold]Modules in eval mode[/]: {total_training_modes['eval']}")
        console.print(grid)


def summary_callback(callback: Any) -> Any:
    """Ours for Lightning's own `ModelSummary` or `RichModelSummary` (exactly those types: a user's subclass stays),
    with the same `max_depth` and arguments; any other callback unchanged."""
    if type(callback) not in (ModelSummary, RichModelSummary) or not hook_matches():
        return callback
    ours = RichSummary if type(callback) is RichModelSummary else PlainSummary
    return ours(getattr(callback, "_max_depth", 1), **getattr(callback, "_summarize_kwargs", {}))
