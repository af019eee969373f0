"""Item features: the file's categorical columns -> feature ids, cold items appended, bad input refused."""

from __future__ import annotations

import pytest
import torch

from core.runtime.errors import InputError
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.data.features import feature_table, read_item_features
from streamrec.data.vocab import ItemVocab

LOG = "user_id,item_id,timestamp\n" + "".join(f"u{u},i{(u + t) % 4},{t}\n" for u in range(6) for t in range(4))
ITEMS = "item_id,title,genres\ni0,A,x|y\ni1,B,y\ni2,C,\nc9,Cold,x|z|x\n"


def test_multi_valued_cells_become_column_value_features(write):
    path = write("items.csv", ITEMS)
    assert read_item_features(path, ["genres"]) == {"i0": ["genres=x", "genres=y"], "i1": ["genres=y"],
                                                    "c9": ["genres=x", "genres=z"]}  # i2: none; x once


def test_movielens_genres_are_split_as_shipped(write):
    path = write("movies.dat", "1::Toy Story (1995)::Animation|Children's|Comedy\n2::Heat (1995)::Action\n")
    assert read_item_features(path, ["genres"])["1"] == ["genres=Animation", "genres=Children's", "genres=Comedy"]


def test_feature_table_pads_with_zero():
    vocab = ItemVocab(["a", "b", "c"])
    table = feature_table(vocab, {"a": ["g=x", "g=y"], "c": ["g=y"], "other": ["g=z"]})
    assert table.values == ["g=x", "g=y", "g=z"]
    assert torch.equal(table.table, torch.tensor([[0, 0], [1, 2], [0, 0], [2, 0]]))


@pytest.mark.parametrize(("content", "columns", "wrong"), [
    (ITEMS, ["genre"], "no column 'genre'"),
    (ITEMS, ["item_id"], "the id is not a feature"),
    (ITEMS, [], "`feature_columns` is empty"),
    (ITEMS, ["genres", "genres"], "names a column twice"),
    ("item_id,genres\n", ["genres"], "lists no items"),
    ("item_id,genres\ni0,\n", ["genres"], "no item has a value"),
])
def test_bad_input_is_one_line_naming_the_file(write, content, columns, wrong):
    path = write("items.csv", content)
    with pytest.raises(InputError) as err:
        read_item_features(path, columns)
    assert str(path) in str(err.value) and wrong in str(err.value) and "\n" not in str(err.value)


def test_cold_items_are_appended_and_the_log_ids_stay(write):
    log = write("log.csv", LOG)
    plain = StreamRecDataModule(str(log), max_len=4)
    data = StreamRecDataModule(str(log), max_len=4, item_features=str(write("items.csv", ITEMS)),
                               feature_columns=["genres"])
    assert list(data.vocab.items) == [*plain.vocab.items, "c9"]
    for ours, theirs in ((data.splits.train, plain.splits.train), (data.splits.test, plain.splits.test)):
        assert repr(ours) == repr(theirs)  # the same histories and targets: c9 is never a target
    assert (data.num_features, data.features_per_item) == (3, 2)
    assert data.item_features[data.vocab.index["c9"]].tolist() == [1, 3]
    assert data.train_item_counts()[-1] == 0
    assert (plain.num_features, plain.features_per_item, plain.item_features) == (0, 0, None)


@pytest.mark.parametrize(("kwargs", "wrong"), [
    ({"item_features": "items.csv"}, "needs `feature_columns`"),
    ({"feature_columns": ["genres"]}, "needs `item_features`"),
    ({"item_features": "missing.csv", "feature_columns": ["genres"]}, "does not exist"),
])
def test_the_data_module_refuses_half_a_setting(write, kwargs, wrong, monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    write("items.csv", ITEMS)
    with pytest.raises((InputError, FileNotFoundError), match=wrong):
        StreamRecDataModule(str(write("log.csv", LOG)), **kwargs)


def test_a_file_of_other_ids_is_refused(write):
    data = StreamRecDataModule(str(write("log.csv", LOG)), item_features=str(write("items.csv", "item_id,g\nz,1\n")),
                               feature_columns=["g"])
    with pytest.raises(InputError, match="none of its 1 items is in the log"):
        _ = data.vocab


def test_an_item2attributes_json_is_read_as_the_attributes_column(tmp_path) -> None:
    import json

    from streamrec.data.features import read_item_features
    from streamrec.data.items import read_items

    path = tmp_path / "Beauty_item2attributes.json"
    path.write_text(json.dumps({"4": [1, 2, 3], "83": [4, 5, 6, 2], "90": [], "7": ["brand_x"]}))
    catalog = read_items(path)
    assert catalog.columns == ["attributes"] and catalog.title("4") == "4"
    assert read_item_features(path, ["attributes"]) == {
        "4": ["attributes=1", "attributes=2", "attributes=3"],
        "83": ["attributes=4", "attributes=5", "attributes=6", "attributes=2"],
        "7": ["attributes=brand_x"],
    }  # an item with no attribute has no features


@pytest.mark.parametrize(("text", "wrong"), [("{\"4\": [1,", "not a JSON object"), ("[1, 2]", "expected a JSON object"),
                                             ("{\"4\": 3}", "not a list of attribute ids"), ("{}", "an empty one")])
def test_a_bad_attributes_json_is_one_line_naming_the_file(tmp_path, text, wrong) -> None:
    from core.runtime.errors import InputError
    from streamrec.data.items import read_items

    path = tmp_path / "attrs.json"
    path.write_text(text)
    with pytest.raises(InputError) as err:
        read_items(path)
    assert str(path) in str(err.value) and wrong in str(err.value) and "\n" not in str(err.value)
