"""python -m translate.serve: a real server on 127.0.0.1 in a subprocess, spoken to over HTTP.

One server (small batches, a short batch timeout and a 20,000-byte body limit) answers every request of one
test; the answers must equal `Translator.translate` called directly.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
import sys
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from translate import Translator
from translate import serve as translate_serve

_harness = importlib.util.spec_from_file_location("serving_harness", Path(__file__).parents[1] / "serving_harness.py")
serving_harness = importlib.util.module_from_spec(_harness)
_harness.loader.exec_module(serving_harness)
local_server = serving_harness.local_server

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

MAX_BODY = 20_000
TIMEOUT = 60  # seconds per HTTP request


def post(url: str, body: bytes | dict) -> tuple[int, dict]:
    """POST to /predict; (status, parsed JSON answer), 4xx and 5xx included."""
    data = body if isinstance(body, bytes) else json.dumps(body).encode()
    request = urllib.request.Request(url + "/predict", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as err:
        with err:
            return err.code, json.loads(err.read())


@pytest.fixture(scope="module")
def ckpt(demo_dir, tmp_path_factory, train_tiny_checkpoint) -> Path:
    return train_tiny_checkpoint(demo_dir, tmp_path_factory.mktemp("serve_ckpt"))[0]


@pytest.fixture(scope="module")
def translator(ckpt) -> Translator:
    return Translator.load(ckpt)


@pytest.fixture(scope="module")
def lines(demo_dir) -> list[str]:
    sources = (demo_dir / "test.en").read_text(encoding="utf-8").splitlines()[:6]
    return [sources[0], "", *sources[1:]]


@pytest.fixture(scope="module")
def server(ckpt, tmp_path_factory) -> str:
    log = tmp_path_factory.mktemp("serve") / "server.log"
    args = ["--ckpt", str(ckpt), "--max-batch-size", "8", "--batch-timeout", "0.05", "--threads", "1",
            "--max-body-bytes", str(MAX_BODY), "--log-level", "warning"]
    with local_server("translate.serve", args, log) as url:
        yield url


def as_json(t) -> dict:
    return {"text": t.text, "score": t.score, "log_prob": t.log_prob}


def assert_same(got: list, want: list) -> None:
    """Served translations equal direct ones: the same texts, scores to float32 rounding (batches differ)."""
    assert len(got) == len(want)
    for g, w in zip(got, want, strict=True):
        if isinstance(w, list):
            assert_same(g, w)
        elif isinstance(w, str):
            assert g == w
        else:
            assert g["text"] == w["text"]
            assert (g["score"], g["log_prob"]) == pytest.approx((w["score"], w["log_prob"]), rel=1e-4, abs=1e-5)


BAD = {
    "malformed JSON": b'{"sentences": ["a"',
    "not an object": b'"a sentence"',
    "unknown field": {"sentences": ["a"], "beam_width": 3},
    "neither sentences nor text": {"beam_size": 3},
    "both sentences and text": {"sentences": ["a"], "text": "b"},
    "sentences is a string": {"sentences": "a"},
    "no sentences": {"sentences": []},
    "too many sentences": {"sentences": ["a"] * (translate_serve.MAX_SENTENCES + 1)},
    "a sentence too long": {"text": "a " * translate_serve.MAX_CHARS},
    "beam zero": {"text": "a", "beam_size": 0},
    "old and new name": {"text": "a", "beam": 2, "beam_size": 2},
    "beam too wide": {"text": "a", "beam_size": translate_serve.MAX_BEAM + 1},
    "n_best above beam": {"text": "a", "beam_size": 2, "n_best": 3},
    "return_scores is a number": {"text": "a", "return_scores": 1},
    "oversize body": {"sentences": ["x" * 900] * 25},
}


def test_the_server_is_ready_answers_as_the_python_api_and_refuses_bad_requests_in_one_line(server, translator,
                                                                                             lines):
    """Every request to the module's one server, in one test: pytest-xdist may hand the tests of a module to
    different workers, and each worker that runs a test of the `server` fixture starts a server of its own."""
    with urllib.request.urlopen(server + "/health", timeout=TIMEOUT) as response:
        assert (response.status, response.read()) == (200, b"ok")

    # answers equal the Python API's
    status, answer = post(server, {"sentences": lines, "beam_size": 3})
    assert status == 200
    want = [as_json(t) for t in translator.translate(lines, beam_size=3, return_scores=True)]
    assert_same(answer["translations"], want)
    assert answer["translations"][1] == {"text": "", "score": 0.0, "log_prob": 0.0}  # a blank sentence

    status, answer = post(server, {"sentences": lines, "beam_size": 3, "n_best": 2})
    want = [[as_json(t) for t in row] for row in translator.translate(lines, beam_size=3, n_best=2)]
    assert status == 200 and answer["translations"][1] == []
    assert_same(answer["translations"], want)

    status, answer = post(server, {"sentences": lines, "beam_size": 1, "return_scores": False})
    assert (status, answer) == (200, {"translations": translator.translate(lines, beam_size=1)})

    status, answer = post(server, {"text": lines[0]})
    assert status == 200 and list(answer) == ["translation"]
    assert_same([answer["translation"]], [as_json(translator.translate(lines[:1], return_scores=True)[0])])

    # concurrent requests are not mixed up
    real = [s for s in lines if s]
    requests = [{"sentences": real[i % len(real):][: 1 + i % 3], "beam_size": 1 + 2 * (i % 2)} for i in range(12)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda r: post(server, r), requests))
    for r, (status, answer) in zip(requests, answers, strict=True):
        assert status == 200
        want = translator.translate(r["sentences"], beam_size=r["beam_size"], return_scores=True)
        assert_same(answer["translations"], [as_json(t) for t in want])

    # each bad request gets a one-line 4xx, and the server keeps serving
    good = {"translations": translator.translate(lines[:1], beam_size=1)}
    for name, body in BAD.items():
        status, answer = post(server, body)
        assert 400 <= status < 500, (name, answer)
        assert list(answer) == ["error"] and "\n" not in answer["error"] and answer["error"], (name, answer)
        assert post(server, {"sentences": lines[:1], "beam_size": 1, "return_scores": False}) == (200, good), name

    # the errors name the problem
    error = {"error": "`n_best` (3) must be between 1 and `beam_size` (2)"}
    assert post(server, BAD["n_best above beam"]) == (422, error)
    assert post(server, BAD["oversize body"])[0] == 413


def test_bad_checkpoints_stop_with_one_line(exit_line, hostile, assert_refused, ckpt, tmp_path):
    message = exit_line(translate_serve.main, ["--ckpt", str(tmp_path / "missing.ckpt")])
    assert "missing.ckpt" in message
    bad, marker = hostile("in_hparams", ckpt)
    assert_refused(exit_line(translate_serve.main, ["--ckpt", str(bad)]), bad, marker)


def test_help_lists_the_options_and_the_local_default(monkeypatch, capsys):
    """`python -m translate.serve --help`, its `__main__` run in this process: a child would only import torch again."""
    monkeypatch.setattr(sys, "argv", ["translate.serve", "--help"])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as exit_:
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already, by this file
        runpy.run_module("translate.serve", run_name="__main__")
    assert exit_.value.code == 0
    stdout = capsys.readouterr().out
    for option in ("--ckpt", "--host", "--port", "--max-batch-size", "--batch-timeout", "--workers",
                   "--max-body-bytes", "--dtype", "default 127.0.0.1"):
        assert option in stdout
    assert translate_serve.build_parser().parse_args(["--ckpt", "x"]).host == "127.0.0.1"  # LitServe: 0.0.0.0
