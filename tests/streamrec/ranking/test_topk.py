"""Chunked top-K against brute force: the full score matrix ranked by plain Python sorting."""

import os

import pytest
import torch

from streamrec.model.network import PAD_ID
from streamrec.ranking import topk
from streamrec.ranking.topk import NEG_INF, FileRows, TopK, scan_table, top_k_items


def brute_force_top_k(queries, vectors, top_k, *, exclude=None, allowed=None):
    """The reference: the full (B, N+1) matrix and a stable sort."""
    scores = queries.float() @ vectors.float().T
    scores[:, PAD_ID] = NEG_INF
    if exclude is not None:
        scores.scatter_(1, exclude, NEG_INF)
    if allowed is not None:
        scores.masked_fill_(~allowed, NEG_INF)
    top, items = scores.sort(dim=1, descending=True, stable=True)
    n_out = min(top_k, vectors.shape[0] - 1)
    top, items = top[:, :n_out], items[:, :n_out]
    return TopK(items.masked_fill(top == NEG_INF, PAD_ID), top)


def _python_top_k(queries, vectors, k, exclude=None, allowed=None):
    """The rule spelled out: per row, every eligible item sorted by (-score, id), first k; empty slots (0, -inf)."""
    scores = (queries @ vectors.T).tolist()
    n_out = min(k, vectors.shape[0] - 1)
    items, tops = [], []
    for b, row in enumerate(scores):
        banned = set() if exclude is None else set(exclude[b].tolist())
        ok = [i for i in range(1, len(row)) if i not in banned and (allowed is None or bool(allowed[i]))]
        ranked = sorted(ok, key=lambda i, row=row: (-row[i], i))[:n_out]
        items.append(ranked + [PAD_ID] * (n_out - len(ranked)))
        tops.append([row[i] for i in ranked] + [float("-inf")] * (n_out - len(ranked)))
    return torch.tensor(items), torch.tensor(tops)


def _case(seed, n, ties):
    g = torch.Generator().manual_seed(seed)
    q, v = torch.randn(6, 8, generator=g), torch.randn(n + 1, 8, generator=g)
    if ties:  # small integers: many exactly equal scores, and equal vectors
        q, v = q.round(), (v * 0.6).round()
        v[n // 2 :: 3] = v[1]
    return q, v, torch.randint(0, n + 1, (6, 5), generator=g), torch.rand(n + 1, generator=g) < 0.4


@pytest.mark.parametrize("precision", ["fp32", "bf16", "bf16+scan"])
@pytest.mark.parametrize("ties", [False, True])
@pytest.mark.parametrize("n,k,chunk", [(50, 5, 7), (97, 20, 8), (31, 40, 4), (64, 3, 64), (10, 10, 1), (200, 12, 1000)])
def test_chunked_equals_brute_force_with_exclusions_and_allow_lists(n, k, chunk, ties, precision):
    q, v, exclude, allowed = _case(n * 31 + k, n, ties)
    opts = {"precision": precision[:4], "scan": scan_table(v, item_chunk=3) if "scan" in precision else None}
    for kw in ({}, {"exclude": exclude}, {"allowed": allowed}, {"exclude": exclude, "allowed": allowed}):
        want_items, want_scores = _python_top_k(q, v, k, **kw)
        got = top_k_items(q, v, k, item_chunk=chunk, **kw, **opts)
        assert got.items.tolist() == want_items.tolist(), (kw.keys(), chunk)
        torch.testing.assert_close(got.scores, want_scores, atol=1e-5, rtol=1e-5)
        ref = brute_force_top_k(q, v, k, **kw)
        assert torch.equal(ref.items, want_items)


def test_ties_go_to_the_lower_id_whatever_the_chunk_size():
    q = torch.ones(2, 4)
    v = torch.ones(30, 4)  # every item scores 4: the answer is ids 1..k
    v[0] = 0
    for chunk in (1, 3, 7, 29, 64):
        assert top_k_items(q, v, 5, item_chunk=chunk).items.tolist() == [[1, 2, 3, 4, 5]] * 2
    exclude = torch.tensor([[2, 0], [1, 3]])
    assert top_k_items(q, v, 3, exclude=exclude, item_chunk=4).items.tolist() == [[1, 3, 4], [2, 4, 5]]


def test_fewer_eligible_items_than_k_leave_empty_slots():
    q, v, _, _ = _case(0, 12, False)
    allowed = torch.zeros(13, dtype=torch.bool)
    allowed[[0, 4, 9]] = True  # padding listed: still never returned
    got = top_k_items(q, v, 5, allowed=allowed, exclude=torch.full((6, 1), 9), item_chunk=2)
    assert (got.items[:, 0] == 4).all() and (got.items[:, 1:] == PAD_ID).all()
    assert torch.isinf(got.scores[:, 1:]).all() and torch.isfinite(got.scores[:, 0]).all()
    assert top_k_items(q, v, 50, item_chunk=5).items.shape == (6, 12)  # at most N columns


def test_normalize_gives_cosine_ranking():
    q, v, _, _ = _case(3, 40, False)
    unit_v = torch.nn.functional.normalize(v, dim=-1)
    unit_q = torch.nn.functional.normalize(q, dim=-1)
    want_items, want_scores = _python_top_k(unit_q, unit_v, 6)
    got = top_k_items(unit_q, v * 3.0, 6, item_chunk=9, normalize=True)  # rescaled vectors: same cosines
    assert got.items.tolist() == want_items.tolist()
    torch.testing.assert_close(got.scores, want_scores, atol=1e-5, rtol=1e-5)


def _close_scores(seed, n, d=8):
    """Items whose scores differ by far less than bf16 resolves (2^-8 relative): bf16 alone ranks them wrongly."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(6, d, generator=g)
    v = torch.randn(1, d, generator=g) + 1e-3 * torch.randn(n + 1, d, generator=g)
    return q, v, torch.randint(0, n + 1, (6, 5), generator=g)


def _counting(monkeypatch, name):
    calls = []
    real = getattr(topk, name)
    monkeypatch.setattr(topk, name, lambda *a, **kw: calls.append(1) or real(*a, **kw))
    return calls


@pytest.mark.parametrize("use_scan", [False, True])
def test_bf16_scan_is_exact_where_bf16_rounding_reorders_items(monkeypatch, use_scan):
    q, v, exclude = _close_scores(5, 1500)
    rough = (q.bfloat16() @ v.bfloat16().T).float()  # what a bf16-only ranking sees
    rough[:, PAD_ID] = float("-inf")
    want_items, want_scores = _python_top_k(q, v, 10, exclude=exclude)
    rough.scatter_(1, exclude, float("-inf"))
    bf16_only = rough.sort(dim=1, descending=True, stable=True).indices[:, :10]
    assert not torch.equal(bf16_only, want_items)  # the case is hard: bf16 scores alone get the top 10 wrong
    rescored = _counting(monkeypatch, "_rescored")
    got = top_k_items(q, v, 10, exclude=exclude, item_chunk=100, precision="bf16",
                      scan=scan_table(v, item_chunk=7) if use_scan else None)
    assert rescored  # the bound-based re-scoring ran (not only the fp32 fallback)
    assert got.items.tolist() == want_items.tolist()
    torch.testing.assert_close(got.scores, want_scores, atol=1e-5, rtol=1e-5)  # fp32 scores, not bf16


def test_bf16_scan_falls_back_to_fp32_when_too_many_items_pass(monkeypatch):
    q, v, exclude = _close_scores(6, 3000)
    v[1:] = v[1]  # every item scores the same: all pass the bound, ties go to the lower id
    fallback = _counting(monkeypatch, "_chunk_top")
    got = top_k_items(q, v, 4, exclude=exclude, item_chunk=1500, precision="bf16")
    assert len(fallback) == 2  # the first chunk and the degenerate second one
    assert got.items.tolist() == _python_top_k(q, v, 4, exclude=exclude)[0].tolist()


def test_bf16_scan_with_cosine_similarity():
    q, v, _ = _close_scores(7, 400)
    unit_q = torch.nn.functional.normalize(q, dim=-1)
    want_items, _ = _python_top_k(unit_q, torch.nn.functional.normalize(v, dim=-1), 6)
    got = top_k_items(unit_q, v * 3.0, 6, item_chunk=50, normalize=True, precision="bf16")
    assert got.items.tolist() == want_items.tolist()


def test_bf16_scan_reads_the_fp32_table_from_a_file(tmp_path, monkeypatch):
    q, v, exclude = _close_scores(8, 700)
    path = tmp_path / "items.f32"
    path.write_bytes(b"header" + v.numpy().tobytes())
    rows = FileRows(path, tuple(v.shape), offset=6)
    assert torch.equal(rows[3:9], v[3:9]) and torch.equal(rows[torch.tensor([5, 0, 700])], v[[5, 0, 700]])
    read = _counting(monkeypatch, "_rescored")
    got = top_k_items(q, rows, 10, exclude=exclude, item_chunk=64, precision="bf16", scan=scan_table(rows, 50))
    assert read and got.items.tolist() == _python_top_k(q, v, 10, exclude=exclude)[0].tolist()
    with pytest.raises(ValueError, match="too short for an fp32 table of shape"):
        FileRows(path, (702, 8))


@pytest.mark.skipif(not os.path.exists("/proc/self/maps"), reason="finds mappings in /proc/self/maps (Linux)")
def test_file_rows_of_a_table_mapped_from_a_checkpoint(tmp_path):
    """`FileRows.mapped` finds where torch.save put the table: the offset torch itself reports, the same rows."""
    g = torch.Generator().manual_seed(3)
    table, other = torch.randn(301, 8, generator=g), torch.randn(301, 8, generator=g)  # same size: a decoy
    path = tmp_path / "m.ckpt"
    torch.save({"a": torch.arange(5.0), "state_dict": {"other": other, "table": table}, "vocab": ["x"] * 9}, path)
    loaded = torch.load(path, mmap=True, weights_only=True)
    mapped = loaded["state_dict"]
    rows = FileRows.mapped(mapped["table"], path)
    meta = torch.load(path, map_location="meta", weights_only=True)["state_dict"]["table"]
    assert rows is not None and rows.offset == meta.untyped_storage()._checkpoint_offset  # torch's own record offset
    ids = torch.tensor([0, 300, 7, 7, 150])
    assert torch.equal(rows[ids], table[ids]) and torch.equal(rows[10:40], table[10:40])
    assert torch.equal(FileRows.mapped(mapped["other"], path)[ids], other[ids])
    assert FileRows.mapped(table, path) is None  # in memory, not a mapping of the file
    assert FileRows.mapped(mapped["table"], tmp_path / "elsewhere.ckpt") is None
    assert FileRows.mapped(mapped["table"].T, path) is None and FileRows.mapped(loaded["a"], path) is None


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_bf16_scan_on_cuda_sums_in_fp32_and_restores_the_setting():
    q, v, exclude = _close_scores(9, 3000)
    flags = torch.backends.cuda.matmul
    before = flags.allow_bf16_reduced_precision_reduction
    got = top_k_items(q.cuda(), v.cuda(), 10, exclude=exclude.cuda(), item_chunk=256, precision="bf16")
    # Exact up to fp32 rounding: CUDA's fp32 sums differ from the CPU's in the last bits, enough to swap two of
    # these close items (seen on an H100), so the reference is float64 with a 1e-5 slack. A bf16-only ranking
    # misses by about 1e-2 (2^-8 of scores near 4).
    exact = q.double() @ v.double().T  # (B, N+1)
    exact[:, PAD_ID] = float("-inf")
    exact.scatter_(1, exclude, float("-inf"))
    tenth = exact.topk(10, dim=1).values[:, -1:]
    got_exact = exact.gather(1, got.items.cpu())
    assert all(len(set(row)) == 10 for row in got.items.tolist())
    assert (got_exact >= tenth - 1e-5).all() and (got_exact.diff(dim=1) <= 1e-5).all()
    assert flags.allow_bf16_reduced_precision_reduction == before


def test_bad_arguments_are_one_line_errors():
    q, v, _, _ = _case(0, 10, False)
    with pytest.raises(ValueError, match=r"`item_chunk` \(0\) must be >= 1"):
        top_k_items(q, v, 3, item_chunk=0)
    with pytest.raises(ValueError, match="`precision` .*'fp32' or 'bf16'"):
        top_k_items(q, v, 3, precision="int8")
    with pytest.raises(ValueError, match="`scan` .* precision='bf16'"):
        top_k_items(q, v, 3, scan=scan_table(v))
    with pytest.raises(ValueError, match=r"must be scan_table\(vectors\)"):
        top_k_items(q, v, 3, precision="bf16", scan=scan_table(v[:5]))


@pytest.mark.parametrize("precision, item_chunk, chunks", [
    ("fp32", 25, 4), ("fp32", None, 1), ("bf16", 25, 4), ("bf16", None, 10), ("bf16", 100, 1)])
def test_item_chunk_is_honoured_as_given(monkeypatch, precision, item_chunk, chunks):
    """Never capped: `item_chunk` items per chunk (the default: the whole catalogue, or `SCAN_CHUNK` for bf16)."""
    monkeypatch.setattr(topk, "SCAN_CHUNK", 10)  # 100 items: the bf16 default makes 10 chunks
    read = []  # without a scan table every chunk reads its fp32 rows (a bf16 chunk may read them twice)
    real = topk._fp32_rows
    monkeypatch.setattr(topk, "_fp32_rows", lambda v, r, *a: read.append((r.start, r.stop)) or real(v, r, *a))
    q, v, exclude, _ = _case(3, 100, False)
    got = top_k_items(q, v, 5, exclude=exclude, item_chunk=item_chunk, precision=precision)
    assert [hi - lo for lo, hi in dict.fromkeys(read)] == [100 // chunks] * chunks
    assert torch.equal(got.items, brute_force_top_k(q, v, 5, exclude=exclude).items)
