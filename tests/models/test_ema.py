"""MEGA's bidirectional damped EMA (models/ema.py) against a direct recurrence written here."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from models.ema import BidirectionalEMA

pytestmark = pytest.mark.numerics  # float results against references: make test-numerics reruns it per SIMD level


def recurrence(ema: BidirectionalEMA, x: torch.Tensor, key_mask: torch.Tensor, directions=(0, 1)) -> torch.Tensor:
    """``silu(Σ_dir Σ_n η·√(1/N)·h^dir_t + ω x_t)`` with ``h_t = p β x_t + (1 − p σ(δ)) h_{t∓1}``, pads zeroed."""
    x = x * key_mask.unsqueeze(-1)
    batch, length, dim = x.shape
    total = torch.zeros_like(x)
    for direction in directions:
        p = torch.sigmoid(ema.alpha[direction])  # (D, N)
        q = 1 - p * torch.sigmoid(ema.delta[direction])
        state = torch.zeros(batch, dim, ema.ndim, dtype=x.dtype)
        steps = range(length) if direction == 0 else range(length - 1, -1, -1)
        for t in steps:
            state = p * ema.beta[direction] * x[:, t, :, None] + q * state
            total[:, t] += (state * ema.eta[direction]).sum(-1) / math.sqrt(ema.ndim)
    return F.silu(total + ema.omega * x)


@pytest.fixture
def ema() -> BidirectionalEMA:
    torch.manual_seed(0)
    module = BidirectionalEMA(d_model=5, ndim=4).double()
    with torch.no_grad():  # decays spread over (0, 1) so long lags matter
        module.delta.uniform_(-3, 3)
        module.alpha.uniform_(-3, 3)
    return module


def test_fft_ema_equals_recurrence_with_padding(ema):
    torch.manual_seed(1)
    x = torch.randn(3, 23, 5, dtype=torch.float64)
    key_mask = torch.ones(3, 23, dtype=torch.bool)
    key_mask[1, 15:] = False
    key_mask[2, 1:] = False
    with torch.no_grad():
        out, expected = ema(x, key_mask), recurrence(ema, x, key_mask)
    real = key_mask.unsqueeze(-1).expand_as(out)
    torch.testing.assert_close(out[real], expected[real], atol=1e-5, rtol=0)


@pytest.mark.parametrize("direction", [0, 1])
def test_each_direction_alone(ema, direction):
    """Silencing one direction's projection leaves exactly the other direction's recurrence (causal or anti-causal)."""
    with torch.no_grad():
        ema.eta[1 - direction].zero_()
    torch.manual_seed(2)
    x = torch.randn(2, 17, 5, dtype=torch.float64)
    key_mask = torch.ones(2, 17, dtype=torch.bool)
    with torch.no_grad():
        torch.testing.assert_close(ema(x, key_mask), recurrence(ema, x, key_mask, (direction,)), atol=1e-5, rtol=0)
        changed = x.clone()
        changed[:, 8] += 1.0
        delta = (ema(changed, key_mask) - ema(x, key_mask)).abs().sum((0, 2))
    before, after = delta[:8], delta[9:]
    untouched, touched = (before, after) if direction == 0 else (after, before)  # forward looks back
    assert untouched.max() < 1e-10 and touched.min() > 1e-6  # FFT round-off only where the EMA cannot reach


@pytest.mark.parametrize("truncation, shift", [(None, False), (6, True)])
def test_gradients_equal_the_recurrences(ema, truncation, shift):
    """The FFT convolution's own backward (models.ema.BidirectionalConvolution) gives the gradients that autograd
    takes through the direct sum, for the input and every EMA parameter, with padding."""
    ema.truncation, ema.shift = truncation, shift
    torch.manual_seed(4)
    x = torch.randn(3, 13, 5, dtype=torch.float64, requires_grad=True)
    key_mask = torch.ones(3, 13, dtype=torch.bool)
    key_mask[1, 9:] = False
    weights = torch.randn(3, 13, 5, dtype=torch.float64)
    params = [x, *ema.parameters()]
    got = torch.autograd.grad((ema(x, key_mask) * weights).sum(), params)
    expected = torch.autograd.grad((direct_sum(ema, x, key_mask) * weights).sum(), params)
    for name, a, b in zip(["x", *(n for n, _ in ema.named_parameters())], got, expected):
        torch.testing.assert_close(a, b, atol=1e-10, rtol=1e-8, msg=name)


def direct_sum(ema: BidirectionalEMA, x: torch.Tensor, key_mask: torch.Tensor) -> torch.Tensor:
    """``silu(y + ω x)`` with ``y`` the two directions' sums over ``ema.kernel`` written out (shift, truncation)."""
    x = x * key_mask.unsqueeze(-1)
    length = x.shape[1]
    lags = length if ema.truncation is None else min(ema.truncation, length)
    k_fwd, k_bwd = ema.kernel(lags, x.dtype)
    y = torch.zeros_like(x)
    for t in range(length):
        for lag in range(lags):
            if t - lag >= 0:
                y[:, t] = y[:, t] + k_fwd[:, lag] * x[:, t - lag]
            if t + lag < length and (lag > 0 or not ema.shift):
                y[:, t] = y[:, t] + k_bwd[:, lag] * x[:, t + lag]
    return F.silu(y + ema.omega * x)


@pytest.mark.parametrize("length", [1, 64, 150])  # one block of s = 64 lags trimmed to 1, one whole, 3 trimmed to 150
def test_kernel_is_explicit_sum(ema, length):
    expected = torch.zeros(2, 5, length, dtype=torch.float64)
    for e in range(2):
        for d in range(5):
            for n in range(4):
                p = 1 / (1 + math.exp(-ema.alpha[e, d, n].item()))
                q = 1 - p / (1 + math.exp(-ema.delta[e, d, n].item()))
                for lag in range(length):
                    expected[e, d, lag] += ema.eta[e, d, n].item() * 0.5 * p * ema.beta[e, d, n].item() * q**lag
    torch.testing.assert_close(ema.kernel(length, torch.float64).detach(), expected, atol=1e-10, rtol=0)


def test_long_kernel_in_float32_is_the_float64_sum():
    """float32 over 2,000 lags of decays from 0.1 to 0.9: the blocked product q^{s·b} q^j is the float64 kernel to
    float32 resolution of every term (a rounded exponent l log q, then a few roundings); gradients are finite."""
    torch.manual_seed(0)
    module = BidirectionalEMA(d_model=8, ndim=4)
    with torch.no_grad():
        module.alpha.fill_(2.0)
        module.delta.uniform_(-3, 3)
    kernel = module.kernel(2000)
    log_q = torch.log1p(-torch.sigmoid(module.alpha) * torch.sigmoid(module.delta)).double().detach()
    log_powers = torch.arange(2000, dtype=torch.float64) * log_q.unsqueeze(-1)  # (2, D, ndim, L)
    double = module.double()
    reference = double.kernel(2000, torch.float64)
    weights = (double.eta * 0.5 * torch.sigmoid(double.alpha) * double.beta).detach().abs()  # |η √(1/ndim) p β|
    # each term's relative error ~ (|l log q| + a few) eps; the largest error / (eps · Σ_n |term| (|l log q| + 4))
    # measured here is 1.5; 1e-44 covers float32's subnormal spacing at the kernel's tail
    terms = weights.unsqueeze(-1) * log_powers.exp() * (log_powers.abs() + 4)
    bound = 8 * torch.finfo(torch.float32).eps * terms.sum(2) + 1e-44
    assert ((kernel.double() - reference).abs() <= bound).all()
    module.float().kernel(2000).square().sum().backward()
    assert all(torch.isfinite(p.grad).all() for p in (module.alpha, module.delta, module.beta, module.eta))


def test_padding_invariance(ema):
    """Real positions of a padded sequence equal the same sequence without padding, whatever the pads hold."""
    torch.manual_seed(3)
    x = torch.randn(1, 12, 5, dtype=torch.float64)
    padded = torch.cat([x, 100 * torch.randn(1, 8, 5, dtype=torch.float64)], dim=1)
    mask = torch.arange(20) < 12
    with torch.no_grad():
        torch.testing.assert_close(ema(padded, mask[None])[:, :12], ema(x, torch.ones(1, 12, dtype=torch.bool)), atol=1e-10, rtol=0)


def test_timescale_init_spans_the_range_and_keeps_the_gain():
    """``timescales=(low, high)``: p = σ(α) = 1/τ with log τ uniform on [log low, log high], δ left as MEGA's."""
    torch.manual_seed(0)
    module = BidirectionalEMA(d_model=32, ndim=16, timescales=(2.0, 1000.0))
    tau = 1 / torch.sigmoid(module.alpha.detach().double())
    assert tau.min() >= 2 - 1e-6 and tau.max() <= 1000 + 1e-3
    log_position = (tau.log() - math.log(2)) / math.log(500)  # 0 .. 1 along the log range, 1024 draws
    assert abs(log_position.mean().item() - 0.5) < 0.05 and (log_position < 0.1).any() and (log_position > 0.9).any()
    reference = BidirectionalEMA(d_model=32, ndim=16)
    assert torch.sigmoid(reference.alpha).min() > 0.3  # MEGA's own init: every decay time under ~7 tokens
    # The steady-state gain p·β/(1 − q) = β/σ(δ) does not grow with τ: the kernel sums to ≈ the same total.
    with torch.no_grad():
        module.beta.fill_(1.0), module.eta.fill_(1.0), module.delta.zero_()
    gain = module.kernel(100_000).double().sum(-1) * math.sqrt(16) / 16  # (2, D): mean over n of β/σ(δ) = 2
    torch.testing.assert_close(gain, torch.full_like(gain, 2.0), rtol=1e-3, atol=0)


@pytest.mark.parametrize("timescales", [(1.0, 10.0), (20.0, 10.0), (2.0, 10.0, 100.0)])
def test_rejects_a_timescale_range_outside_one_to_infinity(timescales):
    with pytest.raises(ValueError, match="model.block.ema_timescales"):
        BidirectionalEMA(4, ndim=2, timescales=timescales)


def test_rejects_zero_ndim():
    with pytest.raises(ValueError, match="ndim"):
        BidirectionalEMA(4, ndim=0)


def test_compiles_whole_for_a_dynamic_length():
    """Under torch.compile a batch's length is symbolic: the EMA (kernel, convolution, gate) stays one graph."""
    module = BidirectionalEMA(d_model=8, ndim=4)
    x, key_mask = torch.randn(2, 40, 8), torch.ones(2, 40, dtype=torch.bool)
    torch._dynamo.mark_dynamic(x, 1)
    torch._dynamo.mark_dynamic(key_mask, 1)
    explanation = torch._dynamo.explain(module)(x, key_mask)
    assert explanation.graph_break_count == 0, explanation.break_reasons
    torch._dynamo.reset()
