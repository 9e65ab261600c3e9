"""The two-time consistency formulation shared by the decoder and the latent dynamics.

Discrete variance-preserving noise (T=1000, sigmoid betas), v-prediction, and the jump
G(x_t, t, s) = (s/t) x_t + (1 - s/t) x0_hat. Training regresses G(x_t, t, s) onto x_s built with
the same noise: no teacher, no EMA, no ODE solver.
"""
from __future__ import annotations

import torch

EPS_CLAMP = 6.0


def sigmoid_alpha_bar(timesteps: int = 1000, start: float = -3.0, end: float = 3.0, tau: float = 1.0) -> torch.Tensor:
    """alpha_bar_t for t = 0..T-1 (0.9997 at 0, 0.961 at 99, 3e-7 at 999)."""
    x = torch.linspace(0, timesteps, timesteps + 1, dtype=torch.float64) / timesteps
    v_start, v_end = torch.tensor(start / tau).sigmoid(), torch.tensor(end / tau).sigmoid()
    curve = (-((x * (end - start) + start) / tau).sigmoid() + v_end) / (v_end - v_start)
    curve = curve / curve[0]
    betas = (1 - curve[1:] / curve[:-1]).clip(0, 0.999)
    return torch.cumprod(1 - betas, 0).float()


def decode_times(steps: int, timesteps: int = 1000) -> list[int]:
    """The inference jumps: 1 -> [999, 0], 2 -> [999, 499, 0], 3 -> [999, 666, 333, 0]."""
    top = timesteps - 1
    return [top * (steps - i) // steps for i in range(steps + 1)]


def intermediate_levels(timesteps: int = 1000, steps: tuple[int, ...] = (2, 3)) -> list[int]:
    """The noise levels between the first and last jump of 2- and 3-step inference: [333, 499, 666]."""
    return sorted({t for k in steps for t in decode_times(k, timesteps)[1:-1]})


class Schedule:
    def __init__(self, timesteps: int = 1000):
        self.timesteps = timesteps
        self.alpha_bar = sigmoid_alpha_bar(timesteps)

    def _coef(self, t: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        ab = self.alpha_bar.to(like.device)[t.long()]
        shape = (-1,) + (1,) * (like.dim() - t.dim())
        return ab.sqrt().view(t.shape + shape[1:]), (1 - ab).sqrt().view(t.shape + shape[1:])

    def add_noise(self, x0: torch.Tensor, t: torch.Tensor, eps: torch.Tensor) -> torch.Tensor:
        a, b = self._coef(t, x0)
        return a * x0 + b * eps

    def x0_from_v(self, x_t: torch.Tensor, t: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        a, b = self._coef(t, x_t)
        return a * x_t - b * v

    def jump(self, x_t: torch.Tensor, t: torch.Tensor, s: torch.Tensor, x0_hat: torch.Tensor) -> torch.Tensor:
        """G(x_t, t, s): s = 0 gives x0_hat, s = t gives x_t back."""
        ratio = (s.float() / t.float().clamp(min=1)).view(t.shape + (1,) * (x_t.dim() - t.dim()))
        return ratio * x_t + (1 - ratio) * x0_hat

    def renoise(self, x_t: torch.Tensor, t: torch.Tensor, s: torch.Tensor, x0_hat: torch.Tensor) -> torch.Tensor:
        """The deterministic DDIM step from t to s: x0_hat with the noise that x_t implies."""
        a_t, b_t = self._coef(t, x_t)
        a_s, b_s = self._coef(s, x_t)
        return a_s * x0_hat + b_s * (x_t - a_t * x0_hat) / b_t

    def snr_weight(self, t: torch.Tensor, cap: float = 5.0) -> torch.Tensor:
        """min(SNR, cap) / (SNR + 1): the stage-1 weighting."""
        ab = self.alpha_bar.to(t.device)[t.long()]
        snr = ab / (1 - ab)
        return snr.clamp(max=cap) / (snr + 1)


def gaussian_noise(shape, device, generator: torch.Generator | None = None, dtype=torch.float32) -> torch.Tensor:
    """Standard normal noise clamped to +-EPS_CLAMP, as every jump starts from it."""
    return torch.randn(shape, generator=generator, device=device, dtype=dtype).clamp_(-EPS_CLAMP, EPS_CLAMP)


def noise_like(x: torch.Tensor, generator: torch.Generator | None = None) -> torch.Tensor:
    return gaussian_noise(x.shape, x.device, generator, x.dtype)


def sample_uniform_times(n: int, timesteps: int, device, generator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """t in 2..T-1, s in 1..t-1 (the stage-1 'uniform' sampling)."""
    t = torch.randint(2, timesteps, (n,), device=device, generator=generator)
    s = (torch.rand(n, device=device, generator=generator) * (t - 1).float()).long() + 1
    return t, s.clamp(max=t - 1)


def sample_jump_times(n: int, steps: tuple[int, ...], timesteps: int, device, generator=None):
    """(t, s) drawn from the jumps inference actually takes, for every decode step count in ``steps``.

    Training each consecutive pair (e.g. 666 -> 333) fixes the paper's weak point that the middle
    jump is only seen in stage 1."""
    pairs = sorted({(a, b) for k in steps for a, b in zip(decode_times(k, timesteps), decode_times(k, timesteps)[1:])})
    pairs = torch.tensor(pairs, device=device)
    pick = torch.randint(0, len(pairs), (n,), device=device, generator=generator)
    return pairs[pick, 0], pairs[pick, 1]


def consistency_loss(predict_v, x0: torch.Tensor, t: torch.Tensor, s: torch.Tensor, schedule: Schedule,
                     weight_t: torch.Tensor | None = None, weight_s: torch.Tensor | None = None,
                     generator=None) -> torch.Tensor:
    """w(t)|G(x_t,t,s) - x_s|^2 + w(s)|G(x_s,s,0) - x0|^2 (the second term where s > 0).

    ``predict_v(x, t, s)`` is the network; x_t and x_s share one noise draw. Weights default to 1
    (the later stages); stage 1 passes min(SNR, 5)/(SNR + 1)."""
    eps = noise_like(x0, generator)
    x_t, x_s = schedule.add_noise(x0, t, eps), schedule.add_noise(x0, s, eps)
    zero = torch.zeros_like(s)
    # One batched call for both terms keeps the CPU busy with larger convolutions.
    xs = torch.cat([x_t, x_s]); ts = torch.cat([t, s]); ss = torch.cat([s, zero])
    v = predict_v(xs, ts, ss)
    x0_hat = schedule.x0_from_v(xs, ts, v)
    jumped = schedule.jump(xs, ts, ss, x0_hat)
    target = torch.cat([x_s, x0])
    per_sample = (jumped - target).pow(2).flatten(1).mean(1)
    ones = torch.ones_like(t, dtype=x0.dtype)
    w = ones if weight_t is None else weight_t
    w_s = ones if weight_s is None else weight_s
    first, second = per_sample.chunk(2)
    return (w * first).mean() + (w_s * second * (s > 0).float()).mean()


@torch.no_grad()
def sample(predict_v, noise: torch.Tensor, times: list[int], schedule: Schedule) -> torch.Tensor:
    """Jump through ``times`` (e.g. [999, 666, 333, 0]) from ``noise``; one network call per jump."""
    x = noise
    n = noise.shape[0]
    for t_i, s_i in zip(times, times[1:]):
        t = torch.full((n,), t_i, device=x.device, dtype=torch.long)
        s = torch.full((n,), s_i, device=x.device, dtype=torch.long)
        x = schedule.jump(x, t, s, schedule.x0_from_v(x, t, predict_v(x, t, s)))
    return x
