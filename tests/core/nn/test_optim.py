"""`core.nn.optim.RowwiseAdagradAdamW` against independent references: row-wise AdaGrad written out densely, row
by row, and `torch.optim.AdamW` itself; one scheduler scales both kinds; state_dict resumes bit for bit."""

from __future__ import annotations

import io

import pytest
import torch
import torch.nn.functional as F

from core.nn.optim import RowwiseAdagradAdamW
from core.nn.schedule import WarmupCosineLR

V, D = 12, 4
STEP_IDS = [torch.tensor([3, 5, 3, 3, 7]), torch.tensor([5, 1, 1]), torch.tensor([11, 3, 0, 0])]  # duplicates


def lookup_loss(table: torch.Tensor, ids: torch.Tensor, sparse: bool) -> torch.Tensor:
    """A loss whose gradient differs per lookup, so duplicate ids must be summed, not overwritten."""
    weights = torch.arange(1.0, len(ids) * D + 1).reshape(len(ids), D).sin()  # (R, D)
    rows = F.embedding(ids, table, sparse=sparse)
    return (rows * weights).sum() + (rows**2).sum()


def naive_rowwise_adagrad(table: torch.Tensor, steps: list[torch.Tensor], lrs: list[float], eps: float,
                          decay: float) -> tuple[torch.Tensor, torch.Tensor]:
    """s_r += mean(g_r^2); w_r -= lr g_r / (sqrt(s_r) + eps), row by row, from dense gradients, touched rows only."""
    w, s = table.clone(), torch.zeros(V)
    for ids, lr in zip(steps, lrs, strict=True):
        leaf = w.clone().requires_grad_()
        lookup_loss(leaf, ids, sparse=False).backward()
        g = leaf.grad  # (V, D) dense, duplicates already summed by autograd
        for r in sorted(set(ids.tolist())):
            s[r] += (g[r] ** 2).mean()
            w[r] = w[r] * (1 - lr * decay) - lr * g[r] / (s[r].sqrt() + eps)
    return w, s


@pytest.mark.parametrize("decay", [0.0, 0.1])
def test_rowwise_step_equals_a_dense_row_by_row_adagrad_with_duplicate_ids(decay):
    torch.manual_seed(0)
    start = torch.randn(V, D)
    table = torch.nn.Parameter(start.clone())
    opt = RowwiseAdagradAdamW([{"params": [table], "rowwise": True}], lr=0.5, eps=1e-6, weight_decay=decay)
    lrs = [0.5, 0.2, 0.3]
    for ids, lr in zip(STEP_IDS, lrs, strict=True):
        opt.param_groups[0]["lr"] = lr  # as a scheduler would
        lookup_loss(table, ids, sparse=True).backward()
        assert table.grad.is_sparse
        opt.step()
        opt.zero_grad()
    want_w, want_s = naive_rowwise_adagrad(start, STEP_IDS, lrs, eps=1e-6, decay=decay)
    torch.testing.assert_close(table.detach(), want_w, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(opt.state[table]["sum"], want_s, rtol=1e-6, atol=1e-7)
    untouched = [r for r in range(V) if r not in {i for ids in STEP_IDS for i in ids.tolist()}]
    assert torch.equal(table.detach()[untouched], start[untouched])  # never read, never written
    assert torch.equal(opt.state[table]["sum"][untouched], torch.zeros(len(untouched)))


def test_a_dense_gradient_on_a_rowwise_table_touches_every_row():
    torch.manual_seed(0)
    table = torch.nn.Parameter(torch.randn(V, D))
    opt = RowwiseAdagradAdamW([{"params": [table], "rowwise": True}], lr=0.1, weight_decay=0.0)
    grad = torch.randn(V, D)
    table.grad = grad.clone()
    before = table.detach().clone()
    opt.step()
    s = grad.pow(2).mean(1)
    torch.testing.assert_close(table.detach(), before - 0.1 * grad / (s.sqrt()[:, None] + 1e-8))


def make_pair(seed: int = 0) -> tuple[torch.nn.Module, torch.nn.Parameter]:
    """A small dense network and an item table, as a recommender has them."""
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(D, 8), torch.nn.GELU(), torch.nn.Linear(8, D)), \
        torch.nn.Parameter(torch.randn(V, D))


def train_step(net: torch.nn.Module, table: torch.nn.Parameter, opt: torch.optim.Optimizer, step: int,
               sparse: bool = True) -> None:
    g = torch.Generator().manual_seed(100 + step)
    ids = torch.randint(0, V, (6,), generator=g)
    x = torch.randn(6, D, generator=g)
    loss = (net(x) * F.embedding(ids, table, sparse=sparse)).sum().sigmoid()
    loss.backward()
    opt.step()
    opt.zero_grad()


def test_dense_groups_equal_torch_adamw_step_for_step_under_a_schedule():
    net, table = make_pair()
    ref_net, _ = make_pair()
    settings = dict(lr=3e-3, betas=(0.8, 0.95), eps=1e-7, weight_decay=0.05)
    opt = RowwiseAdagradAdamW([{"params": net.parameters()}, {"params": [table], "rowwise": True, "lr": 0.1}],
                              **settings)
    ref = torch.optim.AdamW(ref_net.parameters(), **settings)
    sched, ref_sched = WarmupCosineLR(opt, 3, total_steps=10), WarmupCosineLR(ref, 3, total_steps=10)
    for step in range(8):
        ref_table = table.detach().clone().requires_grad_()  # the same rows in; the reference leaves it alone
        train_step(net, table, opt, step)
        train_step(ref_net, ref_table, ref, step, sparse=False)
        sched.step()
        ref_sched.step()
        for p, q in zip(net.parameters(), ref_net.parameters(), strict=True):
            assert torch.equal(p, q), step  # the same kernel, bit for bit
        for key in ("step", "exp_avg", "exp_avg_sq"):
            for p, q in zip(net.parameters(), ref_net.parameters(), strict=True):
                assert torch.equal(opt.state[p][key], ref.state[q][key]), key


def test_one_scheduler_scales_both_kinds_of_group():
    net, table = make_pair()
    opt = RowwiseAdagradAdamW([{"params": net.parameters()}, {"params": [table], "rowwise": True, "lr": 0.1}],
                              lr=1e-3)
    sched = WarmupCosineLR(opt, 4, total_steps=20, floor=0.1)
    for _ in range(12):
        train_step(net, table, opt, 0)
        sched.step()
        dense, rows = (g["lr"] for g in opt.param_groups)
        assert rows == pytest.approx(100 * dense)  # the same factor on both peaks
    assert 1e-4 <= dense < 1e-3


def test_state_dict_round_trip_resumes_to_identical_weights():
    def build(net, table):
        opt = RowwiseAdagradAdamW([{"params": net.parameters()}, {"params": [table], "rowwise": True, "lr": 0.1}],
                                  lr=3e-3, weight_decay=0.01)
        return opt, WarmupCosineLR(opt, 2, total_steps=10)

    net, table = make_pair()
    opt, sched = build(net, table)
    for step in range(4):
        train_step(net, table, opt, step)
        sched.step()
    saved = io.BytesIO()
    torch.save({"net": net.state_dict(), "table": table.detach(), "opt": opt.state_dict(),
                "sched": sched.state_dict()}, saved)
    for step in range(4, 8):  # the uninterrupted run
        train_step(net, table, opt, step)
        sched.step()

    saved.seek(0)
    state = torch.load(saved, weights_only=True)
    net2, table2 = make_pair(seed=1)  # other weights: everything must come from the state
    net2.load_state_dict(state["net"])
    with torch.no_grad():
        table2.copy_(state["table"])
    opt2, sched2 = build(net2, table2)
    opt2.load_state_dict(state["opt"])
    sched2.load_state_dict(state["sched"])
    assert [g["rowwise"] for g in opt2.param_groups] == [False, True]
    for step in range(4, 8):
        train_step(net2, table2, opt2, step)
        sched2.step()
    assert torch.equal(table, table2)
    for p, q in zip(net.parameters(), net2.parameters(), strict=True):
        assert torch.equal(p, q)


def test_closure_is_called_as_lightning_calls_it():
    net, table = make_pair()
    opt = RowwiseAdagradAdamW([{"params": net.parameters()}, {"params": [table], "rowwise": True}])
    x = torch.randn(3, D)

    def closure():
        opt.zero_grad()
        loss = (net(x) * F.embedding(torch.tensor([1, 2, 2]), table, sparse=True)).sum()
        loss.backward()
        return loss

    before = table.detach().clone()
    assert torch.is_tensor(opt.step(closure))
    assert not torch.equal(before[[1, 2]], table.detach()[[1, 2]]) and torch.equal(before[0], table.detach()[0])


def test_misplaced_parameters_are_refused():
    with pytest.raises(ValueError, match="rowwise"):
        RowwiseAdagradAdamW([{"params": [torch.nn.Parameter(torch.zeros(3))], "rowwise": True}])
    table = torch.nn.Parameter(torch.zeros(V, D))
    opt = RowwiseAdagradAdamW([table])  # a table with a sparse gradient in an AdamW group
    F.embedding(torch.tensor([1]), table, sparse=True).sum().backward()
    with pytest.raises(RuntimeError, match="rowwise: True"):
        opt.step()
