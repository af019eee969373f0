"""data/prepare_title_features.py: hashed title n-grams (counted by hand) and attribute ids, read back by the
features reader the model trains on."""

from __future__ import annotations

import hashlib
import json

import pytest

from streamrec.data.features import read_item_features

BIG = 1 << 40  # no two of a handful of grams share a bucket


@pytest.fixture(scope="module")
def script(data_script):
    return data_script("prepare_title_features")


def _bucket(gram: str, buckets: int) -> str:
    return f"w{int.from_bytes(hashlib.blake2b(gram.encode(), digest_size=8).digest(), 'little') % buckets}"


def test_words_bigrams_and_character_trigrams_hash_as_written(script):
    assert script.title_ngrams("Red Nail-Polish, red!", BIG) == [
        _bucket(g, BIG) for g in ("red", "nail", "polish", "red nail", "nail polish", "polish red")]
    assert script.title_ngrams("Gel", BIG, char_ngrams=3) == [_bucket(g, BIG) for g in ("gel", "#c#ge", "#cgel",
                                                                                         "#cel#")]
    assert script.title_ngrams("", BIG) == [] and len(set(script.title_ngrams("a b c d e", 2))) <= 2


def test_the_file_joins_titles_and_attributes_and_the_reader_takes_it(script, tmp_path):
    items = tmp_path / "items.csv"
    items.write_text('item_id,asin,title\n1,A1,"Red Nail Polish"\n2,A2,\n3,A3,Shampoo\n', encoding="utf-8")
    attributes = tmp_path / "attrs.json"
    attributes.write_text(json.dumps({"1": [4, 7], "3": [7]}), encoding="utf-8")
    out = tmp_path / "features.csv"
    script.main(["--items", str(items), "--attributes", str(attributes), "--buckets", str(BIG), "--out", str(out)])
    features = read_item_features(out, ["words", "attributes"])
    assert features["1"] == [f"words={_bucket(g, BIG)}" for g in ("red", "nail", "polish", "red nail",
                                                                   "nail polish")] + ["attributes=4", "attributes=7"]
    assert features["3"] == [f"words={_bucket('shampoo', BIG)}", "attributes=7"] and "2" not in features
    with pytest.raises(SystemExit, match="needs an item_id column and a 'name' column"):
        script.main(["--items", str(items), "--title-column", "name", "--out", str(tmp_path / "x.csv")])
