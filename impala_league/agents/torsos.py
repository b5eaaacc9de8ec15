"""Torsos: the first part of every network (torso -> core -> heads, agents.core.Network), observations in,
features [N, hidden] out. Each torso is one class with the `Torso` interface, named in `TORSOS` by its
`@register_torso(name)`: a new torso is a class and that line (docs/your-game-your-network.md), here or in
a module of your own (`agent.torso=<module>:<name>` imports it in every process).

* `MLPTorso` ("mlp"): `mlp_layers` fully connected ReLU layers of `hidden` units over the flattened
  observation (vectors, small boards).
* `ConvTorso` ("conv"): boards [H, W, C], channels last as PettingZoo gives them: `conv_layers` ReLU
  convolutions of `channels` filters, then one fully connected layer of `hidden` ReLU units; with
  `landing_plane` and `threat_planes` (connect four) extra planes computed from the board
  (`landing_cells`, `threat_cells`).
* The pixel torsos of IMPALA's Atari and DMLab agents (Espeholt et al. 2018, Fig. 3), frames in:
  * `ShallowTorso` ("shallow", left of Fig. 3): conv 16 8x8 stride 4, conv 32 4x4 stride 2, each with a
    ReLU, then a fully connected layer of `hidden` (256) ReLU units. The network of the A3C and DQN
    papers, small enough to train on a CPU.
  * `ResNetTorso` ("deep", right of Fig. 3): per stack of `channels` (16, 32, 32) a 3x3 conv, a 3x3
    max-pool with stride 2, and two residual blocks ReLU -> 3x3 conv -> ReLU -> 3x3 conv (+ the block's
    input); then ReLU and a fully connected layer of `hidden` ReLU units. Fifteen conv layers: a GPU
    network (bench/bench_pixels.py measures both).

Frames are uint8 [N, C, H, W] (C stacked grayscale frames, as gymnasium's `FrameStackObservation`
gives them) everywhere outside the network: on the actor, on the wire and in replay. They become float
in [0, 1] only here, in the first line of the pixel torsos' `forward` (`scale_frames`; with
`agent.center_frames`, minus each observation's mean).

StarCraft II's FullyConv torso (agents/fullyconv.py) has the same interface but is not in `TORSOS`: it
needs the action codec and pysc2, which only StarCraft II processes import; agents.model.make_model
builds it for `agent.torso=fullyconv`.
"""

from __future__ import annotations

import importlib
import math
from typing import Callable, Sequence

import torch
from torch import nn

from impala_league.agents.redo import Recyclable, default_init
from impala_league.agents.spec import check_frames
from impala_league.config import TORSOS as CONFIG_TORSOS, AgentConfig, ConfigError


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


def scale_frames(frames: torch.Tensor, center: bool = False) -> torch.Tensor:
    """uint8 frames [N, C, H, W] -> floats in [0, 1] of the same shape, in the dtype the convolutions run in:
    bfloat16 under a bfloat16 autocast (update.autocast_dtype), which the first convolution would otherwise
    cast to in one more pass over the batch's frames, else float32. `center`: minus each observation's
    mean over its C x H x W values (`agent.center_frames`), so the first layer's inputs have zero mean
    (LeCun et al. 1998, "Efficient BackProp", sec. 4.3: with inputs of one sign every weight of a unit
    moves in the same direction at each step)."""
    kind = frames.device.type
    dtype = torch.get_autocast_dtype(kind) if torch.is_autocast_enabled(kind) else torch.float32
    x = frames.to(dtype)
    x = x / 255 if x is frames else x.div_(255)  # in place only on the copy
    return x.sub_(x.mean(dim=tuple(range(1, x.dim())), keepdim=True)) if center else x


def _flat_size(trunk: nn.Module, c: int, h: int, w: int) -> int:
    with torch.no_grad():
        return trunk(torch.zeros(1, c, h, w)).numel()


class Torso(nn.Module):
    """The interface of every torso: `forward(obs [N, *obs_shape]) -> features float32 [N, out_features]`,
    the output of `fc`, its last layers (a ReLU last: the units `dead_units` and ReDo read).

    `from_config(obs_shape, cfg, image)` builds one from an AgentConfig; `image` (EnvSpec.obs_image: a
    uint8 Box of bounds 0..255) asks a board or vector torso to scale the observation by 1/255.
    `head_gains`: (policy, baseline) gains of an orthogonal initialization of the heads that read this
    torso, or None for PyTorch's default (`LinearHeads`). `pixels`: a torso of uint8 frames, whose
    convolutions dominate the update (`learner.precision: auto` runs them in bfloat16 on an AMX CPU).
    """

    out_features: int
    head_gains: tuple[float, float] | None = None
    pixels: bool = False
    fc: nn.Sequential

    @classmethod
    def from_config(cls, obs_shape: Sequence[int], cfg: AgentConfig, image: bool = False) -> "Torso":
        return cls(obs_shape, cfg, image)

    def encode(self, obs) -> tuple[torch.Tensor, object]:
        """(features [N, out_features], what the heads read beside them: None here; FullyConv's spatial
        logits)."""
        return self(obs), None

    def feature_layer(self) -> nn.Module:
        """The module whose output is the features [N, out_features]: ReLU units, read by `dead_units`."""
        return self.fc

    def recyclable_layers(self) -> list[Recyclable]:
        """The layers whose ReLU units ReDo may recycle (agents.redo.Recyclable, in order; the last one's
        units are the features)."""
        raise NotImplementedError


# agent.torso -> its class: the one table of torsos, filled by `register_torso` ("fullyconv" is
# agents/fullyconv.py's network, see the module doc). config.TORSOS holds its names for the config's check.
TORSOS: dict[str, type[Torso]] = {}


def register_torso(name: str) -> Callable[[type[Torso]], type[Torso]]:
    """Class decorator: `agent.torso=<name>` builds this Torso subclass (`cls.from_config(obs_shape,
    agent_cfg, image)`); adds the name to the values the config accepts (config.TORSOS). Returns the
    class unchanged. Raises ValueError for a name already registered to another class, for 'fullyconv',
    or for a name with ':' (reserved for <module>:<name>); TypeError for a class that is not a Torso."""

    def register(cls: type[Torso]) -> type[Torso]:
        if not (isinstance(cls, type) and issubclass(cls, Torso)):
            raise TypeError(f"register_torso('{name}'): {cls!r} is not a subclass of agents.torsos.Torso")
        taken = TORSOS.get(name)
        if name == "fullyconv" or ":" in name or not name or (taken is not None and taken is not cls):
            raise ValueError(f"register_torso('{name}'): the name is taken or reserved (taken: "
                             f"{', '.join(sorted(TORSOS))}, fullyconv; ':' marks <module>:<name>); choose another")
        TORSOS[name] = cls
        CONFIG_TORSOS.add(name)
        return cls

    return register


def torso_class(name: str) -> type[Torso]:
    """The class `agent.torso=name` builds: TORSOS[name], or for `<module>:<torso>` the torso <torso> that
    importing <module> (found through PYTHONPATH, as actors and learner import it) registered. Raises
    ConfigError naming the valid forms for a name that is neither, or a module that registers no such torso."""
    if name in TORSOS:
        return TORSOS[name]
    module, sep, torso = name.partition(":")
    if not sep:
        raise ConfigError(f"agent.torso={name} is not a torso of ActorCritic: one of {', '.join(sorted(TORSOS))} "
                          "(fullyconv: StarCraft II), a name given to register_torso, or <module>:<name>")
    try:
        importlib.import_module(module)
    except ImportError as e:
        raise ConfigError(f"agent.torso={name}: cannot import module '{module}' ({e}); put its folder on "
                          "PYTHONPATH") from None
    if torso not in TORSOS:
        raise ConfigError(f"agent.torso={name}: module '{module}' registers no torso '{torso}' "
                          f"(registered: {', '.join(sorted(TORSOS))}); decorate its class with "
                          f"@register_torso('{torso}')")
    return TORSOS[torso]


@register_torso("mlp")
class MLPTorso(Torso):
    """Fully connected ReLU layers over the flattened observation: obs [N, *obs_shape] (any numeric
    dtype) -> features float32 [N, hidden]. `cfg.mlp_layers` layers of `cfg.hidden` units."""

    def __init__(self, obs_shape: Sequence[int], cfg: AgentConfig, image: bool = False):
        super().__init__()
        self.image = image  # scale by 1/255
        sizes = [math.prod(obs_shape)] + [cfg.hidden] * cfg.mlp_layers
        layers: list[nn.Module] = []
        for a, b in zip(sizes[:-1], sizes[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        self.fc = nn.Sequential(*layers)
        self.out_features = sizes[-1]

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0 if self.image else obs.float()
        return self.fc(x.flatten(1))

    def recyclable_layers(self) -> list[Recyclable]:
        return [Recyclable(m, default_init) for m in self.fc if isinstance(m, nn.Linear)]


def landing_cells(board: torch.Tensor) -> torch.Tensor:
    """board [N, H, W, C] float, C planes of 0/1 pieces, row 0 at the top and pieces falling to row H-1
    (connect four). Returns [N, H, W, 1]: 1 at each column's landing cell, the empty cell whose cell
    below is occupied or is the floor; 0 elsewhere (and in a full column)."""
    occupied = board.sum(-1).clamp(max=1.0)
    below = torch.cat([occupied[:, 1:], torch.ones_like(occupied[:, :1])], 1)
    return ((1.0 - occupied) * below).unsqueeze(-1)


def threat_cells(board: torch.Tensor, length: int = 4) -> torch.Tensor:
    """board [N, H, W, 2] float, each plane one player's 0/1 pieces (connect four: PettingZoo's planes,
    the player to move first). Returns [N, H, W, 2]: plane p is 1 at each empty cell that would complete
    `length` of player p's pieces in a row, column or diagonal, whether or not a piece can land there now.

    Every window of `length` cells in the four directions is summed from shifted views of
    y_p = pieces_p - length * pieces_other, so a window sums to length - 1 exactly when it holds
    length - 1 pieces of p and none of the other player's; such a window marks its cells, and the
    empty ones are kept. Shifted views, not line-kernel convolutions: a sixth of their time for 1,280 boards."""
    if board.shape[-1] != 2:
        raise ValueError(f"threat_cells needs two piece planes, got {board.shape[-1]}")
    h, w = board.shape[1:3]
    x = board.permute(0, 3, 1, 2)
    y = x - length * x.flip(1)
    cells = torch.zeros_like(x)
    for dr, dc in ((0, 1), (1, 0), (1, 1), (1, -1)):
        rows, cols = h - (length - 1) * dr, w - (length - 1) * abs(dc)
        c0 = length - 1 if dc < 0 else 0
        views = [(slice(None), slice(None), slice(i * dr, i * dr + rows), slice(c0 + i * dc, c0 + i * dc + cols))
                 for i in range(length)]
        window = y[views[0]] + y[views[1]]
        for v in views[2:]:
            window += y[v]
        threat = (window == length - 1).to(x.dtype)
        for v in views:
            cells[v] += threat
    empty = x.sum(1, keepdim=True) == 0
    return ((cells > 0) & empty).to(x.dtype).permute(0, 2, 3, 1)


@register_torso("conv")
class ConvTorso(Torso):
    """Boards: obs [N, H, W, C] (channels last, as PettingZoo gives them; any numeric dtype) -> features
    float32 [N, hidden]. `cfg.conv_layers` ReLU convolutions of `cfg.channels` filters `cfg.kernel_size`
    wide (`cfg.padding` same or valid), then a fully connected layer of `cfg.hidden` ReLU units. The
    board gains a plane of `landing_cells` (`cfg.landing_plane`) and two of `threat_cells`
    (`cfg.threat_planes`) before the first convolution.

    Raises ValueError for an observation that is not [H, W, C].
    """

    def __init__(self, obs_shape: Sequence[int], cfg: AgentConfig, image: bool = False):
        super().__init__()
        if len(obs_shape) != 3:
            raise ValueError(f"conv torso needs (H, W, C) observations, got shape {tuple(obs_shape)}")
        h, w, c = obs_shape
        self.image = image  # scale by 1/255
        self.landing_plane = cfg.landing_plane
        self.threat_planes = cfg.threat_planes
        c += int(cfg.landing_plane) + 2 * int(cfg.threat_planes)
        padding = cfg.kernel_size // 2 if cfg.padding == "same" else 0
        layers: list[nn.Module] = []
        for i in range(cfg.conv_layers):
            layers += [nn.Conv2d(c if i == 0 else cfg.channels, cfg.channels, cfg.kernel_size, padding=padding),
                       nn.ReLU()]
        self.conv = nn.Sequential(*layers)
        self.fc = nn.Sequential(nn.Linear(_flat_size(self.conv, c, h, w), cfg.hidden), nn.ReLU())
        self.out_features = cfg.hidden

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        x = obs.float() / 255.0 if self.image else obs.float()
        extra = [landing_cells(x)] if self.landing_plane else []
        extra += [threat_cells(x)] if self.threat_planes else []
        if extra:
            x = torch.cat([x, *extra], -1)
        # channels-last is the layout the board already has, and oneDNN's conv runs faster on it
        x = self.conv(x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last))
        return self.fc(x.flatten(1))

    def recyclable_layers(self) -> list[Recyclable]:
        return [Recyclable(m, default_init) for m in (*self.conv, *self.fc) if isinstance(m, (nn.Conv2d, nn.Linear))]


@register_torso("shallow")
class ShallowTorso(Torso):
    """IMPALA's shallow torso (Espeholt et al. 2018, Fig. 3, left): frames uint8 [N, C, H, W] -> features
    float32 [N, hidden]; `center_frames` (agent.center_frames): zero-mean inputs, see `scale_frames`.

    Raises ConfigError (a ValueError) for an observation that is not [C, H, W] frames of at least
    agents.spec.MIN_FRAME pixels a side.
    """

    head_gains = (0.01, 1.0)  # a near-uniform first policy
    pixels = True

    def __init__(self, obs_shape: Sequence[int], hidden: int = 256, center_frames: bool = False):
        super().__init__()
        c, h, w = check_frames(obs_shape, "shallow")
        self.center_frames = center_frames
        self.trunk = nn.Sequential(nn.Conv2d(c, 16, 8, stride=4), nn.ReLU(),
                                   nn.Conv2d(16, 32, 4, stride=2), nn.ReLU(), nn.Flatten())
        self.fc = nn.Sequential(nn.Linear(_flat_size(self.trunk, c, h, w), hidden), nn.ReLU())
        self.out_features = hidden
        orthogonal_init(self, RELU_GAIN)

    @classmethod
    def from_config(cls, obs_shape: Sequence[int], cfg: AgentConfig, image: bool = False) -> "ShallowTorso":
        return cls(obs_shape, cfg.hidden, cfg.center_frames)  # frames are scaled in `forward`, whatever `image` says

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.fc(self.trunk(scale_frames(frames, self.center_frames)))

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


@register_torso("resnet")
class ResNetTorso(Torso):
    """IMPALA's deep torso (Espeholt et al. 2018, Fig. 3, right): frames uint8 [N, C, H, W] -> features
    float32 [N, hidden]; `center_frames` (agent.center_frames): zero-mean inputs, see `scale_frames`.

    channels: of the stacks, (16, 32, 32) in the paper; each stack halves the frame's sides (84 -> 42 ->
    21 -> 11). Raises ValueError as `ShallowTorso` does, or for an empty `channels`.
    """

    head_gains = (0.01, 1.0)  # a near-uniform first policy
    pixels = True

    def __init__(self, obs_shape: Sequence[int], channels: Sequence[int] = (16, 32, 32), hidden: int = 256,
                 center_frames: bool = False):
        super().__init__()
        self.center_frames = center_frames
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
        self.out_features = hidden
        orthogonal_init(self, RELU_GAIN)

    @classmethod
    def from_config(cls, obs_shape: Sequence[int], cfg: AgentConfig, image: bool = False) -> "ResNetTorso":
        return cls(obs_shape, cfg.resnet_channels, cfg.hidden, cfg.center_frames)  # frames are scaled in `forward`

    def forward(self, frames: torch.Tensor) -> torch.Tensor:
        return self.fc(self.trunk(scale_frames(frames, self.center_frames)))

    def recyclable_layers(self) -> list[Recyclable]:
        # The convs write into a residual stream (x + block(x)), whose channels a ReLU does not end.
        return [Recyclable(self.fc[0], _relu_init)]

