"""Every reader of user files, fed random bytes and random mixes of good and bad rows, either parses or
raises `InputError` with one line: never another exception (hypothesis)."""

from __future__ import annotations

import io
import tempfile
from collections.abc import Callable
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from core.runtime.checkpoint import load_checkpoint
from core.runtime.cli import config_chain
from core.runtime.errors import InputError
from streamrec.data.items import read_items
from streamrec.data.readers import ReadOptions, read_interactions
from streamrec.score import _read_users
from translate.data.corpus import read_lines, read_parallel
from translate.infer import read_chunks

FOLDER = Path(tempfile.mkdtemp(prefix="readers_fuzz_"))
SETTINGS = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Pieces of lines people's files really hold, good and bad, mixed at random below.
FIELDS = ["u1", "u2", "i1", "i2", "", " ", "1", "2.5", "-3", "nan", "inf", "1e400", "abc", '"', '""', '"a,b"',
          "x" * 200, "é", "\u2028", "\ufeff", "\x00", "\t", ",", "\r", "user_id", "item_id", "timestamp", "🙂"]
SEPARATORS = [",", "\t", " ", ";", "  "]


@st.composite
def row_mixes(draw) -> bytes:
    header = draw(st.sampled_from(["user_id,item_id,timestamp", "user_id\titem_id\ttimestamp", "user_id,item_id",
                                   "", "a,b,c", "\ufeffuser_id,item_id,timestamp"]))
    rows = draw(st.lists(st.lists(st.sampled_from(FIELDS) | st.text(max_size=8), max_size=5), max_size=12))
    sep = draw(st.sampled_from(SEPARATORS))
    end = draw(st.sampled_from(["\n", "\r\n", "", "\n\n"]))
    text = header + "\n" + "\n".join(sep.join(r) for r in rows) + end
    return text.encode("utf-8", errors="surrogatepass")


CONTENTS = st.binary(max_size=400) | row_mixes()


def _holds(call: Callable[[], object]) -> None:
    try:
        call()
    except InputError as err:
        assert "\n" not in str(err).strip(), repr(str(err))
    except FileNotFoundError as err:  # only for a file that is not there; never here
        raise AssertionError(f"FileNotFoundError on an existing file: {err}") from err


def _file(name: str, data: bytes) -> Path:
    path = FOLDER / name
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("name,fmt", [("log.csv", "auto"), ("log.tsv", "auto"), ("log.txt", "auto"),
                                      ("log.dat", "sasrec"), ("log.dat", "lines"), ("log.csv", "tsv"),
                                      ("log.parquet", "auto"), ("log.csv", "parquet"), ("ratings.dat", "movielens")])
@SETTINGS
@given(data=CONTENTS)
def test_interaction_readers(name: str, fmt: str, data: bytes) -> None:
    _holds(lambda: read_interactions(_file(name, data), fmt))


# Reading options that take other paths through the steps: other delimiters, no header, times, filters.
OPTIONS = [ReadOptions(delimiter=";"), ReadOptions(delimiter="\t", header=False, user_col="0", item_col="1",
                                                   time_col="2"),
           ReadOptions(header=False, columns=("user_id", "item_id", "timestamp")), ReadOptions(time_format="iso"),
           ReadOptions(time_format="%Y-%m-%d"), ReadOptions(filter="timestamp >= 1"),
           ReadOptions(filter="item_id in [i1, 2.5]", duplicates="drop", k_core=2),
           ReadOptions(duplicates="error", min_item_count=2, time_col=None)]
TIMES = ["2024-05-01", "2024-05-01T10:00:00Z", "2024-05-01 10:00:00+02:00", "2024-13-01", "1714521600", "T"]


@pytest.mark.parametrize("options", OPTIONS, ids=range(len(OPTIONS)))
@SETTINGS
@given(data=CONTENTS | st.lists(st.tuples(st.sampled_from(FIELDS[:4]), st.sampled_from(FIELDS[:4]),
                                          st.sampled_from(TIMES)), max_size=8).map(
    lambda rows: "".join(",".join(r) + "\n" for r in rows).encode()))
def test_interaction_readers_with_options(options: ReadOptions, data: bytes) -> None:
    _holds(lambda: read_interactions(_file("log.csv", data), options=options))


@SETTINGS
@given(data=CONTENTS)
def test_text_readers(data: bytes) -> None:
    _holds(lambda: _read_users(str(_file("users.txt", data))))
    _holds(lambda: read_lines(_file("corpus.en", data)))
    _holds(lambda: read_parallel(_file("a.en", data), _file("a.de", data[: len(data) // 2])))
    _holds(lambda: [chunk for chunk in read_chunks(io.BytesIO(data), 3, "stdin")])
    _holds(lambda: config_chain(str(_file("config.yaml", data))))
    _holds(lambda: read_items(_file("items.csv", data)))
    _holds(lambda: read_items(_file("movies.dat", b"1::" + data)))


@SETTINGS
@given(data=st.binary(max_size=400) | st.sampled_from([b"PK\x03\x04", b"\x80\x02}q\x00.", b"\x80\x04\x95"]))
def test_checkpoint_reader(data: bytes) -> None:
    _holds(lambda: load_checkpoint(_file("x.ckpt", data), "python -m streamrec fit"))


COLUMN = st.one_of(
    st.lists(st.text(max_size=5) | st.none(), min_size=3, max_size=3),
    st.lists(st.integers(-2**63, 2**63 - 1) | st.none(), min_size=3, max_size=3),
    st.lists(st.floats() | st.none(), min_size=3, max_size=3),
    st.lists(st.binary(max_size=4), min_size=3, max_size=3),
    st.lists(st.lists(st.integers(0, 9), max_size=2), min_size=3, max_size=3),
)


@SETTINGS
@given(user=COLUMN, item=COLUMN, time=COLUMN, drop=st.sampled_from([None, "user_id", "timestamp"]))
def test_parquet_rows_of_any_type(user, item, time, drop) -> None:
    columns = {"user_id": user, "item_id": item, "timestamp": time}
    columns.pop(drop, None)
    path = FOLDER / "typed.parquet"
    pq.write_table(pa.table(columns), path)
    _holds(lambda: read_interactions(path))
