"""The old names `beam` and `nbest` (CLI `--beam`, `--nbest`, the server's `beam` field) are refused in one line;
`beam_size` and `n_best` are the only names."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from core.runtime.serving.schema import RequestError
from translate import Translator, infer
from translate.data.vocab import BOS_ID, EOS_ID
from translate.search.decoding import beam_search
from translate.serve import check_request

FIXTURE = str(Path(__file__).parent / "fixtures" / "legacy_transformer.ckpt")  # any checkpoint will do


@pytest.mark.parametrize("flag", ["--beam", "--nbest"])
def test_old_cli_flags_are_refused(flag, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_:
        infer.main(["--ckpt", FIXTURE, "-i", str(tmp_path / "in.en"), "-o", str(tmp_path / "out"), flag, "3"])
    assert exit_.value.code == 2
    error = capsys.readouterr().err.strip().splitlines()[-1]
    assert error.endswith(f"unrecognized arguments: {flag} 3")  # not read as a prefix of --beam-size
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("old", ["beam", "nbest"])
def test_old_api_keywords_are_refused(old):
    t = Translator.load(FIXTURE)
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'") as err:
        t.translate(["he can sleep ."], **{old: 2})
    assert "\n" not in str(err.value)
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
        t.translate_iter(["he can sleep ."], **{old: 2})
    with pytest.raises(TypeError, match=f"unexpected keyword argument '{old}'"):
        beam_search(t.model, torch.tensor([[5, 6]]), BOS_ID, EOS_ID, **{old: 2})


def test_old_server_field_is_refused():
    with pytest.raises(RequestError, match="unknown field `beam`; allowed fields: sentences, text, beam_size") as err:
        check_request({"text": "a", "beam": 3})
    assert "\n" not in str(err.value)
