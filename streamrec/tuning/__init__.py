"""The parts of `python -m streamrec tune` (`streamrec.tune`), one job a module: `options` (what one search
is), `space` (the searched parameters and their config keys), `trial` (one trial's training), `report` (the
table, the plot and best.yaml)."""
