"""Item files: CSV/TSV with an item_id header and MovieLens' movies.dat; every bad file is one line naming
the file and line; ids the file lacks show as themselves."""

from __future__ import annotations

import pytest

from core.runtime.errors import InputError
from streamrec.api import Recommender
from streamrec.data import items as items_mod
from streamrec.data.items import read_items


def test_csv_with_title_and_metadata(write):
    path = write("items.csv", '\ufeffitem_id,title,genre\nv1,"Series 0, episode 1",drama\nv2,,comedy\n\n')
    catalog = read_items(path)
    assert catalog.columns == ["title", "genre"] and len(catalog) == 2
    assert catalog.title("v1") == "Series 0, episode 1" and catalog.details("v1") == {"genre": "drama"}
    assert catalog.title("v2") == "v2"  # an empty title: the id
    assert catalog.title("nope") == "nope" and catalog.details("nope") == {}  # not in the file: the id


def test_tsv_without_title_shows_the_first_other_column(write):
    catalog = read_items(write("items.tsv", "name\titem_id\tyear\nThe Film\t7\t1999\n"))
    assert catalog.title("7") == "The Film" and catalog.details("7") == {"year": "1999"}


def test_movielens_movies_dat_is_latin1(write):
    data = "1::Toy Story (1995)::Animation|Children's|Comedy\n73::Misérables, Les (1995)::Drama\n".encode("latin-1")
    catalog = read_items(write("movies.dat", data))
    assert catalog.title("73") == "Misérables, Les (1995)"
    assert catalog.details("1") == {"genres": "Animation, Children's, Comedy"}


def test_the_demo_catalogue_has_titles(demo, tmp_path):
    path = demo.write_catalogue(demo.make_catalogue(20, seed=0), tmp_path / "items.csv")
    catalog = read_items(path)
    first = demo.make_catalogue(20, seed=0)[0]
    assert catalog.title(first.item_id) == f"Series {first.series}, episode {first.episode}"


@pytest.mark.parametrize("name,content,expected", [
    ("a.csv", "id,title\n1,x\n", r"a\.csv:1: no 'item_id' column"),
    ("a.csv", "item_id,title\n1,x\n2\n", r"a\.csv:3: 1 fields but the header has 2"),
    ("a.csv", "item_id,title\n1,x\n1,y\n", r"a\.csv:3: item '1' is listed twice"),
    ("a.csv", "item_id,title\n,x\n", r"a\.csv:2: empty item id"),
    ("a.csv", "item_id,title,title\n1,x,y\n", r"a\.csv:1: empty or repeated column names"),
    ("a.csv", b"item_id,title\n1,\xff\n", r"a\.csv:2: not UTF-8 text"),
    ("a.csv", b"item_id,title\n1,\x00\n", r"a\.csv:2: NUL byte"),
    ("a.csv", "", r"a\.csv:1: no 'item_id' column"),
    ("movies.dat", "1::Toy Story (1995)::Comedy\n2::Jumanji\n", r"movies\.dat:2: expected MovieID::Title::Genres"),
])
def test_bad_files_are_one_line_naming_the_file_and_line(write, name, content, expected):
    with pytest.raises(InputError, match=expected) as err:
        read_items(write(name, content))
    assert "\n" not in str(err.value)


def test_missing_file_and_size_limit(write, tmp_path, monkeypatch):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        read_items(tmp_path / "nope.csv")
    monkeypatch.setattr(items_mod, "MAX_ITEMS_FILE_BYTES", 10)
    with pytest.raises(InputError, match=r"a\.csv: 25 bytes, over the 10-byte limit"):
        read_items(write("a.csv", "item_id,title\n1,abcdefgh\n"))


def test_explanation_carries_titles(tiny_ckpt, tiny_log, write):
    from streamrec.data.readers import read_interactions

    history = next(iter(read_interactions(tiny_log).items.values()))
    path = write("items.csv", "item_id,title\n" + f"{history[-1]},The Last One\n")
    why = Recommender.load(tiny_ckpt, items=path).explain(history, top_k=3)
    assert why.title(history[-1]) == "The Last One"
    assert why.title(why.recommendations[0][0]) in (why.recommendations[0][0], "The Last One")
    plain = Recommender.load(tiny_ckpt).explain(history, top_k=3)
    assert plain.catalog is None and plain.title(history[-1]) == history[-1]
    with pytest.raises(InputError, match="no 'item_id' column"):  # a bad items file fails before the model loads
        Recommender.load("not-even-a-checkpoint", items=write("bad.csv", "x\n"))


def test_score_adds_title_columns(tiny_ckpt, tiny_log, write, tmp_path):
    import pyarrow.csv as pacsv

    from streamrec import score

    names = {f"v{i:04d}": f"Title {i}" for i in range(2, 41)}  # v0001 left out: it keeps its id
    path = write("items.csv", "item_id,title\n" + "".join(f"{k},{v}\n" for k, v in names.items()))
    out = tmp_path / "recs.csv"
    score.main(["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--output", str(out), "--top-k", "3",
                "--explain", "--items", str(path)])
    rows = pacsv.read_csv(out).to_pylist()
    assert list(rows[0])[:4] == ["user_id", "rank", "item_id", "title"]
    for row in rows:
        for column, title in (("item_id", "title"), ("because_attention", "because_attention_title"),
                              ("because_occlusion", "because_occlusion_title")):
            assert row[title] == names.get(row[column], row[column])
    assert any(row["title"].startswith("Title ") for row in rows)
