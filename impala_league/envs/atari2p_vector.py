"""`atari2p:<game>` for an actor: all of its games stepped by one group, with the Python of a frame cut down.

The actor sees the same per-slot interface as with one `envs.parallel.ParallelAdapter` over
`envs.atari2p.Preprocessed` per slot (`advance() -> Step`, `act(actions)`), and every game plays as
there, step for step: the same observations, rewards, settlements and episode results for the same
seeds and actions (tests/envs/test_atari2p_vector.py checks it against that path):

* each acting player gets one settlement per action, its reward the game's score change, unclipped;
  a player whose game ended (`terminated`) settles with `done`, the `max_cycles` time limit settles
  every player left with `done, truncated` and the frame stack of the state the game was cut in;
* a finished game gives `EpisodeResult(returns per seat, env steps, the seat with the highest return)`
  and the slot plays on in a new game reset with the slot's next episode seed (`envs.base.EpisodeSeeds`),
  without a gap: a reset is `Preprocessed.reset`, no-op starts included.

What is faster than that path (bench/bench_atari_env.py measures both): multi_agent_ale_py's
`ALEInterface` converts its arrays to ctypes on every call (`act` alone builds 2 arrays and 2 ctypes
views per frame), and PettingZoo's `step` builds 5 dicts and reads the RAM per frame; here each
emulator is called through its C library with arrays made once (`ALECalls`), as PettingZoo's `step`
would (the same calls in the same order, the RAM read left out: nothing reads it). The two screens
of every game are max-pooled in one NumPy call and resized in one OpenCV call (`resize_frames`: the
games' screens one above the other, which gives each game's own resize where the heights divide
exactly, as 210 -> 84 does; checked when the group is built, otherwise game by game). The frame stacks
of all players of all games are one array (`[N * players, planes, H, W]`, a new one every step): a
player's observation is a view of its row, so with every seat learning the forward pass reads that
array itself (`distributed.actor.stacked`) and the one copy on the way to the wire stays the
unroll's. Stepping is single-threaded: multi_agent_ale_py's ctypes calls release the GIL, but an actor
is one process per core.
"""

from __future__ import annotations

import ctypes
from typing import Any, Mapping, Sequence

import numpy as np

from impala_league.envs import atari2p
from impala_league.envs.atari import read_end_screens
from impala_league.envs.base import EpisodeResult, EpisodeSeeds, GroupSlot, Settlement, Step, leader


class ALECalls:
    """One multi_agent_ale_py emulator called through its C library (`ale_lib`) with ctypes arrays
    made once: `act` plays one frame of `actions` (ALE action ids, one per player) into `rewards`."""

    def __init__(self, ale: Any, players: int):
        from multi_agent_ale_py.ale_python_interface import ale_lib

        self.lib, self.obj = ale_lib, ale.obj
        if ale_lib.actMultiSize(self.obj) != players or ale_lib.livesSize(self.obj) != players:
            raise ValueError(f"the emulator plays {ale_lib.actMultiSize(self.obj)} players where the env has "
                             f"{players}")
        self.actions = (ctypes.c_int * players)()
        self.rewards = (ctypes.c_int * players)()
        self.lives = (ctypes.c_int * players)()

    def act(self) -> None:
        self.lib.actMulti(self.obj, self.actions, self.rewards)

    def game_over(self) -> bool:
        return self.lib.game_over(self.obj)

    def lost(self, players: Sequence[int]) -> list[int]:
        """Those of `players` with no life left (PettingZoo's termination while the game goes on: the ALE
        gives an inactive player -1 lives)."""
        self.lib.lives(self.obj, self.lives)
        lives = self.lives
        return [k for k in players if lives[k] < 0]

    def screen(self, address: int) -> None:
        """The grayscale screen into the uint8 [210, 160] C-contiguous array at `address`."""
        self.lib.getScreenGrayscale(self.obj, address)


def resize_frames(screens: np.ndarray, out: np.ndarray, tall: bool) -> None:
    """Resize uint8 screens [N, h, w] to `out` [N, s, s] with OpenCV's area interpolation, as
    `Preprocessed` does one screen at a time; `tall`: in one call, the screens one above the other."""
    import cv2

    n, h, w = screens.shape
    size = out.shape[1]
    if tall:
        cv2.resize(screens.reshape(n * h, w), (size, n * size), dst=out.reshape(n * size, size),
                   interpolation=cv2.INTER_AREA)
        return
    for i in range(n):
        cv2.resize(screens[i], (size, size), dst=out[i], interpolation=cv2.INTER_AREA)


def tall_resize_exact(n: int, height: int, width: int, size: int) -> bool:
    """Does one resize of n screens one above the other give each screen's own resize? Screen k's rows
    start at input row k * height, which the scale height / size maps to output row k * size exactly,
    so no output row mixes two screens; whether OpenCV's weights come out the same in floating point is
    checked on random screens (a difference would show)."""
    if n < 2:
        return False
    screens = np.random.default_rng(0).integers(0, 256, (n, height, width), dtype=np.uint8)
    each, together = np.empty((n, size, size), np.uint8), np.empty((n, size, size), np.uint8)
    resize_frames(screens, each, tall=False)
    resize_frames(screens, together, tall=True)
    return bool(np.array_equal(each, together))


class _Game:
    """One game of the group: its `Preprocessed` env (resets), emulator calls, and what
    `ParallelAdapter` keeps per episode."""

    def __init__(self, env: atari2p.Preprocessed, seed: int | np.random.SeedSequence, seats: int):
        self.env, self.raw = env, env.raw
        self.calls = ALECalls(env.raw.ale, len(env.possible_agents))
        self.mapping = [int(a) for a in env.raw.action_mapping]
        self.seeds = EpisodeSeeds(seed)
        self.episode = 0
        self.agents: list[int] = []  # the players in the game now, in `possible_agents` order
        self.returns = [0.0] * seats
        self.length = 0
        self.pending: list[Settlement] = []
        self.episodes: list[EpisodeResult] = []
        self.screens: tuple[int, int] = (0, 0)  # addresses of the game's two pooled screens


class Atari2pGroup:
    """N games of `atari2p:<game>`, seen as N slots (`self.slots`), stepped together once every slot acted.

    Args:
      game: the game's name as in `atari2p:<game>` (`boxing`).
      seeds: one per slot, an int or a numpy SeedSequence: episode k of slot i is reset with
        `EpisodeSeeds(seeds[i])(k)`, as `make_env` would reset it.
      kwargs: the config's env.kwargs (`envs.atari2p.settings`).
      agent_seats: the seat of each player (`EnvSpec.agent_seats`), for the episodes' returns.
      name: the env's registry name, for error messages.
    """

    def __init__(self, game: str, seeds: Sequence[int | np.random.SeedSequence],
                 kwargs: Mapping[str, Any] | None = None, agent_seats: Sequence[int] | None = None,
                 name: str | None = None):
        kwargs = dict(kwargs or {})
        self.name = name or f"atari2p:{game}"
        if not seeds:
            raise ValueError(f"env '{self.name}': a group needs at least one slot (one seed per slot)")
        s = atari2p.settings(game, kwargs)
        envs = [atari2p.make_atari2p(game, kwargs) for _ in seeds]
        self.agents = tuple(envs[0].possible_agents)
        p = len(self.agents)
        self.agent_seats = tuple(agent_seats) if agent_seats is not None else tuple(range(p))
        if len(self.agent_seats) != p:
            raise ValueError(f"env '{self.name}': {len(self.agent_seats)} seats given for {p} players")
        self.num_envs, self.players = len(seeds), p
        self.frame_stack, self.frame_skip = s["frame_stack"], s["frame_skip"]
        self.num_actions = int(envs[0].action_space(self.agents[0]).n)
        self.obs_shape = tuple(envs[0].observation_space(self.agents[0]).shape)
        self.max_cycles = s["max_cycles"]
        self.games = [_Game(env, seed, max(self.agent_seats) + 1) for env, seed in zip(envs, seeds)]
        height, width = envs[0].raw.ale.getScreenDims()[::-1]
        self._screens = np.zeros((2, self.num_envs, height, width), np.uint8)  # the two pooled screens per game
        self._frames = np.zeros((self.num_envs, s["screen_size"], s["screen_size"]), np.uint8)
        self._tall = tall_resize_exact(self.num_envs, height, width, s["screen_size"])
        for i, g in enumerate(self.games):
            g.screens = (self._screens[0, i].ctypes.data, self._screens[1, i].ctypes.data)
        self._obs = np.zeros((self.num_envs * p, *self.obs_shape), np.uint8)  # row i * p + k: game i, player k
        if s["agent_indicator"]:
            for k, agent in enumerate(self.agents):
                self._obs[k::p, self.frame_stack:] = atari2p.indicator_planes(list(self.agents), agent,
                                                                              s["screen_size"])
        self._mirrored = [k for k, agent in enumerate(self.agents) if agent in s["mirrored_players"]]
        self._moves: list[list[int] | None] = [None] * self.num_envs  # ALE actions of each game's slot, once acted
        self._all_legal = np.ones(self.num_actions, np.uint8)
        self.steps = 0  # group steps taken (each steps every game once)
        for i in range(self.num_envs):
            self._reset(i, self._obs)
        self.slots = [GroupSlot(self, i) for i in range(self.num_envs)]

    def advance(self, i: int) -> Step:
        """Slot i's step: its players in the game, their observations (views of this step's frames),
        the settlements and finished games since its last `advance`."""
        if self._moves[i] is not None:
            raise RuntimeError(f"env '{self.name}': slot {i} was advanced after acting but before the other "
                               f"{sum(m is None for m in self._moves)} slot(s) of its group acted; act on every "
                               f"slot of the group first, then advance them")
        g, p = self.games[i], self.players
        step = Step(list(g.agents), [self._obs[i * p + k] for k in g.agents], [self._all_legal] * len(g.agents),
                    g.pending, g.episodes)
        g.pending, g.episodes = [], []
        return step

    def act(self, i: int, actions: Sequence[int]) -> None:
        """Record slot i's actions (one per player in the game, in order); the last slot to act steps
        every game."""
        g = self.games[i]
        if len(actions) != len(g.agents):
            raise ValueError(f"env '{self.name}': slot {i} takes {len(g.agents)} action(s) now, got {len(actions)}")
        if self._moves[i] is not None:
            raise RuntimeError(f"env '{self.name}': slot {i} acted twice before the other slots of its group acted")
        moves = [g.mapping[0]] * self.players  # a player out of the game plays action 0, as in PettingZoo
        for k, action in zip(g.agents, actions):
            if not 0 <= action < self.num_actions:
                raise ValueError(f"env '{self.name}': action {action} is outside 0..{self.num_actions - 1}")
            moves[k] = g.mapping[action]
        self._moves[i] = moves
        if all(m is not None for m in self._moves):
            self._step()

    def _step(self) -> None:
        """Every game's `frame_skip` frames, then the new frame stacks, settlements and resets."""
        old, stack = self._obs, self.frame_stack
        obs = np.empty_like(old)
        obs[:, :stack - 1] = old[:, 1:stack]
        obs[:, stack:] = old[:, stack:]  # the players' planes
        outcomes = [self._play(i, moves) for i, moves in enumerate(self._moves)]
        self._moves = [None] * self.num_envs
        if self.frame_skip > 1:
            np.maximum(self._screens[0], self._screens[1], out=self._screens[0])
        resize_frames(self._screens[0], self._frames, self._tall)
        by_game = obs.reshape(self.num_envs, self.players, *self.obs_shape)
        by_game[:, :, stack - 1] = self._frames[:, None]
        for k in self._mirrored:  # env.kwargs.mirrored_players: the new frame flipped left to right
            by_game[:, k, stack - 1] = self._frames[:, :, ::-1]
        for i, (rewards, terminated, truncated) in enumerate(outcomes):
            self._settle(i, obs, rewards, terminated, truncated)
        self._obs = obs
        self.steps += 1

    def _play(self, i: int, moves: list[int]) -> tuple[list[int], list[bool], bool]:
        """`Preprocessed.step` of one game up to its frame: `frame_skip` frames of `moves`, PettingZoo's
        `step` per frame (its frame count, time limit and terminations), the last two screens read
        (the screen after the last frame played where the game ends within the skip). Returns the
        players' summed rewards, which of them are terminated, and whether the time limit cut the game."""
        g = self.games[i]
        calls, raw, skip = g.calls, g.raw, self.frame_skip
        calls.actions[:] = moves
        total = [0] * self.players
        terminated, truncated = [False] * self.players, False
        for t in range(skip):
            calls.act()
            rewards = calls.rewards
            for k in g.agents:
                total[k] += rewards[k]
            raw.frame += 1
            truncated = raw.frame >= self.max_cycles
            lost = list(g.agents) if calls.game_over() else calls.lost(g.agents)
            if lost or truncated:
                for k in lost:
                    terminated[k] = True
                raw.agents = [a for k, a in enumerate(raw.possible_agents) if k in g.agents and not terminated[k]]
                read_end_screens(raw.ale, [self._screens[0, i], self._screens[1, i]], t + 1, skip)
                break
            if t == skip - 2:
                calls.screen(g.screens[1])
            elif t == skip - 1:
                calls.screen(g.screens[0])
        return total, terminated, truncated

    def _settle(self, i: int, obs: np.ndarray, rewards: list[int], terminated: list[bool], truncated: bool) -> None:
        """`ParallelAdapter.act`'s bookkeeping for game i after a step: one settlement per player that
        acted, the episode's result and a reset when no player is left (the time limit ends it for all)."""
        g, p = self.games[i], self.players
        present = g.agents
        g.agents = [] if truncated else [k for k in present if not terminated[k]]
        g.length += 1
        for k in present:
            reward = float(rewards[k])
            g.returns[self.agent_seats[k]] += reward
            if terminated[k]:
                g.pending.append(Settlement(k, reward, True))
            elif truncated:
                g.pending.append(Settlement(k, reward, True, truncated=True, final_observation=obs[i * p + k].copy()))
            else:
                g.pending.append(Settlement(k, reward, False))
        if not g.agents:
            g.episodes.append(EpisodeResult(tuple(g.returns), g.length, leader(g.returns)))
            self._reset(i, obs)

    def _reset(self, i: int, obs: np.ndarray) -> None:
        """Game i's next episode (`Preprocessed.reset` with the slot's next seed), its first frame
        stack written into its players' rows of `obs`."""
        g, p = self.games[i], self.players
        first, _ = g.env.reset(seed=g.seeds(g.episode))
        g.episode += 1
        g.agents = [self.agents.index(a) for a in g.env.agents]
        g.returns = [0.0] * len(g.returns)
        g.length = 0
        for agent in g.env.agents:  # (each player's own: mirrored_players see the frames flipped)
            obs[i * p + self.agents.index(agent), :self.frame_stack] = first[agent][:self.frame_stack]

    def close(self) -> None:
        for g in self.games:
            g.env.close()
