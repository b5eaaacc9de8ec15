"""The learner's update: one IMPALA step on a batch (`learn_step`, Espeholt et al. 2018, sec. 4), the
optimizer and its step, the learning-rate schedule, and the device the update runs on.

`learn_step` is the algorithm, with nothing of Redis, processes or files: the loss is
losses.actor_critic's on the network's forward pass (agents.core.forward_batch), the gradient clipped to
`learner.grad_norm_clip` before the step. `Learner` (distributed/learner/role.py) calls it once per batch;
A3C's parameter server (distributed/a3c.py) takes only `optimizer_step`.
"""

from __future__ import annotations

import functools
from contextlib import nullcontext
from typing import Callable

import torch

from impala_league.agents.core import dead_units, forward_batch
from impala_league.agents.heads import DiscreteHead, FunctionCallHead
from impala_league.batch import Batch
from impala_league.config import Config, ConfigError, LearnerConfig
from impala_league.losses.actor_critic import actor_critic_loss

Head = DiscreteHead | FunctionCallHead


def optimizer_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, cfg: LearnerConfig) -> dict[str, float]:
    """Clip the gradients in `model`'s .grad to global norm `cfg.grad_norm_clip` and step, unless that
    norm is not finite. Returns {"grad_norm": norm before clipping, "skipped_update": 1.0 or 0.0}."""
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_norm_clip)
    # A batch whose loss or gradient is not finite (finite but extreme values that overflow on the way,
    # e.g. rewards near float32's max) would turn every weight into nan for good: skip that update.
    skipped = not bool(torch.isfinite(grad_norm))
    if skipped:
        optimizer.zero_grad(set_to_none=True)
    else:
        optimizer.step()
    return {"grad_norm": float(grad_norm), "skipped_update": float(skipped)}


def learn_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: Batch, cfg: LearnerConfig,
               head: Head | None = None,
               reduce_gradients: Callable[[torch.nn.Module], None] | None = None) -> dict[str, float]:
    """One IMPALA update on `batch` (loss: losses.actor_critic.actor_critic_loss; `head` default one
    Discrete action). Returns the losses, grad_norm, skipped_update, the V-trace diagnostics and
    `dead_units` (agents.core.dead_units of the torso's features) as floats, of this batch.

    `reduce_gradients(model)`, with several learners (distributed/learner/data_parallel.py), averages the
    gradients over them between the backward pass and the clip, so the clip and the step see the
    gradient of the union of their batches."""
    features = []
    hook = model.feature_layer().register_forward_hook(lambda _module, _input, out: features.append(out.detach()))
    dtype = autocast_dtype(cfg.precision, batch.action.device, model)
    try:
        with torch.autocast(batch.action.device.type, dtype=dtype) if dtype else nullcontext():
            outputs = forward_batch(model, batch)
        loss, parts = actor_critic_loss(*(None if o is None else o.float() for o in outputs), batch, cfg,
                                        head or DiscreteHead())
    finally:
        hook.remove()
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    if reduce_gradients is not None:
        reduce_gradients(model)
    step = optimizer_step(model, optimizer, cfg)
    parts["dead_units"] = dead_units(features[0])  # read with the losses: one device-to-host copy
    return {**dict(zip(parts, torch.stack(list(parts.values())).tolist())), **step}


@functools.cache
def cpu_has_amx_bf16() -> bool:
    """This CPU multiplies bfloat16 matrices in AMX tiles (Intel Sapphire Rapids and later), which oneDNN
    uses for bfloat16 convolutions and matrix products."""
    return bool(torch.cpu._is_amx_tile_supported() and torch.ops.mkldnn._is_mkldnn_bf16_supported())


def slow_bf16_warning(precision: str, device: torch.device) -> str | None:
    """The warning to give where `learner.precision: bf16` runs on a CPU whose oneDNN has no bfloat16
    kernels (no AVX-512 bfloat16 or AMX instructions, e.g. AMD Zen 3): PyTorch then multiplies bfloat16
    matrices in a reference loop: connect four's update took 11x (the config's network) to 14x (twice as wide) the
    float32 time on a Zen 3 EPYC. None elsewhere."""
    if precision != "bf16" or device.type != "cpu" or torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return None
    return ("learner.precision bf16: this CPU has no bfloat16 matrix instructions (AVX-512 BF16 or AMX), so the "
            "update runs about 10x slower than with fp32; set learner.precision=fp32 (or auto)")


def autocast_dtype(precision: str, device: torch.device, model: torch.nn.Module) -> torch.dtype | None:
    """The dtype of the update's forward pass under `learner.precision`: bfloat16 for `bf16`, and for `auto`
    when `model`'s torso is a pixel torso (Torso.pixels) and `device` a CPU with AMX bfloat16 units; None (float32, no
    autocast) otherwise. On the 2-core reference CPU a bfloat16 update of the shallow torso runs 1.5x the
    float32 one (bench/bench_pixels.py); a small board network gains nothing there."""
    if precision == "auto":
        pixels = getattr(getattr(model, "torso", None), "pixels", False)
        precision = "bf16" if device.type == "cpu" and pixels and cpu_has_amx_bf16() else "fp32"
    return torch.bfloat16 if precision == "bf16" else None


def make_optimizer(model: torch.nn.Module, cfg: LearnerConfig) -> torch.optim.Optimizer:
    """`cfg.optimizer` over `model`'s parameters: RMSprop (IMPALA's, with `rmsprop_alpha`, `rmsprop_eps`)
    or Adam (`adam_eps`), at `cfg.learning_rate`. Both update all parameters in one pass of fused or
    multi-tensor kernels: PyTorch's CPU default steps them one tensor at a time, which took 11x the fused
    Adam's time for the shallow torso's 678K parameters, a third of the bfloat16 update."""
    if cfg.optimizer == "rmsprop":
        return torch.optim.RMSprop(model.parameters(), lr=cfg.learning_rate, alpha=cfg.rmsprop_alpha,
                                   eps=cfg.rmsprop_eps, foreach=True)
    return torch.optim.Adam(model.parameters(), lr=cfg.learning_rate, eps=cfg.adam_eps, fused=True)


def scheduled_learning_rate(cfg: Config, agent_steps: int, elapsed_s: float) -> float:
    """The learning rate for the next update. `linear` anneals `learner.learning_rate` linearly to 0
    (as in the IMPALA experiments, Espeholt et al. 2018) over the run's budget: progress is the larger of
    agent_steps / run.total_agent_steps and elapsed_s / (60 * run.max_minutes), so whichever ends the run first.
    `elapsed_s` is the run's training time so far, as run.max_minutes counts it: a resumed learner starts
    from the seconds its checkpoint recorded (distributed/learner/clock.py), so the schedule and the budget go on
    where they stopped."""
    lr = cfg.learner.learning_rate
    if cfg.learner.lr_schedule == "constant":
        return lr
    progress = agent_steps / cfg.run.total_agent_steps
    if cfg.run.max_minutes:
        progress = max(progress, elapsed_s / (60 * cfg.run.max_minutes))
    return lr * max(0.0, 1.0 - progress)


def pick_device(name: str) -> torch.device:
    """The device of `learner.device`: `auto` is CUDA when present, else the CPU. Raises ConfigError for a
    device this machine does not have (CUDA or MPS unavailable, a CUDA index past its count)."""
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError as e:
        raise ConfigError(f"learner.device={name}: {e}".splitlines()[0]) from None
    if device.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"learner.device={name} but CUDA is not available; use learner.device=auto or cpu")
    if device.type == "cuda" and (device.index or 0) >= torch.cuda.device_count():
        raise ConfigError(f"learner.device={name} but this machine has {torch.cuda.device_count()} CUDA device(s)")
    if device.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError(f"learner.device={name} but MPS is not available; use learner.device=auto or cpu")
    return device
