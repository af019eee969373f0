"""python -m streamrec.serve: a real server on 127.0.0.1 in a subprocess, spoken to over HTTP.

One server per module (small batches, a short batch timeout and a 20,000-byte body limit) answers
every test; the answers must equal `Recommender.recommend` called directly.
"""

from __future__ import annotations

import importlib.util
import json
import runpy
import socket
import sys
import urllib.error
import urllib.request
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from streamrec import Recommender
from streamrec import serve as streamrec_serve

_harness = importlib.util.spec_from_file_location("serving_harness", Path(__file__).parents[1] / "serving_harness.py")
serving_harness = importlib.util.module_from_spec(_harness)
_harness.loader.exec_module(serving_harness)
local_server = serving_harness.local_server

pytestmark = pytest.mark.slow  # end-to-end: real processes, servers or training; `pytest -m "not slow"` skips them

MAX_BODY = 20_000
TIMEOUT = 30  # seconds per HTTP request


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
def rec(tiny_ckpt: Path) -> Recommender:
    return Recommender.load(tiny_ckpt)


@pytest.fixture(scope="module")
def server(tiny_ckpt: Path, tmp_path_factory: pytest.TempPathFactory) -> str:
    log = tmp_path_factory.mktemp("serve") / "server.log"
    args = ["--ckpt", str(tiny_ckpt), "--max-batch-size", "8", "--batch-timeout", "0.05", "--threads", "1",
            "--max-body-bytes", str(MAX_BODY), "--log-level", "warning"]
    with local_server("streamrec.serve", args, log) as url:
        yield url


def expected(rec: Recommender, history: list[str], top_k: int = 10, exclude_seen: bool = True,
             items: list[str] | None = None) -> list[tuple[str, float]]:
    return rec.recommend([history], top_k=top_k, exclude_seen=exclude_seen, items=items)[0]


def assert_same(answer: dict, ranked: list[tuple[str, float]]) -> None:
    assert [i["item_id"] for i in answer["items"]] == [item for item, _ in ranked]
    assert [i["score"] for i in answer["items"]] == pytest.approx([s for _, s in ranked], rel=1e-4, abs=1e-5)


def test_health_reports_ready(server):
    with urllib.request.urlopen(server + "/health", timeout=TIMEOUT) as response:
        assert (response.status, response.read()) == (200, b"ok")


def test_answers_equal_the_python_api(server, rec):
    known = rec.vocab.items
    status, answer = post(server, {"history": known[:4] + ["not-an-item"], "top_k": 5})
    assert status == 200
    assert_same(answer, expected(rec, known[:4] + ["not-an-item"], 5))
    assert answer["unknown_items"] == ["not-an-item"] and answer["cold"] is False

    shelf = known[10:20] + ["gone"]
    status, answer = post(server, {"history": known[10:14], "top_k": 3, "exclude_seen": False, "items": shelf})
    assert status == 200
    assert_same(answer, expected(rec, known[10:14], 3, exclude_seen=False, items=shelf))
    assert {i["item_id"] for i in answer["items"]} <= set(shelf) and answer["unknown_items"] == ["gone"]

    status, answer = post(server, {"history": ["nobody-knows"]})
    assert (status, answer) == (200, {"items": [], "unknown_items": ["nobody-knows"], "cold": True})


def test_concurrent_requests_are_not_mixed_up(server, rec):
    known = rec.vocab.items
    histories = [known[i : i + 1 + i % 5] for i in range(24)]
    ks = [1 + i % 7 for i in range(24)]
    with ThreadPoolExecutor(12) as pool:
        answers = list(pool.map(lambda h, k: post(server, {"history": h, "top_k": k}), histories, ks))
    direct = [rec.recommend([h], top_k=k)[0] for h, k in zip(histories, ks, strict=True)]
    for (status, answer), ranked in zip(answers, direct, strict=True):
        assert status == 200
        assert_same(answer, ranked)


def test_explanations_on_request(server, rec):
    history = rec.vocab.items[:5]
    status, answer = post(server, {"history": history, "top_k": 3, "explain": True})
    assert status == 200
    why = rec.explain(history, top_k=3)
    assert_same(answer, why.recommendations)
    explanation = answer["explanation"]
    assert explanation["history"] == why.history
    assert explanation["attention"] == pytest.approx(why.attention, abs=1e-5)
    assert [b["item_id"] for b in explanation["because"]] == [item for item, _ in why.recommendations]
    assert [(b["most_attended"], b["most_important"]) for b in explanation["because"]] == [
        (a, r) for a, r, _ in why.because]
    status, answer = post(server, {"history": ["nobody-knows"], "explain": True})
    assert status == 200 and answer["explanation"] is None and answer["cold"] is True


BAD = {
    "malformed JSON": b'{"history": ["a"',
    "not an object": b'["a", "b"]',
    "NaN": b'{"history": ["a"], "top_k": NaN}',
    "unknown field": {"history": ["a"], "topk": 3},
    "missing history": {"top_k": 3},
    "both top_k and its old name k": {"history": ["a"], "top_k": 3, "k": 3},
    "history is a string": {"history": "a"},
    "top_k is zero": {"history": ["a"], "top_k": 0},
    "top_k above the catalogue": {"history": ["a"], "top_k": 10_000},
    "top_k is a float": {"history": ["a"], "top_k": 2.5},
    "top_k is true": {"history": ["a"], "top_k": True},
    "exclude_seen is a string": {"history": ["a"], "exclude_seen": "no"},
    "a fraction in the history": {"history": ["a", 3.5]},
    "true in the history": {"history": ["a", True]},
    "oversize body": {"history": ["x" * 100] * (MAX_BODY // 100)},
    "cold_slots above top_k": {"history": ["a"], "top_k": 2, "cold_slots": 3},
    "cold_slots with explain": {"history": ["a"], "cold_slots": 1, "explain": True},
}


@pytest.mark.parametrize("body", BAD.values(), ids=BAD.keys())
def test_bad_requests_get_a_one_line_4xx_and_the_server_keeps_serving(server, rec, body):
    status, answer = post(server, body)
    assert 400 <= status < 500, answer
    assert list(answer) == ["error"] and "\n" not in answer["error"] and answer["error"]
    history = rec.vocab.items[:3]
    status, answer = post(server, {"history": history, "top_k": 2})
    assert status == 200
    assert_same(answer, expected(rec, history, 2))


def test_cold_slots_reach_the_api_and_a_shorter_list_is_not_cut_from_a_longer_one(server, rec):
    history = rec.vocab.items[:4]
    with ThreadPoolExecutor(2) as pool:  # sent together: may share a batch
        answers = list(pool.map(lambda k: post(server, {"history": history, "top_k": k, "cold_slots": 1}), (2, 5)))
    for (status, answer), k in zip(answers, (2, 5), strict=True):
        assert status == 200
        assert_same(answer, rec.recommend([history], top_k=k, cold_slots=1)[0])


def test_the_old_field_k_is_refused(server, rec):
    status, answer = post(server, {"history": rec.vocab.items[:4], "k": 3})
    assert status == 422 and answer["error"].startswith("unknown field `k`; allowed fields: history, top_k")


def test_errors_name_the_problem(server, rec):
    assert post(server, {"history": ["a"], "top_k": 0})[1]["error"] == (
        f"`top_k` (0) must be between 1 and {min(1000, rec.vocab.num_items)}")
    assert "unknown field `topk`" in post(server, {"history": ["a"], "topk": 3})[1]["error"]
    assert post(server, b"x" * (MAX_BODY + 1))[0] == 413
    assert post(server, b'{"history": ["a"], "top_k": 1, "top_k": 2}')[0] == 400
    with pytest.raises(urllib.error.HTTPError) as err:  # other routes answer JSON errors too
        urllib.request.urlopen(server + "/nowhere", timeout=TIMEOUT)
    assert err.value.code == 404 and json.loads(err.value.read()) == {"error": "Not Found"}


def test_list_errors_name_the_element(server):
    # The checker's fast path (every element a short string) must fall back to naming the bad element.
    assert post(server, {"history": ["a", "b", 3.5]})[1]["error"] == (
        "`history[2]` must be an item id (a string or an integer), got float 3.5")
    long_id = "x" * (streamrec_serve.MAX_ID_CHARS + 1)
    assert post(server, {"history": ["a", long_id]})[1]["error"] == (
        f"`history[1]` has {len(long_id)} characters; must be at most {streamrec_serve.MAX_ID_CHARS}")


def test_unknown_items_and_cold_per_request(server, rec):
    known = rec.vocab.items[:2]
    status, answer = post(server, {"history": ["zz1", known[0], "zz1", "zz2"], "items": [known[1], "zz3", "zz2"]})
    assert status == 200 and answer["unknown_items"] == ["zz1", "zz2", "zz3"] and answer["cold"] is False
    status, answer = post(server, {"history": ["zz1"], "items": [known[1]]})
    assert status == 200 and answer["unknown_items"] == ["zz1"] and answer["cold"] is True and answer["items"] == []


def test_integer_ids_are_their_string_form_as_in_the_python_api(server, rec):
    """Amazon's and MovieLens' ids are numbers: 12 asks for the item "12", as `Recommender.recommend` reads it."""
    status, answer = post(server, {"history": [12, rec.vocab.items[0]], "items": [7, rec.vocab.items[1]]})
    assert status == 200 and answer["unknown_items"] == ["12", "7"] and answer["cold"] is False
    assert_same(answer, rec.recommend([[12, rec.vocab.items[0]]], items=[7, rec.vocab.items[1]])[0])


def test_an_answer_json_cannot_hold_fails_alone():
    api = streamrec_serve.StreamRecAPI("unused.ckpt")
    ok = api.encode_response({"items": [{"item_id": "é", "score": 1.5}]})
    assert ok.status_code == 200 and json.loads(ok.body) == {"items": [{"item_id": "é", "score": 1.5}]}
    bad = api.encode_response({"items": [{"item_id": "a", "score": float("nan")}]})
    assert bad.status_code == 500 and list(json.loads(bad.body)) == ["error"] and b"\n" not in bad.body


def test_bad_checkpoints_stop_with_one_line(exit_line, hostile, assert_refused, tiny_ckpt, tmp_path):
    message = exit_line(streamrec_serve.main, ["--ckpt", str(tmp_path / "missing.ckpt")])
    assert "missing.ckpt" in message
    bad, marker = hostile("in_hparams", tiny_ckpt)
    assert_refused(exit_line(streamrec_serve.main, ["--ckpt", str(bad)]), bad, marker)


def test_a_port_in_use_stops_with_one_line(exit_line, tiny_ckpt):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        message = exit_line(streamrec_serve.main, ["--ckpt", str(tiny_ckpt), "--port", str(port)])
    assert f"--port {port}: cannot listen on 127.0.0.1:{port}" in message


def test_help_lists_the_options_and_the_local_default(monkeypatch, capsys):
    """`python -m streamrec.serve --help`, its `__main__` run in this process: a child would only import torch again."""
    monkeypatch.setattr(sys, "argv", ["streamrec.serve", "--help"])
    with warnings.catch_warnings(), pytest.raises(SystemExit) as exit_:
        warnings.simplefilter("ignore", RuntimeWarning)  # runpy: the module is imported already, by this file
        runpy.run_module("streamrec.serve", run_name="__main__")
    assert exit_.value.code == 0
    stdout = capsys.readouterr().out
    for option in ("--ckpt", "--host", "--port", "--max-batch-size", "--batch-timeout", "--workers",
                   "--max-body-bytes", "default 127.0.0.1"):
        assert option in stdout
    assert streamrec_serve.build_parser().parse_args(["--ckpt", "x"]).host == "127.0.0.1"  # LitServe: 0.0.0.0


def test_an_explained_answer_encodes_the_history_once(tiny_ckpt, monkeypatch):
    # In process, without HTTP: the explained answer reports the request's unknown ids (history, then allow-list)
    # as the plain one does. The history is looked up twice: once by the server, once inside Recommender.explain.
    api = streamrec_serve.StreamRecAPI(str(tiny_ckpt))
    api.load("cpu")
    known = api.rec.vocab.items[:4]
    request = {"history": ["zz1", *known[:3]], "top_k": 2, "exclude_seen": True, "items": [known[3], "zz2"],
               "explain": True, "cold_slots": 0}
    lookups = []
    encode = api.rec.encode
    monkeypatch.setattr(api.rec, "encode", lambda ids: lookups.append(list(ids)) or encode(ids))
    answer = api.predict_many([request])[0]
    assert answer["unknown_items"] == ["zz1", "zz2"] and answer["cold"] is False
    assert answer["explanation"] is not None
    assert lookups.count(request["history"]) == 2
    plain = api.predict_many([{**request, "explain": False}])[0]
    assert plain["unknown_items"] == answer["unknown_items"]
