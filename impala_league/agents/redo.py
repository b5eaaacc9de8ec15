"""Recycling dormant units (ReDo: Sokar, Agarwal, Castro and Evci 2023, "The Dormant Neuron Phenomenon in
Deep Reinforcement Learning", ICML, Algorithm 1).

A ReLU unit whose output is 0 on every input passes no gradient, so nothing brings it back; in a torso
where such units accumulate the policy loses its view of the state (`agents.core.dead_units` measures the
features' share). ReDo scores each unit i of a layer by its mean output over a batch relative to the
layer's mean (Sokar et al., eq. 1):

    s_i = E_x |h_i(x)| / ((1/H) sum_k E_x |h_k(x)|),

and a unit with s_i <= tau is dormant: its incoming weights and bias are drawn again as at the start, and
its outgoing weights (the next layer's, or the heads' and the core's for the torso's last layer) set to 0,
so the network computes the same function after the recycling as before it, and the unit learns again
from there. The optimizer's moments of those weights start again at 0.

A network names its recyclable layers (`Network.recyclable_layers`): the torso's Conv2d and Linear layers
in order, each followed by a ReLU, the next one reading the previous one's units (input channels of a
conv; blocks of columns of a Linear after a flatten), and the last one's units read by
`Network.feature_readers`.
"""

from __future__ import annotations

import copy
from typing import Callable, NamedTuple

import torch
from torch import nn


class Recyclable(NamedTuple):
    """A torso layer (nn.Conv2d or nn.Linear, followed by a ReLU) and `init(layer)`: re-initialize a
    layer of its kind in place, as the network did at construction."""

    layer: nn.Module
    init: Callable[[nn.Module], object]


def default_init(layer: nn.Module) -> None:
    """PyTorch's own initialization of an nn.Conv2d or nn.Linear."""
    layer.reset_parameters()


def unit_scores(model: nn.Module, obs, average: Callable[[torch.Tensor], torch.Tensor] | None = None) -> list[torch.Tensor]:
    """ReDo's score s_i (eq. 1 above) of every unit of each of `model.recyclable_layers()`, over the N
    observations `obs` (what `model.encode` takes): a list of float32 [units] tensors, one per layer, in
    their order. A layer whose units are all 0 everywhere scores 0 throughout.

    `average(t)`: the mean of t over several learners (data parallel), so that all of them recycle the
    same units; None for one learner."""
    layers = [r.layer for r in model.recyclable_layers()]
    means: list[torch.Tensor] = []

    def record(_module, _input, out):  # each layer is followed by a ReLU: its units are relu(out)
        h = torch.relu(out)
        means.append(h.mean(dim=[d for d in range(h.dim()) if d != 1]))

    hooks = [layer.register_forward_hook(record) for layer in layers]
    try:
        with torch.no_grad():
            model.encode(obs)
    finally:
        for hook in hooks:
            hook.remove()
    flat = torch.cat(means)
    if average is not None:
        flat = average(flat)
    scores, start = [], 0
    for m in means:
        layer_mean = flat[start:start + len(m)]
        start += len(m)
        total = layer_mean.mean()
        scores.append(layer_mean / total if total > 0 else torch.zeros_like(layer_mean))
    return scores


def _reading_columns(reader: nn.Module, units: int, index: torch.Tensor) -> torch.Tensor:
    """The columns of `reader`'s input that read units `index` of a layer of `units` units: input
    channels of a conv, the same columns of a Linear, or each unit's block of columns of a Linear that
    reads a flattened [units, H, W] map (channel-major, as nn.Flatten gives it)."""
    if isinstance(reader, nn.Conv2d):
        return index
    block = reader.in_features // units
    return (index[:, None] * block + torch.arange(block, device=index.device)).flatten()


def _zero_state(optimizer: torch.optim.Optimizer | None, param: torch.Tensor, where) -> None:
    """Zero the optimizer's per-element state of `param` (Adam's moments, RMSProp's mean square) at `where`."""
    if optimizer is None:
        return
    for value in optimizer.state.get(param, {}).values():
        if torch.is_tensor(value) and value.shape == param.shape:
            value[where] = 0


def recycle_dormant_units(model: nn.Module, optimizer: torch.optim.Optimizer | None, obs, threshold: float,
                          seed: int, average: Callable[[torch.Tensor], torch.Tensor] | None = None) -> tuple[int, int]:
    """ReDo over `model`'s recyclable layers on observations `obs` [N, ...] (a learner batch's, flattened):
    every unit scoring <= `threshold` (tau; `unit_scores`) gets fresh incoming weights and bias (drawn
    with torch seeded by `seed`, so learners that agree on the scores and the seed recycle alike) and zero
    outgoing weights, and the optimizer's state of both starts again at 0.

    Returns (recycled, units): the number of units recycled and the number of units scored.
    """
    recyclables = model.recyclable_layers()
    scores = unit_scores(model, obs, average)
    readers_of_last = model.feature_readers()
    recycled = 0
    with torch.no_grad(), torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # Last layer first: a unit's fresh incoming weights must not read a unit recycled below it.
        for i, ((layer, init), score) in reversed(list(enumerate(zip(recyclables, scores)))):
            index = torch.nonzero(score <= threshold).flatten().to(layer.weight.device)
            if not len(index):
                continue
            recycled += len(index)
            fresh = copy.deepcopy(layer).cpu()
            init(fresh)
            layer.weight[index] = fresh.weight.to(layer.weight.device)[index.cpu()]
            layer.bias[index] = fresh.bias.to(layer.bias.device)[index.cpu()]
            _zero_state(optimizer, layer.weight, index)
            _zero_state(optimizer, layer.bias, index)
            units = layer.weight.shape[0]
            if i + 1 < len(recyclables):
                reader = recyclables[i + 1].layer
                columns = _reading_columns(reader, units, index)
                reader.weight[:, columns] = 0
                _zero_state(optimizer, reader.weight, (slice(None), columns))
            else:
                for weight in readers_of_last:
                    weight[:, index] = 0
                    _zero_state(optimizer, weight, (slice(None), index))
    return recycled, sum(len(s) for s in scores)
