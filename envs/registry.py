"""Env registry: every game is reached by name, with its specs written down in one place."""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable, Optional

import numpy as np

from envs.aec import AECAdapter


@dataclass(frozen=True)
class EnvSpec:
    """What the actor, learner, codec and agents need to know about a game.

    obs_shape / obs_dtype: one agent's observation (channels last for boards).
    num_actions: size of the Discrete action space; `action_mask` is uint8 [num_actions].
    seats: agent names in seat order (seat 0 moves first in turn-based games).
    mirror_actions: for a game symmetric under reflecting observation axis `mirror_axis`, the action
      that each action becomes under the reflection; None where the game has no such symmetry.
    version: the versioned PettingZoo env module the game comes from (e.g. `connect_four_v3`);
      replays record it and refuse to re-simulate under another.
    """

    name: str
    obs_shape: tuple[int, ...]
    obs_dtype: np.dtype
    num_actions: int
    seats: tuple[str, ...]
    mirror_axis: Optional[int] = None
    mirror_actions: Optional[tuple[int, ...]] = None
    version: Optional[str] = None


def _connect_four(render_mode: Optional[str] = None):
    from pettingzoo.classic import connect_four_v3

    return connect_four_v3.env(render_mode=render_mode)


def _tictactoe(render_mode: Optional[str] = None):
    from pettingzoo.classic import tictactoe_v3

    return tictactoe_v3.env(render_mode=render_mode)


# Tic-tac-toe's action a marks observation cell (a // 3, a % 3); reflecting columns maps c -> 2 - c.
_TICTACTOE_MIRROR = tuple(3 * (a // 3) + 2 - a % 3 for a in range(9))

_REGISTRY: dict[str, tuple[EnvSpec, Callable[..., object]]] = {
    "connect_four": (
        EnvSpec("connect_four", (6, 7, 2), np.dtype(np.int8), 7, ("player_0", "player_1"),
                mirror_axis=1, mirror_actions=tuple(range(6, -1, -1)), version="connect_four_v3"),
        _connect_four,
    ),
    "tictactoe": (
        EnvSpec("tictactoe", (3, 3, 2), np.dtype(np.int8), 9, ("player_1", "player_2"),
                mirror_axis=1, mirror_actions=_TICTACTOE_MIRROR, version="tictactoe_v3"),
        _tictactoe,
    ),
}

ENV_NAMES: tuple[str, ...] = tuple(_REGISTRY)


def _lookup(name: str) -> tuple[EnvSpec, Callable[..., object]]:
    if name not in _REGISTRY:
        close = difflib.get_close_matches(name, ENV_NAMES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"unknown env '{name}'{hint}; valid: {', '.join(ENV_NAMES)}")
    return _REGISTRY[name]


def env_spec(name: str) -> EnvSpec:
    """The spec of env `name`. Raises ValueError naming the valid envs if `name` is unknown."""
    return _lookup(name)[0]


def make_env(name: str, seed: int) -> AECAdapter:
    """A fresh turn-based adapter around env `name`; episode k is seeded `seed + k`."""
    return AECAdapter(_lookup(name)[1], seed)


def make_raw_env(name: str, render_mode: Optional[str] = None):
    """The PettingZoo env itself (for evaluation and replays that drive the AEC loop directly).

    render_mode: None, or a mode the env supports (`"rgb_array"`: `env.render()` returns uint8
    `[H, W, 3]` frames; PettingZoo's classic games draw them with pygame, without a display).
    """
    return _lookup(name)[1](render_mode)
