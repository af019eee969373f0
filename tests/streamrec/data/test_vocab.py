"""streamrec.data.vocab.ItemVocab (arrow ids, sorted hashes) behaves as the list + dict vocabulary it replaced.

The reference below is that implementation, kept verbatim in spirit: a list of strings and a dict.
"""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import streamrec.data.vocab as vocab_module
from streamrec.data.vocab import ItemVocab, encode_codes

ROOT = Path(__file__).resolve().parents[3]


class ReferenceVocab:
    """The vocabulary before: `items` a list of strings, `index` a dict."""

    def __init__(self, items):
        self.items = [str(i) for i in items]
        self.index = {item: k + 1 for k, item in enumerate(self.items)}
        if len(self.index) != len(self.items):
            dup = next(i for i in self.items if self.items.count(i) > 1)
            raise ValueError(f"item id {dup!r} appears twice in the vocabulary; ids must be unique")

    def encode(self, items, skip_unknown=False):
        items = list(items)
        unknown = [i for i in items if i not in self.index]
        if unknown and not skip_unknown:
            raise ValueError("unknown")
        return [self.index[i] for i in items if i in self.index]

    def decode(self, ids):
        ids = list(ids)
        if any(not 1 <= i <= len(self.items) for i in ids):
            raise ValueError("bad id")
        return [self.items[i - 1] for i in ids]


def collide(s: object) -> int:
    """A hash under which many ids share a value: the paths that settle collisions by comparing strings run."""
    return 0 if s is None else len(s) % 3


ids_lists = st.lists(st.text(max_size=6), max_size=40, unique=True)


def check_same(ours: ItemVocab, ref: ReferenceVocab, queries: list[object]) -> None:
    assert ours.items == ref.items and list(ours.items) == ref.items and len(ours) == len(ref.items)
    assert ours.num_items == len(ref.items)
    assert list(ours.index) == list(ref.index) and len(ours.index) == len(ref.index)
    for q in queries:
        assert (q in ours) == (q in ref.index) == (q in ours.index), q
        assert ours.index.get(q) == ref.index.get(q), q
        if q in ref.index:
            assert ours.index[q] == ref.index[q]
        else:
            with pytest.raises(KeyError):
                ours.index[q]
    assert ours.lookup(queries).tolist() == [ref.index.get(q, 0) for q in queries]
    assert ours.encode(queries, skip_unknown=True) == ref.encode(queries, skip_unknown=True)
    if all(q in ref.index for q in queries):
        assert ours.encode(queries) == ref.encode(queries)
    else:
        with pytest.raises(ValueError, match="unknown item ids"):
            ours.encode(queries)
    ids = list(range(1, len(ref.items) + 1))[::-1]
    assert ours.decode(ids) == ref.decode(ids) and ours.decode(torch.tensor(ids, dtype=torch.long)) == ref.decode(ids)


@settings(max_examples=60, deadline=None)
@given(items=ids_lists, extra=st.lists(st.text(max_size=6), max_size=10), data=st.data())
def test_matches_the_list_and_dict_vocabulary(items: list[str], extra: list[str], data: st.DataObject) -> None:
    queries = data.draw(st.permutations(items + extra)) + [None, 7]
    check_same(ItemVocab(items), ReferenceVocab(items), queries)
    check_same(ItemVocab(pa.array(items, pa.string())), ReferenceVocab(items), queries)


@settings(max_examples=40, deadline=None)
@given(items=ids_lists, extra=st.lists(st.text(max_size=6), max_size=10))
def test_matches_the_reference_when_hashes_collide(items: list[str], extra: list[str]) -> None:
    saved = vocab_module._hash
    vocab_module._hash = collide
    try:
        check_same(ItemVocab(items), ReferenceVocab(items), items[::-1] + extra)
    finally:
        vocab_module._hash = saved


@pytest.mark.parametrize("hash_fn", [hash, collide])
def test_a_duplicate_is_named_as_before_even_between_colliding_ids(hash_fn) -> None:
    items = ["x", "ab", "cd", "ab", "q", "x"]  # under `collide` "ab", "cd" share a hash; so do "x", "q"
    saved = vocab_module._hash
    vocab_module._hash = hash_fn
    try:
        with pytest.raises(ValueError) as ours:
            ItemVocab(items)
    finally:
        vocab_module._hash = saved
    with pytest.raises(ValueError) as ref:
        ReferenceVocab(items)
    assert str(ours.value) == str(ref.value) == "item id 'x' appears twice in the vocabulary; ids must be unique"


def test_non_strings_become_their_text_as_before_and_are_never_found() -> None:
    ours, ref = ItemVocab([1, 2, "a"]), ReferenceVocab([1, 2, "a"])
    assert ours.items == ref.items == ["1", "2", "a"]
    assert 1 not in ours and "1" in ours and ours.lookup([1, "1"]).tolist() == [0, 1]
    with pytest.raises(TypeError):
        [] in ours.index  # unhashable, as for the dict  # noqa: B015
    with pytest.raises(TypeError, match="unhashable"):
        ours.lookup(["a", []])  # as `in` and the dict: lookup and `in` never disagree
    # Bytes are no id (and hash(b"a") == hash("a")): arrow must not read them as text in lookup either.
    assert b"a" not in ours and b"a" not in ref.index and ours.lookup([b"a", "a", b"1"]).tolist() == [0, 3, 0]
    assert ours.lookup([b"a"]).tolist() == [0]


def test_a_string_that_is_not_utf8_is_never_found_and_no_id() -> None:
    vocab = ItemVocab(["a"])
    assert "\ud800" not in vocab and vocab.lookup(["a", "\ud800"]).tolist() == [1, 0]
    with pytest.raises(ValueError, match="is not valid UTF-8 text"):
        ItemVocab(["a", "\ud800"])


def test_items_is_a_read_only_list() -> None:
    vocab = ItemVocab(["c", "a", "b"])
    assert vocab.items[0] == "c" and vocab.items[-1] == "b" and vocab.items[1:] == ["a", "b"]
    assert vocab.items[::-1] == ["b", "a", "c"] and list(reversed(vocab.items)) == ["b", "a", "c"]
    assert vocab.items.index("a") == 1 and vocab.items.count("a") == 1 and "b" in vocab.items
    with pytest.raises(IndexError):
        vocab.items[3]
    assert vocab.items == ItemVocab(["c", "a", "b"]).items and vocab.items != ItemVocab(["c", "b", "a"]).items
    assert vocab.items != ["c", "a"] and ["c", "a", "b"] == vocab.items
    assert json.loads(json.dumps(vocab.to_dict())) == {"items": ["c", "a", "b"]}


def test_decode_refuses_padding_and_out_of_range_ids() -> None:
    vocab = ItemVocab(["a", "b"])
    for bad in ([0], [3], [1, -1]):
        with pytest.raises(ValueError, match=r"is not an item; ids run 1..2 \(0 is padding\)"):
            vocab.decode(bad)
    assert vocab.decode([]) == []


def test_build_and_encode_codes_match_the_reference() -> None:
    rng = np.random.default_rng(0)
    item_ids = [f"{k}" for k in rng.permutation(300)] + ["x", "y"]
    codes = rng.integers(0, len(item_ids) - 1, 2000).astype(np.int32)  # "y" never used: it leaves the vocabulary
    codes[0] = len(item_ids) - 2  # "x" is: the ids then sort as strings, not numbers
    vocab, model_ids = encode_codes(item_ids, codes)
    used = sorted({item_ids[c] for c in codes.tolist()})
    assert vocab.items == used and "y" not in vocab and "x" in vocab
    assert ItemVocab.build(["10", "9", "x"]).items == ["10", "9", "x"]
    assert ItemVocab.build(["10", "9"]).items == ["9", "10"]
    ref = ReferenceVocab(used)
    assert model_ids.tolist() == [ref.index[item_ids[c]] for c in codes.tolist()]


def test_a_pickled_vocabulary_works_in_a_process_with_another_hash_seed(tmp_path: Path) -> None:
    """Hashes of strings differ between processes (PYTHONHASHSEED), so pickling must not carry them. One child
    (each imports torch again) under a seed that is not this process's."""
    items = [f"item{k}" for k in range(1000)]
    (tmp_path / "v.pkl").write_bytes(pickle.dumps(ItemVocab(items)))
    code = ("import pickle, sys; v = pickle.loads(open(sys.argv[1], 'rb').read()); "
            "print(v.lookup(['item0', 'item999', 'nope']).tolist(), 'item5' in v, v.index['item7'], hash('item7'))")
    seed = "2" if os.environ.get("PYTHONHASHSEED") == "1" else "1"  # not this process's seed
    out = subprocess.run([sys.executable, "-c", code, str(tmp_path / "v.pkl")], cwd=ROOT, capture_output=True,
                         text=True, env={"PYTHONHASHSEED": seed, "PATH": ""}, check=True)
    *found, child_hash = out.stdout.split()
    assert " ".join(found) == "[1, 1000, 0] True 8"
    assert int(child_hash) != hash("item7")  # the child really hashed differently



def test_holds_no_python_string_per_item() -> None:
    """The point of the arrow layout: far fewer bytes than the list and dict of 200k ids (~30 MB)."""
    vocab = ItemVocab(pa.array([f"i{k}" for k in range(200_000)]))
    held = vocab._ids.nbytes + vocab._sorted.nbytes + vocab._order.nbytes
    assert held < 30 * 200_000  # ~ 25 bytes an item; a str object alone is 50+, a dict entry 30+ more
    assert vocab.lookup(["i0", "i199999", "i200000"]).tolist() == [1, 200_000, 0]
