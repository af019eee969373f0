"""StreamRec on an NVIDIA GPU: the chunked full-catalogue loss and the row-wise item optimizer agree on CUDA with
float64 and CPU references, and bf16-mixed fits through Lightning learn.

Skipped where no CUDA GPU is (CI has none); run on a lent one with `pytest tests/streamrec/test_cuda.py`.
"""

from __future__ import annotations

import lightning as L
import pytest
import torch
import torch.nn.functional as F

from core.nn import linear_cross_entropy
from core.nn.optim import RowwiseAdagradAdamW
from streamrec.data.datamodule import StreamRecDataModule
from streamrec.model.module import StreamRecModule
from streamrec.model.options import ObjectiveOptions, OptimizerOptions

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


def _relative_error(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.double().cpu() - want).norm() / want.norm())


@pytest.mark.parametrize("dtype, tolerance", [(torch.float32, 1e-4), (torch.bfloat16, 2e-2)])
def test_linear_cross_entropy_on_cuda_matches_float64(dtype, tolerance):
    torch.manual_seed(0)
    m, d, n = 3000, 64, 5003  # 2**18 logits a chunk: 15 row chunks, the last one short
    hidden, weight = torch.randn(m, d, dtype=torch.float64), 0.1 * torch.randn(n, d, dtype=torch.float64)
    targets = torch.randint(0, n, (m,))
    h, w = (hidden.clone().requires_grad_(), weight.clone().requires_grad_())
    want = F.cross_entropy(h @ w.T, targets)
    want.backward()
    hc = hidden.float().cuda().requires_grad_()
    wc = weight.float().cuda().requires_grad_()
    with torch.autocast("cuda", dtype=torch.bfloat16, enabled=dtype == torch.bfloat16):
        got = linear_cross_entropy(hc, wc, targets.cuda(), chunk_elements=2**18)
    got.backward()
    assert abs(float(got) - float(want)) / float(want) < tolerance
    assert _relative_error(hc.grad, h.grad) < tolerance
    assert _relative_error(wc.grad, w.grad) < tolerance


def test_rowwise_adagrad_adamw_steps_on_cuda_as_on_the_cpu():
    torch.manual_seed(0)
    table, dense = torch.randn(50, 8), torch.randn(8, 8)
    ids = [torch.tensor([3, 5, 3, 49]), torch.tensor([0, 1, 1, 7, 3])]  # duplicates are summed

    def run(device: str) -> list[torch.Tensor]:
        t, w = torch.nn.Parameter(table.to(device, copy=True)), torch.nn.Parameter(dense.to(device, copy=True))
        opt = RowwiseAdagradAdamW([{"params": [t], "rowwise": True}, {"params": [w]}], lr=0.1, weight_decay=0.01)
        for step in ids:
            rows = F.embedding(step.to(device), t, sparse=True)  # (R, D)
            ((rows @ w).sin().sum() + (w**2).sum()).backward()
            opt.step()
            opt.zero_grad()
        return [t.detach().cpu(), w.detach().cpu(), opt.state[t]["sum"].cpu()]

    for got, want in zip(run("cuda"), run("cpu"), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("loss, item_optimizer", [("full", "adamw"), ("sampled", "rowwise_adagrad")])
def test_bf16_fit_on_the_gpu_learns_and_beats_popularity(tiny_log, loss, item_optimizer):
    L.seed_everything(0, verbose=False)
    data = StreamRecDataModule(str(tiny_log), max_len=8, batch_size=16)
    module = StreamRecModule(num_items=40, max_len=8, d_model=16, n_heads=2, n_layers=1, d_ff=32,
                             objective=ObjectiveOptions(loss=loss, num_negatives=16),
                             optimizer=OptimizerOptions(item_optimizer=item_optimizer, warmup_steps=5))
    trainer = L.Trainer(accelerator="gpu", devices=1, precision="bf16-mixed", max_epochs=8, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False)
    trainer.fit(module, data)
    assert trainer.strategy.root_device.type == "cuda"
    metrics = trainer.callback_metrics
    assert float(metrics["val_ndcg@10"]) > float(metrics["val_mostpop_ndcg@10"]) + 0.1, metrics
