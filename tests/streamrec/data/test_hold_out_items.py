"""data/hold_out_items.py: a cold-item slice worked out by hand, the seeded draw, and bad logs refused by line."""

from __future__ import annotations

import json

import pytest


@pytest.fixture(scope="module")
def script(data_script):
    return data_script("hold_out_items")


def test_the_warm_log_and_the_cases_of_a_hand_made_log(script):
    log = {"u1": ["a", "X", "b", "Y", "c"],  # last held-out item after a warm one: Y, history a b
           "u2": ["X", "Y"],  # no warm item at all: dropped, no case
           "u3": ["X", "a", "b"],  # the held-out item comes first: no case
           "u4": ["b", "X", "X"]}  # a repeat: the later X, its history b
    warm, cases = script.hold_out(log, {"X", "Y"})
    assert warm == {"u1": ["a", "b", "c"], "u3": ["a", "b"], "u4": ["b"]}
    assert cases == [{"user": "u1", "history": ["a", "b"], "target": "Y"},
                     {"user": "u4", "history": ["b"], "target": "X"}]


def test_the_draw_is_seeded_and_takes_the_share_of_distinct_items(script):
    log = {f"u{u}": [f"i{(u * 7 + t) % 50}" for t in range(6)] for u in range(40)}
    first = script.draw(log, 0.2, seed=3)
    assert first == script.draw(log, 0.2, seed=3) != script.draw(log, 0.2, seed=4)
    assert len(first) == 10 == len(set(first)) and set(first) <= {i for seq in log.values() for i in seq}


def test_the_files_are_written_and_read_back(script, tmp_path):
    log = tmp_path / "log.txt"
    log.write_text("".join(f"u{u} " + " ".join(f"i{(u + t) % 30}" for t in range(5)) + "\n" for u in range(60)))
    script.main(["--log", str(log), "--share", "0.1", "--out", str(tmp_path / "out")])
    held = json.loads((tmp_path / "out/cold.json").read_text())["held_out"]
    assert len(held) == 3
    lines = (tmp_path / "out/warm.txt").read_text().splitlines()
    assert len(lines) == 60 and not {i for line in lines for i in line.split()[1:]} & set(held)


@pytest.mark.parametrize(("text", "message"), [("u1\n", "log.txt:1: expected `user item"),
                                               ("u1 a b\nu1 c\n", "log.txt:2: user 'u1' appears twice")])
def test_bad_logs_are_refused_by_line(script, tmp_path, text, message):
    (tmp_path / "log.txt").write_text(text)
    with pytest.raises(SystemExit, match=message):
        script.main(["--log", str(tmp_path / "log.txt"), "--out", str(tmp_path / "out")])
    assert not (tmp_path / "out").exists()
