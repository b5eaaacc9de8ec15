"""The pixel torsos of IMPALA's Atari and DMLab agents (Espeholt et al. 2018, Fig. 3): frames in, features out.

* `ShallowTorso` ("shallow", left of Fig. 3): conv 16 8x8 stride 4, conv 32 4x4 stride 2, each with a
  ReLU, then a fully connected layer of `hidden` (256) ReLU units. The network of the A3C and DQN
  papers, small enough to train on a CPU.
* `ResNetTorso` ("deep", right of Fig. 3): per stack of `channels` (16, 32, 32) a 3x3 conv, a 3x3
  max-pool with stride 2, and two residual blocks ReLU -> 3x3 conv -> ReLU -> 3x3 conv (+ the block's
  input); then ReLU and a fully connected layer of `hidden` ReLU units. Fifteen conv layers: a GPU
  network (bench/bench_pixels.py measures both).

Frames are uint8 [N, C, H, W] (C stacked grayscale frames, as gymnasium's `FrameStackObservation`
gives them) everywhere outside the network: on the actor, on the wire and in replay. They become float
in [0, 1] only here, in the first line of `forward`.
"""

from __future__ import annotations

from typing import Sequence

import torch
from torch import nn

from impala_league.agents.redo import Recyclable
from impala_league.agents.spec import check_frames

def orthogonal_init(module: nn.Module, gain: float) -> nn.Module:
    """Orthogonal weights scaled by `gain` and zero biases for every conv and linear layer of `module`, the
    initialization of the reference A2C and PPO implementations on Atari (OpenAI Baselines; Andrychowicz
    et al. 2021, "What matters in on-policy RL", sec. 3). With PyTorch's default (small uniform weights,
    random biases) the first conv layer of the shallow torso died on Pong within minutes: every unit's
    ReLU negative on every frame, the policy then the same in every state."""
    for layer in module.modules():
        if isinstance(layer, (nn.Conv2d, nn.Linear)):
            nn.init.orthogonal_(layer.weight, gain)
            nn.init.zeros_(layer.bias)
    return module


RELU_GAIN = 2 ** 0.5  # the gain of a layer followed by a ReLU (He et al. 2015)


def _relu_init(layer: nn.Module) -> None:
    orthogonal_init(layer, RELU_GAIN)


def _flat_size(trunk: nn.Module, c: int, h: int, w: int) -> int:
    with torch.no_grad():
        return trunk(torch.zeros(1, c, h, w)).numel()


class ShallowTorso(nn.Module):
    """IMPALA's shallow torso: frames uint8 [N, C, H, W] -> features float32 [N, hidden].

    Raises ConfigError (a ValueError) for an observation that is not [C, H, W] frames of at least
    agents.spec.MIN_FRAME pixels a side.
    """

    def __init__(self, obs_shape: Sequence[int], hidden: int = 256):
        super().__init__()
        c, h, w = check_frames(obs_shape, "shallow")
        self.trunk = nn.Sequential(nn.Conv2d(c, 16, 8, stride=4), nn.ReLU(),
                                   nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(), nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(_flat_size(self.trunk, c, h, w), hidden), nn.ReLU())
        orthogonal_init(self, RELU_GAIN)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.fc(self.trunk(frames.float() / 255.0))

    def recyclable_layers(self) -> list[Recyclable]:
        return [Recyclable(m, _relu_init) for m in (self.trunk[0], self.trunk[2], self.fc[0])]


class ResidualBlock(nn.Module):
    """x + conv(relu(conv(relu(x)))), 3x3 convs keeping the channels and the size."""

    def __init__(self, channels: int):
        super().__init__()
        self.conv0 = nn.Conv2d(channels, channels, 3, padding=1)
        self.conv1 = nn.Conv2d(channels, channels, 3, padding=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv1(torch.relu(self.conv0(torch.relu(x))))


class ResNetTorso(nn.Module):
    """IMPALA's deep torso: frames uint8 [N, C, H, W] -> features float32 [N, hidden].

    channels: of the stacks, (16, 32, 32) in the paper; each stack halves the frame's sides (84 -> 42 ->
    21 -> 11). Raises ValueError as `ShallowTorso` does, or for an empty `channels`.
    """

    def __init__(self, obs_shape: Sequence[int], channels: Sequence[int] = (16, 32, 32), hidden: int = 256):
        super().__init__()
        frames = check_frames(obs_shape, "resnet")
        if not channels:
            raise ValueError("agent.resnet_channels needs at least one stack")
        layers: list[nn.Module] = []
        c = frames[0]
        for out in channels:
            layers += [nn.Conv2d(c, out, 3, padding=1), nn.MaxPool2d(3, stride=2, padding=1),
                       ResidualBlock(out), ResidualBlock(out)]
            c = out
        layers += [nn.ReLU(), nn.Flatten()]
        self.trunk = nn.Sequential(*layers)
        self.fc = nn.Sequential(nn.Linear(_flat_size(self.trunk, *frames), hidden), nn.ReLU())
        orthogonal_init(self, RELU_GAIN)

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.fc(self.trunk(frames.float() / 255.0))

    def recyclable_layers(self) -> list[Recyclable]:
        # The convs write into a residual stream (x + block(x)), whose channels a ReLU does not end.
        return [Recyclable(self.fc[0], _relu_init)]


def pixel_torso(torso: str, obs_shape: Sequence[int], hidden: int, resnet_channels: Sequence[int]) -> nn.Module:
    """The torso named `torso` (one of PIXEL_TORSOS) over frames of `obs_shape`."""
    if torso == "shallow":
        return ShallowTorso(obs_shape, hidden)
    return ResNetTorso(obs_shape, resnet_channels, hidden)
