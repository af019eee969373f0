"""Translator network invariants."""

import pytest
import torch

from translate.model.transformer import TransformerTranslator


def _model(**kw):
    torch.manual_seed(0)
    args = dict(src_vocab_size=40, tgt_vocab_size=40, d_model=32, n_heads=4, n_encoder_layers=2,
                n_decoder_layers=2, d_ff=64, max_len=32)
    return TransformerTranslator(**{**args, **kw}).eval()


def test_embeddings_are_tied():
    model = _model()
    assert model.output.weight is model.tgt_embed.weight
    assert model.src_embed is model.tgt_embed
    separate = _model(share_embeddings=False, src_vocab_size=50)
    assert separate.src_embed is not separate.tgt_embed
    assert separate.output.weight is separate.tgt_embed.weight


def test_joint_embeddings_need_equal_vocabularies():
    with pytest.raises(ValueError, match="share_embeddings"):
        _model(src_vocab_size=50)


@pytest.mark.parametrize("positions", ["sinusoidal", "learned", "rope", "alibi"])
def test_cached_decoding_equals_teacher_forcing(positions):
    model = _model(positions=positions)
    src = torch.tensor([[5, 6, 7, 8, 0, 0], [9, 10, 11, 12, 13, 14]])
    tgt = torch.randint(4, 40, (2, 9))
    full = model(src, tgt)
    memory, src_mask = model.encode(src)
    cache = model.new_cache()
    steps = [model.decode(tgt[:, t : t + 1], memory, src_mask, cache) for t in range(tgt.shape[1])]
    assert torch.allclose(torch.cat(steps, dim=1), full, atol=1e-5)


def test_source_padding_does_not_change_the_translation():
    model = _model()
    tgt = torch.randint(4, 40, (1, 5))
    short = model(torch.tensor([[5, 6, 7]]), tgt)
    padded = model(torch.tensor([[5, 6, 7, 0, 0, 0]]), tgt)
    assert torch.allclose(short, padded, atol=1e-5)
