"""SC2 observations: pysc2 timesteps -> named numpy arrays (wire) -> float features (network input).

The split follows what travels: the actor sends the integer feature layers as they come (uint16, a
quarter of pysc2's int32), and the learner's network turns them into features on its device, so the
wire never carries one-hot planes.

Feature layers (SC2LE, Vinyals et al. 2017, section 4.3), described by pysc2's own specs
(`features.SCREEN_FEATURES`, `features.MINIMAP_FEATURES`: name, type, scale):
* categorical layers with at most `embed_dim` categories become one-hot planes (`scale` channels);
  larger ones (unit_type: 1962, buffs: 290, player_id: 17, effects: 16 at embed_dim 8) are embedded in
  `embed_dim` channels, the same as one-hot followed by a 1x1 convolution;
* scalar layers become log(1 + x) / log(scale), so 0..scale-1 maps onto [0, 1].
`player` (minerals, vespene, food, army counts... 11 values) becomes log(1 + x); `available_actions`
becomes the 0/1 mask over pysc2's function ids that the function-id head is masked with.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from pysc2.lib import actions as sc2_actions
from pysc2.lib import features
from torch import nn

SCREEN = "screen"
MINIMAP = "minimap"
PLAYER = "player"
AVAILABLE_ACTIONS = "available_actions"
NUM_PLAYER_FEATURES = len(features.Player)
NUM_FUNCTIONS = len(sc2_actions.FUNCTIONS)
LAYER_DTYPE = np.dtype(np.uint16)


@dataclass(frozen=True)
class SC2ObservationSpec:
    """Shapes and dtypes of one agent's encoded observation.

    screen_size / minimap_size: feature layer resolution in pixels (square), from the config.
    """

    screen_size: int
    minimap_size: int

    def arrays(self) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
        """name -> (shape, dtype) of each array `encode_observation` returns."""
        s, m = self.screen_size, self.minimap_size
        return {
            SCREEN: ((len(features.SCREEN_FEATURES), s, s), LAYER_DTYPE),
            MINIMAP: ((len(features.MINIMAP_FEATURES), m, m), LAYER_DTYPE),
            PLAYER: ((NUM_PLAYER_FEATURES,), np.dtype(np.float32)),
            AVAILABLE_ACTIONS: ((NUM_FUNCTIONS,), np.dtype(np.uint8)),
        }


def encode_observation(obs, spec: SC2ObservationSpec) -> dict[str, np.ndarray]:
    """One pysc2 observation (a TimeStep's `observation` mapping) -> the arrays of `spec.arrays()`.

    Returns screen uint16 [C_screen, S, S] and minimap uint16 [C_minimap, M, M] (layer values as pysc2
    gives them, clipped to 0..65535), player float32 [11] = log(1 + player), available_actions uint8
    [573] with 1 at each function id pysc2 lists as available.

    Raises ValueError if a feature layer's shape does not match `spec` (the env was made with other
    sizes than the config says).
    """
    out = {}
    for name, key in ((SCREEN, "feature_screen"), (MINIMAP, "feature_minimap")):
        layers = np.asarray(obs[key])
        shape = spec.arrays()[name][0]
        if layers.shape != shape:
            raise ValueError(f"{key} has shape {layers.shape}, expected {shape} from env.screen_size/minimap_size")
        out[name] = np.clip(layers, 0, np.iinfo(LAYER_DTYPE).max).astype(LAYER_DTYPE)
    out[PLAYER] = np.log1p(np.maximum(np.asarray(obs["player"], dtype=np.float64), 0)).astype(np.float32)
    mask = np.zeros(NUM_FUNCTIONS, dtype=np.uint8)
    mask[np.asarray(obs["available_actions"], dtype=np.int64)] = 1
    out[AVAILABLE_ACTIONS] = mask
    return out


class FeatureLayerEncoder(nn.Module):
    """Integer feature layers [N, C, H, W] -> float features [N, out_channels, H, W].

    Args:
      layers: pysc2 feature specs in channel order (`features.SCREEN_FEATURES` or `MINIMAP_FEATURES`).
      embed_dim: categorical layers with at most this many categories are one-hot; larger ones are
        embedded in this many channels (learned).
    """

    def __init__(self, layers, embed_dim: int):
        super().__init__()
        self.types = [f.type for f in layers]
        self.scales = [int(f.scale) for f in layers]
        self.embed_dim = embed_dim
        self.embeddings = nn.ModuleDict({
            str(i): nn.Embedding(scale, embed_dim)
            for i, (kind, scale) in enumerate(zip(self.types, self.scales))
            if kind == features.FeatureType.CATEGORICAL and scale > embed_dim
        })
        self.out_channels = sum(1 if kind == features.FeatureType.SCALAR else min(scale, embed_dim)
                                for kind, scale in zip(self.types, self.scales))

    def forward(self, layers: torch.Tensor) -> torch.Tensor:
        """layers [N, C, H, W], any integer dtype. Returns float32 [N, out_channels, H, W].

        Categorical values at or above the layer's scale are clamped to scale - 1.
        """
        x = layers.long()
        planes = []
        for i, (kind, scale) in enumerate(zip(self.types, self.scales)):
            if kind == features.FeatureType.SCALAR:
                planes.append(torch.log1p(x[:, i:i + 1].float()) / math.log(scale))
                continue
            ids = x[:, i].clamp(0, scale - 1)
            if str(i) in self.embeddings:
                planes.append(self.embeddings[str(i)](ids).permute(0, 3, 1, 2))
            else:
                planes.append(nn.functional.one_hot(ids, scale).permute(0, 3, 1, 2).float())
        return torch.cat(planes, 1)
