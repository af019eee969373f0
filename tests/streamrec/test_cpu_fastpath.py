"""`model.cpu_fastpath` in StreamRec: the same loss, gradients and scores as the plain path; ONNX export still works."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.nn.cpu_fastpath import FastDropout, FastLinear
from core.nn.options import SpeedOptions
from streamrec.model.module import StreamRecModule

SIZE = dict(num_items=30, max_len=8, d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.2)


def _module(on: bool, **size) -> StreamRecModule:
    torch.manual_seed(0)
    return StreamRecModule(**{**SIZE, **size}, speed=SpeedOptions(cpu_fastpath=on))


def _items() -> torch.Tensor:
    items = torch.randint(1, 31, (4, 9), generator=torch.Generator().manual_seed(1))
    items[1, :3] = items[3, :6] = 0  # left padding
    return items


def test_the_switch_swaps_every_linear_and_dropout_and_is_saved():
    on, off = _module(True), _module(False)
    assert on.hparams.speed["cpu_fastpath"] and not off.hparams.speed["cpu_fastpath"]
    kinds = {type(m) for m in on.model.modules()}
    assert FastLinear in kinds and FastDropout in kinds and nn.Linear not in kinds and nn.Dropout not in kinds
    assert not {FastLinear, FastDropout} & {type(m) for m in off.model.modules()}
    off.load_state_dict(on.state_dict())  # checkpoints load either way


def test_loss_gradients_and_scores_equal_the_plain_path():
    """Eval mode (dropout off): the training loss, every gradient and the inference scores match."""
    items, results = _items(), []
    for on in (False, True):
        module = _module(on).eval()
        hidden = module.model.encode(items[:, :-1], trim=True)
        targets = items[:, 1:][:, -hidden.shape[1]:]
        keep = targets != 0
        loss = module.loss_fn.loss(module.model, hidden[keep], targets[keep], None)
        loss.backward()
        with torch.no_grad():
            scores = module.model.recommend_scores(items[:, 1:])
        results.append((loss.detach(), {n: p.grad for n, p in module.named_parameters()}, scores))
    (plain, plain_grads, plain_scores), (fast, fast_grads, fast_scores) = results
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-6)
    for name, grad in plain_grads.items():
        if grad is not None:
            torch.testing.assert_close(fast_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)
    torch.testing.assert_close(fast_scores, plain_scores, rtol=1e-5, atol=1e-5)


def test_onnx_export_of_a_fast_model_traces_the_plain_layers_and_restores_them(tmp_path):
    ort = pytest.importorskip("onnxruntime", reason="onnxruntime not installed: pip install -e '.[export]'")
    pytest.importorskip("onnxscript", reason="onnxscript not installed: pip install -e '.[export]'")
    from streamrec.export import write_onnx

    model = _module(True, n_layers=1).model.eval()  # one block: the exporter takes seconds per block
    write_onnx(model, tmp_path / "model.onnx")
    assert {FastLinear, FastDropout} <= {type(m) for m in model.modules()}  # the live model keeps its fast path
    session = ort.InferenceSession(str(tmp_path / "model.onnx"), providers=["CPUExecutionProvider"])
    items = _items()[:, 1:]
    got = torch.from_numpy(session.run(["scores"], {"items": items.numpy()})[0])
    with torch.no_grad():
        want = model.recommend_scores(items)
    torch.testing.assert_close(got[:, 1:], want[:, 1:], atol=1e-4, rtol=0)
