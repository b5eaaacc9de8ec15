"""Actor-critic networks: a torso (conv or MLP), an optional recurrent core, a policy head with action
masking, a baseline head."""

from __future__ import annotations

import math

import torch
from torch import nn

from impala_league.agents.core import LSTMCore, Network, feature_readers
from impala_league.agents.redo import Recyclable, default_init
from impala_league.agents.spec import PIXEL_TORSOS
from impala_league.agents.torsos import orthogonal_init, pixel_torso
from impala_league.config import AgentConfig

# Illegal actions get this logit: exp() underflows to exactly 0, yet log-probs and entropies stay
# finite (0 * -1e9 = 0), where -inf would give 0 * inf = nan.
MASKED_LOGIT = -1e9


def mask_logits(logits: torch.Tensor, action_mask: torch.Tensor) -> torch.Tensor:
    """logits [..., A] float; action_mask [..., A] (bool or 0/1). Illegal entries become MASKED_LOGIT."""
    return logits.masked_fill(action_mask == 0, MASKED_LOGIT)


def make_core(cfg: AgentConfig, input_size: int, num_actions: int) -> LSTMCore | None:
    """The core `cfg.core` asks for over features of `input_size`: None (`none`) or an LSTMCore."""
    if cfg.core == "none":
        return None
    return LSTMCore(input_size, cfg.core_size, num_actions, cfg.core_inputs is not False)


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


class ActorCritic(Network):
    """pi(a|x) and V(x) for one agent's observation: a torso (conv, MLP, or IMPALA's pixel torsos shallow and
    resnet of agents/torsos.py), an optional recurrent core
    (`cfg.core`, agents/core.py), a policy head and a baseline head.

    Args:
      obs_shape: one observation's shape; boards are channels-last (H, W, C) as PettingZoo gives them,
        frames for the pixel torsos channels-first (C, H, W) as gymnasium's frame stack gives them.
      num_actions: A, the size of the Discrete action space.
      cfg: torso choice and sizes, and the core.
      image: the observation is an image (EnvSpec.obs_image): the torso scales it by 1/255.
    """

    def __init__(self, obs_shape: tuple[int, ...], num_actions: int, cfg: AgentConfig, image: bool = False):
        super().__init__()
        self.obs_shape = tuple(obs_shape)
        self.num_actions = num_actions
        self.image = image  # EnvSpec.obs_image (uint8, bounds 0..255): scaled by 1/255; else as it is
        self.pixels = None
        if cfg.torso in PIXEL_TORSOS:  # frames: the torso scales them itself
            self.conv = None
            self.pixels = pixel_torso(cfg.torso, obs_shape, cfg.hidden, cfg.resnet_channels)
        elif cfg.torso == "conv":
            if len(obs_shape) != 3:
                raise ValueError(f"conv torso needs (H, W, C) observations, got shape {obs_shape}")
            h, w, c = obs_shape
            self.landing_plane = cfg.landing_plane
            self.threat_planes = cfg.threat_planes
            c += int(cfg.landing_plane) + 2 * int(cfg.threat_planes)
            padding = cfg.kernel_size // 2 if cfg.padding == "same" else 0
            layers: list[nn.Module] = []
            for i in range(cfg.conv_layers):
                layers += [nn.Conv2d(c if i == 0 else cfg.channels, cfg.channels, cfg.kernel_size, padding=padding),
                           nn.ReLU()]
            self.conv = nn.Sequential(*layers)
            with torch.no_grad():
                flat = self.conv(torch.zeros(1, c, h, w)).numel()
            self.fc = nn.Sequential(nn.Linear(flat, cfg.hidden), nn.ReLU())
        else:
            self.conv = None
            sizes = [math.prod(obs_shape)] + [cfg.hidden] * cfg.mlp_layers
            layers = []
            for a, b in zip(sizes[:-1], sizes[1:]):
                layers += [nn.Linear(a, b), nn.ReLU()]
            self.fc = nn.Sequential(*layers)
        self.core = make_core(cfg, cfg.hidden, num_actions)
        out = cfg.hidden if self.core is None else cfg.core_size
        self.policy = nn.Linear(out, num_actions)
        self.baseline = nn.Linear(out, 1)
        if self.pixels is not None:  # as the torso (agents/torsos.py): a near-uniform first policy
            orthogonal_init(self.policy, 0.01)
            orthogonal_init(self.baseline, 1.0)

    def feature_layer(self) -> nn.Module:
        return self.pixels if self.pixels is not None else self.fc

    def recyclable_layers(self) -> list[Recyclable]:
        if self.pixels is not None:
            return self.pixels.recyclable_layers()
        return [Recyclable(m, default_init) for m in (*(self.conv or ()), *self.fc)
                if isinstance(m, (nn.Conv2d, nn.Linear))]

    def feature_readers(self) -> list[torch.Tensor]:
        return feature_readers(self.core, [self.policy, self.baseline])

    def encode(self, obs: torch.Tensor) -> tuple[torch.Tensor, None]:
        """The torso: obs [N, *obs_shape] (any numeric dtype; scaled by 1/255 only where the env's space
        is an image, `image`: a uint8 Box of bounds 0..255) -> features [N, hidden]."""
        if self.pixels is not None:
            return self.pixels(obs), None
        x = obs.float() / 255.0 if self.image else obs.float()
        if self.conv is not None:
            extra = [landing_cells(x)] if self.landing_plane else []
            extra += [threat_cells(x)] if self.threat_planes else []
            if extra:
                x = torch.cat([x, *extra], -1)
            # channels-last is the layout the board already has, and oneDNN's conv runs faster on it
            x = self.conv(x.permute(0, 3, 1, 2).contiguous(memory_format=torch.channels_last))
        return self.fc(x.flatten(1)), None

    def decode(self, features: torch.Tensor, extra: None, action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The heads: features [N, hidden or core_size]; action_mask [N, A] -> (policy_logits [N, A]
        float32 with illegal actions at MASKED_LOGIT, baseline [N] float32)."""
        return mask_logits(self.policy(features), action_mask), self.baseline(features).squeeze(-1)


def explore(logits: torch.Tensor, action_mask: torch.Tensor, epsilon: torch.Tensor) -> torch.Tensor:
    """Behaviour logits of mu = (1 - epsilon) * pi + epsilon * uniform(legal actions).

    logits [N, A] masked policy logits; action_mask [N, A]; epsilon [N] in [0, 1].
    Returns masked logits [N, A] whose softmax is mu, so the learner's V-trace sees the true
    behaviour probabilities of the exploratory moves (Ape-X style per-env epsilon).
    """
    legal = (action_mask != 0).float()
    uniform = legal / legal.sum(-1, keepdim=True)
    mu = (1 - epsilon[:, None]) * torch.softmax(logits, -1) + epsilon[:, None] * uniform
    return mask_logits(torch.log(mu.clamp(min=1e-30)), action_mask)
