"""The causal low-pass mix: the moving average against a loop over windows, no future leak, and the
layer's output against the formula alpha * filter + (1 - alpha) * attention written out by hand. BSARec's
Fourier low-pass against numpy's FFT of the history padded on the left, as BSARec pads it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from core.nn import Encoder
from core.nn.blocks import EncoderLayer
from core.nn.mixing import LowPassMix, causal_moving_average, fourier_low_pass


def naive_average(x: torch.Tensor, window: int, valid: torch.Tensor) -> torch.Tensor:
    out = torch.zeros_like(x)
    for b in range(x.shape[0]):
        for t in range(x.shape[1]):
            picked = [s for s in range(max(0, t - window + 1), t + 1) if valid[b, s]]
            if picked:
                out[b, t] = x[b, picked].mean(0)
    return out


@pytest.mark.parametrize("window", [1, 3, 7, 50])
def test_moving_average_matches_a_loop_with_padding(window):
    torch.manual_seed(0)
    x = torch.randn(3, 9, 4, dtype=torch.float64)
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[0, :4] = False  # left padding
    valid[2, :8] = False
    got = causal_moving_average(x, window, valid)
    torch.testing.assert_close(got, naive_average(x, window, valid))


@pytest.mark.parametrize("bins, length", [(3, 50), (1, 9), (5, 12)])
def test_fourier_low_pass_matches_numpy_on_the_left_padded_history(bins, length):
    torch.manual_seed(0)
    x = torch.randn(3, 9, 4, dtype=torch.float64)
    valid = torch.ones(3, 9, dtype=torch.bool)
    valid[0, :4] = False
    valid[2, :8] = False
    got = fourier_low_pass(x.float(), bins, length, valid).double()
    for b in range(3):
        seq = (x[b] * valid[b, :, None]).numpy()
        padded = np.concatenate([np.zeros((length - 9, 4)), seq])  # BSARec's layout: padding first
        spectrum = np.fft.rfft(padded, axis=0, norm="ortho")
        spectrum[bins:] = 0
        want = np.fft.irfft(spectrum, n=length, axis=0, norm="ortho")[-9:]
        np.testing.assert_allclose(got[b].numpy(), want, atol=1e-5)
    all_bins = fourier_low_pass(x, 9 // 2 + 1, 9)  # every bin kept: the signal itself
    torch.testing.assert_close(all_bins, x)


def test_fourier_mix_reads_the_future():
    torch.manual_seed(0)
    layer = EncoderLayer(8, 2, d_ff=16, mix=LowPassMix(0.5, 5, "fourier", 10)).eval()
    x = torch.randn(2, 6, 8)
    changed = x.clone()
    changed[:, 4:] += torch.randn(2, 2, 8)
    assert not torch.allclose(layer(changed, is_causal=True)[:, :4], layer(x, is_causal=True)[:, :4])
    with pytest.raises(ValueError, match="kind"):
        LowPassMix(kind="wavelet")


def test_layer_is_the_mixed_formula_and_sees_no_future():
    torch.manual_seed(0)
    mix = LowPassMix(alpha=0.3, window=4)
    layer = EncoderLayer(8, 2, d_ff=16, mix=mix).eval()
    plain = EncoderLayer(8, 2, d_ff=16).eval()
    plain.load_state_dict({k: v for k, v in layer.state_dict().items() if not k.startswith("filter")})
    x = torch.randn(2, 6, 8)
    h = layer.attn_block.norm(x)
    low = naive_average(h, 4, torch.ones(2, 6, dtype=torch.bool))
    filtered = low + layer.filter.sqrt_beta.square() * (h - low)
    attended = plain.self_attn(h, is_causal=True)
    expected = x + 0.3 * filtered + 0.7 * attended
    expected = expected + layer.ff(layer.ff_block.norm(expected))
    torch.testing.assert_close(layer(x, is_causal=True), expected)

    changed = x.clone()
    changed[:, 4:] += torch.randn(2, 2, 8)  # not a constant shift, which the layer's LayerNorm would remove
    torch.testing.assert_close(layer(changed, is_causal=True)[:, :4], layer(x, is_causal=True)[:, :4])


def test_encoder_last_positions_equal_the_full_pass():
    torch.manual_seed(0)
    enc = Encoder(8, 2, n_layers=2, d_ff=16, max_len=10, causal=True, mix=LowPassMix(0.5, 3)).eval()
    x = torch.randn(2, 7, 8)
    valid = torch.ones(2, 7, dtype=torch.bool)
    valid[1, :3] = False
    mask = valid[:, None, None, :]
    full = enc(x, mask, valid=valid)
    torch.testing.assert_close(enc(x, mask, last=1, valid=valid), full[:, -1:])


def test_bad_settings_are_refused():
    with pytest.raises(ValueError, match="alpha"):
        LowPassMix(alpha=1.5)
    with pytest.raises(ValueError, match="window"):
        LowPassMix(window=0)
    with pytest.raises(ValueError, match="causal"):
        Encoder(8, 2, n_layers=1, d_ff=16, max_len=10, mix=LowPassMix())
