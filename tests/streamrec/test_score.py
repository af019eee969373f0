"""Batch scoring against brute force: top-K, seen filtering, resume, atomic output, errors, old flag names refused."""

import pyarrow.parquet as pq
import pytest
import torch

from streamrec import api, explain, score
from streamrec.data.readers import read_interactions
from streamrec.model.network import PAD_ID
from streamrec.ranking import batch
from streamrec.ranking.batch import RankingOptions


@pytest.fixture(scope="module")
def loaded(tiny_ckpt):
    rec = api.Recommender.load(tiny_ckpt)
    return rec.model, rec.vocab


def test_left_pad_is_exact():
    got = batch.left_pad([[1, 2, 3, 4, 5], [7], []], max_len=3)
    assert got.tolist() == [[3, 4, 5], [0, 0, 7], [0, 0, 0]]


@pytest.mark.parametrize("exclude_seen", [True, False])
@pytest.mark.parametrize("item_chunk", [None, 3, 1000])
def test_recommend_equals_brute_force(loaded, exclude_seen, item_chunk):
    model, _ = loaded
    histories = [[1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [5], [3, 3, 9]]
    options = RankingOptions(top_k=5, exclude_seen=exclude_seen, item_chunk=item_chunk)
    inputs, items, scores = batch.recommend(model, histories, options)
    for row, hist in enumerate(histories):
        x = torch.tensor([[0] * (8 - len(hist[-8:])) + hist[-8:]])
        full = model.score(model.encode(x)[:, -1])[0]
        ranked = [i for i in full.argsort(descending=True).tolist() if i != PAD_ID]
        if exclude_seen:
            ranked = [i for i in ranked if i not in hist]  # the whole history, beyond the last 8
        assert items[row].tolist() == ranked[:5]
        assert torch.allclose(scores[row], full[ranked[:5]], atol=1e-5)
        assert PAD_ID not in items[row].tolist()


def test_scoring_output_never_has_seen_items_or_padding(tiny_ckpt, tiny_log, tmp_path):
    out = tmp_path / "recs.parquet"
    score.main(["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--output", str(out), "--top-k", "4"])
    table = pq.read_table(out).to_pylist()
    histories = read_interactions(tiny_log).items
    assert {r["user_id"] for r in table} == set(histories)
    for r in table:
        assert r["item_id"] not in histories[r["user_id"]]
        assert r["item_id"] != ""
    per_user = {}
    for r in table:
        per_user.setdefault(r["user_id"], []).append((r["rank"], r["score"]))
    for ranks in per_user.values():
        assert [k for k, _ in ranks] == [1, 2, 3, 4]
        assert [s for _, s in ranks] == sorted((s for _, s in ranks), reverse=True)
    assert not (tmp_path / "recs.parquet.parts").exists()


def test_output_keeps_input_user_order_though_scored_by_length(tiny_ckpt, tiny_log, tmp_path):
    out = tmp_path / "recs.csv"
    score.main(["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--output", str(out), "--top-k", "2",
                "--batch-size", "4"])
    histories = read_interactions(tiny_log).items
    assert len({len(h) for h in histories.values()}) > 1  # else sorting by length would change nothing
    lines = out.read_text().splitlines()[1:]
    users = list(dict.fromkeys(line.split(",")[0].strip('"') for line in lines))
    assert users == list(histories)


def test_users_file_scores_each_listed_user_once_in_file_order(tiny_ckpt, tiny_log, tmp_path):
    known = list(read_interactions(tiny_log).items)
    users = tmp_path / "users.txt"
    users.write_text(f"{known[5]}\n\n{known[0]}\nnobody\n{known[5]}\n{known[2]}\n")
    out = tmp_path / "recs.csv"
    score.main(["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--output", str(out), "--top-k", "2",
                "--users", str(users)])
    rows = [line.split(",")[0].strip('"') for line in out.read_text().splitlines()[1:]]
    assert rows == [known[5]] * 2 + [known[0]] * 2 + [known[2]] * 2


def test_length_batches_cover_every_index_once_shortest_first():
    lengths = [5, 1, 9, 3, 3, 7]
    batches = batch.length_batches(lengths, 4)
    assert batches == [[1, 3, 4, 0], [5, 2]]


def test_interrupted_run_resumes_without_duplicates(tiny_ckpt, tiny_log, tmp_path, monkeypatch):
    args = ["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--top-k", "3", "--chunk-users", "10",
            "--batch-size", "4"]
    clean = tmp_path / "clean.csv"
    score.main([*args, "--output", str(clean)])

    out = tmp_path / "recs.csv"
    real = batch.BatchScorer.score_batch
    calls = {"n": 0}

    def crash_after_some(*a, **kw):
        calls["n"] += 1
        if calls["n"] > 7:  # dies inside the third chunk
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(batch.BatchScorer, "score_batch", crash_after_some)
    with pytest.raises(SystemExit, match="interrupted: the users scored so far are kept in .*recs.csv.parts/"):
        score.main([*args, "--output", str(out)])
    assert not out.exists(), "no partial output file may appear"
    assert not (tmp_path / "recs.csv.lock").exists()
    assert len(list((tmp_path / "recs.csv.parts").glob("part-*.parquet"))) == 2
    monkeypatch.setattr(batch.BatchScorer, "score_batch", real)
    score.main([*args, "--output", str(out)])
    assert sorted(out.read_text().splitlines()) == sorted(clean.read_text().splitlines())


def test_parts_from_another_run_are_refused(tiny_ckpt, tiny_log, tmp_path):
    out = tmp_path / "recs.parquet"
    parts = tmp_path / "recs.parquet.parts"
    parts.mkdir()
    (parts / "manifest.json").write_text('{"top_k": 99}')
    with pytest.raises(SystemExit, match="other arguments"):
        score.main(["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--output", str(out)])


def test_unknown_items_are_skipped_and_new_users_scored(tiny_ckpt, tmp_path, loaded, caplog):
    _, vocab = loaded
    log = tmp_path / "new.csv"
    known = vocab.items[:3]
    log.write_text("user_id,item_id,timestamp\n" + "".join(
        f"newbie,{item},{t}\n" for t, item in enumerate([known[0], "never-seen", known[1], known[2]]))
        + "stranger,never-seen,9\nstranger,nor-this,10\n")
    out = tmp_path / "recs.csv"
    score.main(["--ckpt", str(tiny_ckpt), "--input", str(log), "--output", str(out), "--top-k", "2"])
    lines = out.read_text().splitlines()
    assert len(lines) == 3 and all(line.startswith('"newbie"') for line in lines[1:])
    assert "skipped 3 history items unknown to the checkpoint" in caplog.text
    assert "skipped 1 users with no item known to the checkpoint" in caplog.text


def test_explain_columns_are_history_items(tiny_ckpt, tiny_log, tmp_path):
    out = tmp_path / "recs.parquet"
    score.main(["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--output", str(out), "--explain",
                "--top-k", "2"])
    histories = read_interactions(tiny_log).items
    for r in pq.read_table(out).to_pylist():
        assert r["because_attention"] in histories[r["user_id"]]
        assert r["because_occlusion"] in histories[r["user_id"]]
        assert 0 < r["attention_weight"] <= 1


@pytest.mark.parametrize("content, message", [(b"not a checkpoint", "not a readable"), (None, "not found")])
def test_bad_checkpoint_is_one_line(tiny_log, tmp_path, content, message):
    ckpt = tmp_path / "bad.ckpt"
    if content is not None:
        ckpt.write_bytes(content)
    with pytest.raises(SystemExit, match=message):
        score.main(["--ckpt", str(ckpt), "--input", str(tiny_log), "--output", str(tmp_path / "r.csv")])


def test_checkpoint_from_elsewhere_is_refused(tiny_log, tmp_path):
    ckpt = tmp_path / "other.ckpt"
    torch.save({"state_dict": {}}, ckpt)
    with pytest.raises(SystemExit, match="not a StreamRec checkpoint"):
        score.main(["--ckpt", str(ckpt), "--input", str(tiny_log), "--output", str(tmp_path / "r.csv")])


@pytest.mark.parametrize("old", ["--include-seen", "--k"])
def test_the_old_flags_are_refused(old, tiny_ckpt, tiny_log, tmp_path, capsys):
    args = ["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), *(["--k", "3"] if old == "--k" else [old])]
    for main, out in ((score.main, ["--output", str(tmp_path / "r.csv")]),
                      (explain.main, ["--user", "u", "--html", str(tmp_path / "p.html")])):
        with pytest.raises(SystemExit) as exit_:
            main([*args, *out])
        assert exit_.value.code == 2 and f"unrecognized arguments: {old}" in capsys.readouterr().err
    assert not (tmp_path / "r.csv").exists() and not (tmp_path / "p.html").exists()


def test_a_sharded_run_resumes(tiny_ckpt, tiny_log, tmp_path, monkeypatch):
    args = ["--ckpt", str(tiny_ckpt), "--input", str(tiny_log), "--top-k", "2", "--chunk-users", "5",
            "--shard", "1/2", "--output", str(tmp_path / "recs.csv")]
    real = batch.BatchScorer.score_batch
    calls = {"n": 0}

    def crash_in_the_second_chunk(*a, **kw):
        calls["n"] += 1
        if calls["n"] > 1:
            raise KeyboardInterrupt
        return real(*a, **kw)

    monkeypatch.setattr(batch.BatchScorer, "score_batch", crash_in_the_second_chunk)
    with pytest.raises(SystemExit, match="interrupted"):
        score.main(args)
    monkeypatch.setattr(batch.BatchScorer, "score_batch", real)
    score.main(args)  # the same arguments: the parts are resumed, not refused
    assert (tmp_path / "recs.csv").exists()
