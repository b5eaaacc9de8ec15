"""SC2 observation encoder: wire arrays and network features from a pysc2 mock observation, cells by hand."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import impala_league.envs.sc2_wrappers  # noqa: F401  (imports pysc2 through the shim)
from impala_league.envs.sc2_wrappers.observation import (AVAILABLE_ACTIONS, MINIMAP, PLAYER, SCREEN, FeatureLayerEncoder,
                                           SC2ObservationSpec, encode_observation)
from pysc2.env import mock_sc2_env, sc2_env
from pysc2.lib import features

SCREEN_INDEX = {f.name: i for i, f in enumerate(features.SCREEN_FEATURES)}


def _mock_observation(screen: int, minimap: int):
    aif = sc2_env.AgentInterfaceFormat(feature_dimensions=sc2_env.Dimensions(screen=screen, minimap=minimap))
    env = mock_sc2_env.SC2TestEnv(map_name="MoveToBeacon", agent_interface_format=aif)
    return env.reset()[0].observation


def test_wire_arrays_have_the_spec_shapes_and_the_mock_values():
    spec = SC2ObservationSpec(screen_size=16, minimap_size=8)
    obs = _mock_observation(16, 8)
    obs["feature_screen"][SCREEN_INDEX["unit_type"], 2, 3] = 48  # a marine at row y=2, column x=3
    obs["feature_screen"][SCREEN_INDEX["unit_hit_points"], 2, 3] = 70000  # beyond uint16: clipped
    arrays = encode_observation(obs, spec)
    assert {k: (v.shape, v.dtype) for k, v in arrays.items()} == spec.arrays()
    assert arrays[SCREEN].shape == (27, 16, 16) and arrays[MINIMAP].shape == (11, 8, 8)
    assert arrays[SCREEN][SCREEN_INDEX["unit_type"], 2, 3] == 48
    assert arrays[SCREEN][SCREEN_INDEX["unit_hit_points"], 2, 3] == 65535
    # The mock player row is [1, 20, 50, 21, 36, 6, 15, 2, 6, 0, 0]: player_id 1, 20 minerals, 50 gas, ...
    assert arrays[PLAYER][1] == pytest.approx(math.log(21)) and arrays[PLAYER][0] == pytest.approx(math.log(2))
    assert arrays[PLAYER][-1] == 0.0
    # The mock lists functions 0-4, 6, 7, 451, 452 as available.
    assert np.flatnonzero(arrays[AVAILABLE_ACTIONS]).tolist() == [0, 1, 2, 3, 4, 6, 7, 451, 452]
    # The mock marks the top-left quarter of the minimap as the camera.
    camera = arrays[MINIMAP][[f.name for f in features.MINIMAP_FEATURES].index("camera")]
    assert camera[:4, :4].all() and camera.sum() == 16


def test_wrong_layer_size_is_refused():
    with pytest.raises(ValueError, match="feature_screen has shape .* env.screen_size"):
        encode_observation(_mock_observation(16, 8), SC2ObservationSpec(screen_size=32, minimap_size=8))


def test_features_one_hot_small_categories_embed_large_ones_and_log_scale_scalars():
    torch.manual_seed(0)
    encoder = FeatureLayerEncoder(features.SCREEN_FEATURES, embed_dim=8)
    # 27 layers: 11 scalar (1 channel each); categorical with <= 8 categories one-hot: visibility 4,
    # player_relative 5, and 10 binary layers (2 each); unit_type, player_id, effects, buffs embedded (8 each).
    assert encoder.out_channels == 11 + 4 + 5 + 10 * 2 + 4 * 8 == 72
    layers = torch.zeros(1, 27, 4, 4, dtype=torch.int32)
    layers[0, SCREEN_INDEX["height_map"], 1, 1] = 255
    layers[0, SCREEN_INDEX["unit_hit_points"], 1, 1] = 45
    layers[0, SCREEN_INDEX["player_relative"], 1, 1] = 4  # enemy
    layers[0, SCREEN_INDEX["unit_type"], 1, 1] = 48
    layers[0, SCREEN_INDEX["unit_type"], 0, 0] = 5000  # beyond the spec's 1962 categories: clamped to 1961
    out = encoder(layers)
    assert out.shape == (1, 72, 4, 4) and out.dtype == torch.float32
    # Channel offsets, in layer order: height_map 0, visibility 1-4, creep 5-6, power 7-8, player_id 9-16,
    # player_relative 17-21, unit_type 22-29, selected 30-31, unit_hit_points 32.
    assert out[0, 0, 1, 1].item() == pytest.approx(1.0)  # log(1 + 255) / log(256)
    assert out[0, 0, 0, 0].item() == 0.0
    assert out[0, 32, 1, 1].item() == pytest.approx(math.log(46) / math.log(1600))
    assert out[0, 17:22, 1, 1].tolist() == [0, 0, 0, 0, 1]
    assert out[0, 17:22, 0, 0].tolist() == [1, 0, 0, 0, 0]
    assert out[0, 1:5, 2, 2].tolist() == [1, 0, 0, 0]  # visibility 0 everywhere else
    table = encoder.embeddings[str(SCREEN_INDEX["unit_type"])].weight
    assert torch.equal(out[0, 22:30, 1, 1], table[48]) and torch.equal(out[0, 22:30, 0, 0], table[1961])
    scalars = [i for i, f in enumerate(features.SCREEN_FEATURES) if f.type == features.FeatureType.SCALAR]
    assert len(scalars) == 11
