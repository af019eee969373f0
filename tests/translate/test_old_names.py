"""The old names `beam` and `nbest` (CLI `--beam`, `--nbest`) still work, each with a DeprecationWarning,
and give what the new names `beam_size` and `n_best` give."""

from __future__ import annotations

import pytest
import torch

from core.runtime.errors import InputError
from core.runtime.serve import RequestError
from translate import Translator, infer
from translate.data.vocab import BOS_ID, EOS_ID
from translate.search.decoding import beam_search
from translate.search.options import SearchOptions
from translate.serve import check_request, search_options


@pytest.fixture(scope="module")
def ckpt(demo_dir, tmp_path_factory, train_tiny_checkpoint):
    return train_tiny_checkpoint(demo_dir, tmp_path_factory.mktemp("old_names"))[0]


@pytest.fixture(scope="module")
def lines(demo_dir) -> list[str]:
    return (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:5]


def test_old_cli_flags(ckpt, lines, tmp_path):
    src = tmp_path / "in.en"
    src.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    infer.main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(tmp_path / "new"), "--beam-size", "3", "--n-best", "2"])
    with pytest.warns(DeprecationWarning) as caught:
        infer.main(["--ckpt", str(ckpt), "-i", str(src), "-o", str(tmp_path / "old"), "--beam", "3", "--nbest", "2"])
    messages = {str(w.message) for w in caught if w.category is DeprecationWarning}
    assert {"--beam is deprecated; use --beam-size", "--nbest is deprecated; use --n-best"} <= messages
    assert (tmp_path / "old").read_text(encoding="utf-8") == (tmp_path / "new").read_text(encoding="utf-8")
    assert all(len(row.split("\t")) == 2 for row in (tmp_path / "new").read_text(encoding="utf-8").splitlines())


def test_old_api_keywords(ckpt, lines):
    t = Translator.load(ckpt)
    with pytest.warns(DeprecationWarning, match="`beam` is deprecated; use `beam_size`"):
        assert t.translate(lines, beam=3, n_best=2) == t.translate(lines, beam_size=3, n_best=2)
    with pytest.warns(DeprecationWarning, match="`beam` is deprecated"):
        assert list(t.translate_iter(lines, beam=2)) == t.translate(lines, beam_size=2)
    src = torch.tensor([t.src_vocab.encode(lines[0])])
    with pytest.warns(DeprecationWarning, match="`nbest` is deprecated; use `n_best`"):
        old = beam_search(t.model, src, BOS_ID, EOS_ID, beam_size=3, nbest=3)
    assert old == beam_search(t.model, src, BOS_ID, EOS_ID, beam_size=3, n_best=3) and len(old[0]) == 3
    with pytest.raises(InputError, match="give `beam_size` only, not also the deprecated `beam`"):
        t.translate(lines, beam=2, beam_size=2)


def test_old_server_field():
    with pytest.warns(DeprecationWarning, match="`beam` is deprecated; use `beam_size`"):
        old = check_request({"text": "a", "beam": 3, "n_best": 2})
    assert old == check_request({"text": "a", "beam_size": 3, "n_best": 2})
    assert search_options(old) == SearchOptions(beam_size=3, n_best=2)
    with pytest.raises(RequestError, match="give `beam_size` only, not also the deprecated `beam`"):
        check_request({"text": "a", "beam": 3, "beam_size": 3})
