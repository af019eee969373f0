"""`model.speed.cpu_fastpath` in Translate: the switch swaps every layer, and changes neither loss nor gradient."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from core.nn.cpu_fastpath import FastDropout, FastLinear
from translate.data.corpus import Batch
from translate.model.module import TranslationModule, translation_loss

SIZE = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=16, n_heads=2, n_encoder_layers=2, n_decoder_layers=2,
            d_ff=32, max_len=16, dropout=0.1, block={"activation": "swiglu"})


def _module(on: bool) -> TranslationModule:
    torch.manual_seed(0)
    return TranslationModule(**SIZE, speed={"cpu_fastpath": on})


def _batch() -> Batch:
    g = torch.Generator().manual_seed(1)
    src, tgt = torch.randint(4, 40, (3, 7), generator=g), torch.randint(4, 40, (3, 6), generator=g)
    src[1, 5:], tgt[2, 4:] = 0, 0  # padding
    tgt_in = torch.cat([torch.full((3, 1), 2), tgt[:, :-1]], 1)
    return Batch(src=src, tgt_in=tgt_in, tgt_out=tgt, index=torch.arange(3))


def test_the_switch_swaps_every_linear_and_dropout_and_is_saved():
    on, off = _module(True), _module(False)
    assert on.hparams.speed["cpu_fastpath"] and not off.hparams.speed["cpu_fastpath"]
    kinds = {type(m) for m in on.model.modules()}
    assert FastLinear in kinds and FastDropout in kinds and nn.Linear not in kinds and nn.Dropout not in kinds
    assert not {FastLinear, FastDropout} & {type(m) for m in off.model.modules()}
    off.load_state_dict(on.state_dict())  # checkpoints load either way


@pytest.mark.parametrize("rdrop_alpha", [0.0, 5.0])
def test_loss_and_gradients_equal_the_plain_path(rdrop_alpha):
    """Eval mode (dropout off) so both paths compute one function: the fast linears must not change it."""
    results = []
    for on in (False, True):
        module = _module(on).eval()
        loss = translation_loss(module.model, _batch(), 0, 0.1, rdrop_alpha)
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in module.named_parameters()}))
    (plain, plain_grads), (fast, fast_grads) = results
    torch.testing.assert_close(fast, plain, rtol=1e-5, atol=1e-6)
    assert plain_grads.keys() == fast_grads.keys()
    for name, grad in plain_grads.items():
        torch.testing.assert_close(fast_grads[name], grad, rtol=1e-4, atol=1e-5, msg=name)


def test_cached_decoding_gives_the_same_logits():
    """Inference (no gradients, the KV cache, the output layer): step-by-step logits equal the plain path's."""
    batch, logits = _batch(), []
    for on in (False, True):
        model = _module(on).model.eval()
        with torch.no_grad():
            memory, src_mask = model.encode(batch.src)
            cache = model.new_cache()
            logits.append(torch.cat([model.decode(batch.tgt_in[:, t : t + 1], memory, src_mask, cache)
                                     for t in range(batch.tgt_in.shape[1])], 1))  # (B, T, V)
    torch.testing.assert_close(logits[1], logits[0], rtol=1e-5, atol=1e-5)
