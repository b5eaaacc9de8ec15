"""The FullyConv agent of SC2LE (Vinyals et al. 2017, section 4.3, "FullyConv").

Screen and minimap feature layers each go through two convolutions (16 filters 5x5, then 32 filters
3x3, stride 1, padded so the resolution is kept); the non-spatial `player` features (log-scaled) are
broadcast over the screen and concatenated, giving the shared state [N, 32 + 32 + 11, S, S]. A 1x1
convolution of the state gives each spatial argument head (screen, minimap, screen2) its logits over
pixels; the flattened state through a dense layer of 256 ReLU units gives the function-id logits
(masked by `available_actions`, the action mask), the other argument heads and the baseline V(s).

Unlike the paper, `available_actions` is not broadcast into the state (573 planes): it only masks
the function-id head. Screen and minimap must have the same size (the paper uses 64 for both).
"""

from __future__ import annotations

import torch
from pysc2.lib import features
from torch import nn

from impala_league.agents.core import Network, make_core
from impala_league.agents.network import mask_logits
from impala_league.agents.redo import Recyclable, default_init
from impala_league.agents.torsos import Torso
from impala_league.config import AgentConfig
from impala_league.envs.sc2_wrappers.actions import FunctionCallCodec
from impala_league.envs.sc2_wrappers.observation import (MINIMAP, NUM_PLAYER_FEATURES, PLAYER, SCREEN,
                                           FeatureLayerEncoder, SC2ObservationSpec)


def _tower(in_channels: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(in_channels, 16, 5, padding=2), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, padding=1), nn.ReLU())


class FullyConvTorso(Torso):
    """FullyConv's torso (Vinyals et al. 2017, section 4.3): the feature layers -> the shared state
    [N, 32 + 32 + 11, S, S] -> (the flat path's features [N, hidden], the spatial heads' logits: a 1x1
    convolution of the state, [N, S*S] per spatial head of `codec`, in its order).

    The spatial logits are computed here, from the state that only the torso holds, and passed to
    `FunctionCallHeads` beside the features (`encode`'s extra).
    """

    def __init__(self, spec: SC2ObservationSpec, codec: FunctionCallCodec, cfg: AgentConfig):
        super().__init__()
        self.screen_features = FeatureLayerEncoder(features.SCREEN_FEATURES, cfg.sc2_embed_dim)
        self.minimap_features = FeatureLayerEncoder(features.MINIMAP_FEATURES, cfg.sc2_embed_dim)
        self.screen_tower = _tower(self.screen_features.out_channels)
        self.minimap_tower = _tower(self.minimap_features.out_channels)
        state_channels = 32 + 32 + NUM_PLAYER_FEATURES
        self.spatial_policy = nn.Conv2d(state_channels, sum(1 for h in codec.heads if h.side), 1)
        self.fc = nn.Sequential(nn.Linear(state_channels * spec.screen_size ** 2, cfg.hidden), nn.ReLU())
        self.out_features = cfg.hidden

    def state(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        """obs: screen [N, C_s, S, S] and minimap [N, C_m, S, S] integer layers, player float [N, 11]
        (envs/sc2_wrappers/observation.py) -> the shared state float32 [N, 32 + 32 + 11, S, S]."""
        screen = self.screen_tower(self.screen_features(obs[SCREEN]))
        minimap = self.minimap_tower(self.minimap_features(obs[MINIMAP]))
        player = obs[PLAYER].float()[:, :, None, None].expand(-1, -1, *screen.shape[2:])
        return torch.cat([screen, minimap, player], 1)

    def forward(self, obs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.fc(self.state(obs).flatten(1))

    def encode(self, obs: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """obs as `state` takes it -> (features [N, hidden], the spatial heads' logits, [N, S*S] each)."""
        state = self.state(obs)
        return self.fc(state.flatten(1)), list(self.spatial_policy(state).flatten(2).unbind(1))

    def recyclable_layers(self) -> list[Recyclable]:
        return [Recyclable(self.fc[0], default_init)]  # the towers feed the spatial heads too: not recycled


class FunctionCallHeads(nn.Module):
    """FullyConv's heads: a linear layer per non-spatial head of `codec` (the function id and the
    non-spatial arguments) and the baseline, over the core's output [N, in_features]; the spatial heads'
    logits come from the torso."""

    def __init__(self, in_features: int, codec: FunctionCallCodec):
        super().__init__()
        self.codec = codec
        self.dense = nn.ModuleList(nn.Linear(in_features, h.size) for h in codec.heads if not h.side)
        self.baseline = nn.Linear(in_features, 1)

    def forward(self, hidden: torch.Tensor, spatial: list[torch.Tensor],
                action_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """hidden [N, in_features]; spatial as FullyConvTorso.encode gives it; action_mask:
        available_actions [N, 573], 0/1.

        Returns (logits float32 [N, sum of head sizes]: the codec's heads side by side, in its order,
        unavailable function ids at MASKED_LOGIT; baseline float32 [N]).
        """
        spatial_logits = iter(spatial)
        dense = iter(layer(hidden) for layer in self.dense)
        logits = [next(spatial_logits) if h.side else next(dense) for h in self.codec.heads]
        logits[0] = mask_logits(logits[0], action_mask)
        return torch.cat(logits, -1), self.baseline(hidden).squeeze(-1)

    def feature_readers(self) -> list[torch.Tensor]:
        """The weights that read the core's output: every dense head's and the baseline's."""
        return [*(layer.weight for layer in self.dense), self.baseline.weight]


class FullyConv(Network):
    """pi(a|s) over pysc2 FunctionCalls (one logit tensor per head of `codec`) and V(s), as SC2LE's
    FullyConv agent (Vinyals et al. 2017): FullyConvTorso -> core -> FunctionCallHeads.

    Args:
      spec: observation sizes; spec.screen_size must equal spec.minimap_size.
      codec: the action heads (same sizes as `spec`).
      cfg: `sc2_embed_dim` (categorical layers), `hidden` (the dense layer, 256 in the paper) and the
        core: an LSTM on the flat path after the dense layer (SC2LE's "FullyConv LSTM"); the spatial
        heads read the state as before.

    Raises ValueError if screen and minimap sizes differ.
    """

    def __init__(self, spec: SC2ObservationSpec, codec: FunctionCallCodec, cfg: AgentConfig):
        if spec.screen_size != spec.minimap_size:
            raise ValueError(f"FullyConv needs equal screen and minimap sizes, got {spec.screen_size} and "
                             f"{spec.minimap_size}")
        torso = FullyConvTorso(spec, codec, cfg)
        core = make_core(cfg, torso.out_features, codec.heads[0].size)
        super().__init__(torso, core, FunctionCallHeads(core.out_size, codec))
        self.codec = codec
