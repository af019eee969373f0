"""data/prepare_ml1m_features.py on a hand-made movies.dat and SASRec id mapping."""

from __future__ import annotations

import csv
from pathlib import Path

import pytest


@pytest.fixture(scope="module")
def prepare(data_script):
    return data_script("prepare_ml1m_features")


def ml1m(folder: Path, mapping: str) -> Path:
    (folder / "sas_mapping").mkdir(parents=True)
    (folder / "movies.dat").write_bytes("1::Toy Story (1995)::Animation|Comedy\n2::Amélie (2001)::Romance\n"
                                        .encode("latin-1"))
    (folder / "sas_mapping" / "sas_to_original_items.txt").write_text(mapping)
    return folder


def test_genres_are_keyed_by_the_sasrec_ids(prepare, tmp_path):
    out = tmp_path / "out" / "genres.csv"
    prepare.main(["--ml1m", str(ml1m(tmp_path / "ml", "1 2\n2 1\n")), "--out", str(out)])
    rows = list(csv.DictReader(out.open(encoding="utf-8")))
    assert rows == [{"item_id": "1", "title": "Amélie (2001)", "genres": "Romance"},
                    {"item_id": "2", "title": "Toy Story (1995)", "genres": "Animation|Comedy"}]


def test_a_mapped_movie_missing_from_movies_dat_is_named(prepare, tmp_path, capsys):
    with pytest.raises(SystemExit, match="MovieID 7 .and 0 more. not in"):
        prepare.main(["--ml1m", str(ml1m(tmp_path / "ml", "1 7\n")), "--out", str(tmp_path / "g.csv")])
    assert not (tmp_path / "g.csv").exists()
