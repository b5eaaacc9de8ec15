"""Env registry: every game is reached by name, with its specs written down or read from its spaces.

Names:
* `connect_four`, `tictactoe`: PettingZoo classic board games (turn-based, two seats).
* `battle`: MAgent2's `battle_v4`, two teams (`red`, `blue`) of many units acting at once.
* `mpe:<scenario>`: an MPE2 scenario, e.g. `mpe:simple_tag` (adversaries vs agents).
* `cue_recall`: a built-in memory task (envs/memory.py, one agent): name, after a delay, the cue seen
  at the episode's first step; kwargs `num_cues`, `delay_min`, `delay_max`.
* `gym:<id>`: any registered gymnasium env, e.g. `gym:CartPole-v1` (one agent). POPGym's ids
  (`gym:popgym-RepeatPreviousEasy-v0`) import the `popgym` package when first named.
* `popgym:<Env>`: a POPGym memory task (Morad et al. 2023), e.g. `popgym:RepeatPreviousEasy`,
  `popgym:PositionOnlyCartPoleEasy`: the gymnasium env `popgym-<Env>-v0` (one agent). Its rewards are
  POPGym's, scaled so that an episode's return lies in [-1, 1].
* `pettingzoo:<module>`: any PettingZoo env module by import path, e.g.
  `pettingzoo:pettingzoo.classic.go_v5`; its `parallel_env` is used where it has one, else its `env`.
* `atari:<Game>`: an Atari 2600 game of the Arcade Learning Environment, e.g. `atari:Pong`, preprocessed
  as the published IMPALA/DQN curves were (envs/atari.py: frame skip 4, 84x84 grayscale, a stack of 4);
  its kwargs are `envs.atari.DEFAULTS`. With `emulator: ale_vector` an actor's games run in one ale-py
  vector env (envs/atari_vector.py, built by `make_envs`).
* `atari2p:<game>`: a multi-player Atari game of PettingZoo, e.g. `atari2p:boxing`, `atari2p:pong` (the newest
  `pettingzoo.atari.<game>_vN`), every player preprocessed as `atari:` is (envs/atari2p.py), plus one plane
  per player saying which one it is; players `first_0`, `second_0`, each its own seat; its kwargs are
  `envs.atari2p.DEFAULTS` and the game's own options.
* `sc2:<map>`: StarCraft II through pysc2 (envs/sc2_wrappers/), e.g. `sc2:MoveToBeacon`, `sc2:Simple64`;
  its kwargs are `envs.sc2_wrappers.env.SC2Settings`.

`kwargs` (the config's `env.kwargs`) are passed to the env's constructor (e.g. `map_size` for battle).
`FAMILIES` is the table of these names and prefixes, each with the function that builds its envs.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import json
import logging
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Optional, Sequence

import numpy as np

from impala_league.envs import atari, atari2p
from impala_league.envs.aec import AECAdapter
from impala_league.envs.atari2p_vector import Atari2pGroup
from impala_league.envs.atari_vector import AtariVectorGroup
from impala_league.envs.base import EMPTY_MASK_RULES, EnvSpec
from impala_league.envs.memory import CUE_RECALL_VERSION, CueRecall
from impala_league.envs.parallel import ParallelAdapter, single_agent_adapter
from impala_league.envs.spaces import ObsEncoder, UnsupportedSpace, num_actions, observation_encoder

log = logging.getLogger("envs")


@dataclass(frozen=True)
class _Game:
    """How to build one game: its spec, the per-agent observation encoders and the env factory."""

    spec: EnvSpec
    encoders: tuple[Callable[[Any], tuple[np.ndarray, Optional[np.ndarray]]], ...]
    make: Callable[..., object]  # make(render_mode=None) -> the PettingZoo / gymnasium env
    outcome: str = "return"
    units_left: Optional[Callable[[Any], tuple[int, ...]]] = None  # see envs/parallel.py


def _magent_units_left(env: Any) -> tuple[int, ...]:
    """Living units per team of a MAgent2 env, from the game itself (its handles are in seat order)."""
    raw = env.unwrapped
    return tuple(int(raw.env.get_num(handle)) for handle in raw.handles)


# Tic-tac-toe's action a marks observation cell (a // 3, a % 3); reflecting columns maps c -> 2 - c.
_TICTACTOE_MIRROR = tuple(3 * (a // 3) + 2 - a % 3 for a in range(9))
_BOARD_GAMES = {
    "connect_four": ("pettingzoo.classic.connect_four_v3", dict(mirror_axis=1, mirror_actions=tuple(range(6, -1, -1)))),
    "tictactoe": ("pettingzoo.classic.tictactoe_v3", dict(mirror_axis=1, mirror_actions=_TICTACTOE_MIRROR)),
}


def _import(module: str, name: str):
    try:
        return importlib.import_module(module)
    except ImportError as e:
        raise ValueError(f"env '{name}': cannot import '{module}' ({e}); is its package installed?") from None


def _mpe_module(name: str, scenario: str) -> str:
    """The newest `mpe2.<scenario>_vN` module."""
    import pkgutil

    import mpe2

    found = sorted((int(m.name.rsplit("_v", 1)[1]), m.name) for m in pkgutil.iter_modules(mpe2.__path__)
                   if re.fullmatch(rf"{re.escape(scenario)}_v\d+", m.name))
    if not found:
        scenarios = sorted(m.name.rsplit("_v", 1)[0] for m in pkgutil.iter_modules(mpe2.__path__)
                           if re.fullmatch(r"\w+_v\d+", m.name))
        raise ValueError(f"unknown MPE scenario '{scenario}' in env '{name}'; valid: {', '.join(scenarios)}")
    return f"mpe2.{found[-1][1]}"


def _popgym_id(name: str, env: str) -> str:
    """The gymnasium id `popgym-<env>-v0` of a POPGym env (importing `popgym` registers them), or a
    ValueError naming the closest POPGym env."""
    _import("popgym", name)
    import gymnasium

    env_id = f"popgym-{env}-v0"
    if env_id in gymnasium.registry:
        return env_id
    envs = sorted(i[len("popgym-"):-len("-v0")] for i in gymnasium.registry if re.fullmatch(r"popgym-.+-v0", i))
    lowered = {e.lower(): e for e in envs}
    close = difflib.get_close_matches(env.lower(), list(lowered), n=1, cutoff=0.5)
    hint = f"did you mean 'popgym:{lowered[close[0]]}'?" if close else f"valid: {', '.join(envs)}"
    raise ValueError(f"unknown POPGym env '{env}' in env '{name}'; {hint}")


def _team(agent: str) -> str:
    """PettingZoo names units `<team>_<n>` (red_3, adversary_0): the team is the part before the last `_`.
    `player_<n>` is PettingZoo's name for separate players (its classic games, `rps_v2`): its own team."""
    if re.fullmatch(r".+_\d+", agent) and not re.fullmatch(r"player_\d+", agent):
        return agent.rsplit("_", 1)[0]
    return agent


def _infer_seats(agents: tuple[str, ...], name: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Seats of a simultaneous-move env from its agents' names (see `_team`), warning where the names
    cannot tell: several agents of one team and no other team may be allies or opponents."""
    teams = list(dict.fromkeys(_team(a) for a in agents))
    if len(teams) == 1 and len(agents) > 1:
        log.warning("env '%s': agents %s are taken as one team '%s' (one seat: they share every outcome). If they "
                    "play against each other, declare the seats, e.g. env.seats: %s", name, ", ".join(agents),
                    teams[0], [[a] for a in agents])
    return tuple(teams), tuple(teams.index(_team(a)) for a in agents)


def _declared_seats(agents: tuple[str, ...], declared: tuple[tuple[str, ...], ...],
                    name: str) -> tuple[tuple[str, ...], tuple[int, ...]]:
    """Seats from the config's `env.seats` (a list of seats, each a list of agent names), checked:
    every agent in exactly one seat. A seat is named by its one agent, else its agents' common team,
    else `seat_<k>`."""
    listed = [a for seat in declared for a in seat]
    unknown = sorted(set(listed) - set(agents))
    missing = [a for a in agents if a not in listed]
    twice = sorted({a for a in listed if listed.count(a) > 1})
    if unknown or missing or twice or not all(declared):
        problems = [f"unknown agents {unknown}" if unknown else "", f"agents in no seat {missing}" if missing else "",
                    f"agents in several seats {twice}" if twice else "", "an empty seat" if not all(declared) else ""]
        raise ValueError(f"env '{name}': env.seats {[list(seat) for seat in declared]} must put each of its agents "
                         f"{list(agents)} in exactly one seat ({'; '.join(p for p in problems if p)})")
    names = []
    for k, seat in enumerate(declared):
        teams = {_team(a) for a in seat}
        names.append(seat[0] if len(seat) == 1 else teams.pop() if len(teams) == 1 else f"seat_{k}")
    if len(set(names)) < len(names):
        names = [f"seat_{k}" for k in range(len(declared))]
    seat_of = {a: k for k, seat in enumerate(declared) for a in seat}
    return tuple(names), tuple(seat_of[a] for a in agents)


def _encoders(obs_space: Callable[[str], Any], agents: tuple[str, ...], agent_seats: tuple[int, ...], name: str):
    """Per-agent observation encoders, padded to one shape where agents see different vectors.

    Agents of different roles (MPE's adversaries and good agents) can have observation vectors of
    different lengths; they share one network (parameter sharing) by padding each vector with
    zeros to the longest and appending a one-hot of the agent's seat, so the network knows the role.
    Returns (shape, dtype, image, encoders): `image` as in `ObsEncoder`, False for padded vectors.
    """
    encoders: list[ObsEncoder] = [observation_encoder(obs_space(a), f"env '{name}', agent '{a}'")
                                  for a in agents]
    shapes = {e.shape for e in encoders}
    if len(shapes) == 1 and len({(e.dtype, e.image) for e in encoders}) == 1:
        return encoders[0].shape, encoders[0].dtype, encoders[0].image, tuple(e.encode for e in encoders)
    if any(len(s) != 1 for s in shapes):
        raise UnsupportedSpace(f"env '{name}': agents have observations of different shapes {sorted(shapes)}; "
                               f"only 1-D observations of different lengths can be padded to one shape")
    width, seats = max(s[0] for s in shapes), max(agent_seats) + 1

    def padded(encode, seat):
        def pad(raw):
            obs, mask = encode(raw)
            out = np.zeros(width + seats, np.float32)
            out[:obs.shape[0]] = obs
            out[width + seat] = 1.0
            return out, mask
        return pad
    return (width + seats,), np.dtype(np.float32), False, tuple(padded(e.encode, s) for e, s in zip(encoders, agent_seats))


def _probe(name: str, kind: str, make: Callable[..., object], version: str, outcome: str = "return",
           units_left: Optional[Callable[[Any], tuple[int, ...]]] = None,
           declared: Optional[tuple[tuple[str, ...], ...]] = None, **spec_extra: Any) -> _Game:
    """Build the env once and read its agents and spaces into a spec (`declared`: the config's env.seats)."""
    if declared is not None and kind != "parallel":
        where = "a turn-based game each agent is its own seat" if kind == "aec" else "a one-agent env there is one seat"
        raise ValueError(f"env '{name}': env.seats is for simultaneous-move (Parallel) envs; in {where}")
    env = make()
    try:
        if kind == "gym":
            agents: tuple[str, ...] = ("agent",)
            seats = agents
            agent_seats: tuple[int, ...] = (0,)
            obs_space = lambda _agent: env.observation_space  # noqa: E731
            actions = {num_actions(env.action_space, f"env '{name}'")}
        else:
            agents = tuple(env.possible_agents)
            if kind == "aec":  # turn-based: each agent is its own side
                seats, agent_seats = agents, tuple(range(len(agents)))
            elif declared is not None:
                seats, agent_seats = _declared_seats(agents, declared, name)
            else:  # simultaneous: units named <team>_<n> share their team's seat
                seats, agent_seats = _infer_seats(agents, name)
            obs_space = env.observation_space
            actions = {num_actions(env.action_space(a), f"env '{name}', agent '{a}'") for a in agents}
        if len(actions) != 1:
            raise UnsupportedSpace(f"env '{name}': agents have Discrete action spaces of different sizes "
                                   f"{sorted(actions)}; one shared policy needs one size")
        obs_shape, obs_dtype, obs_image, encoders = _encoders(obs_space, agents, agent_seats, name)
    finally:
        env.close()
    spec = EnvSpec(name, obs_shape, obs_dtype, actions.pop(), seats, version=version, agents=agents,
                   agent_seats=agent_seats, kind=kind, obs_image=obs_image, **spec_extra)
    return _Game(spec, encoders, make, outcome, units_left)


def _module_factory(module: Any, fn: str, kwargs: Mapping[str, Any]) -> Callable[..., object]:
    def make(render_mode: Optional[str] = None):
        extra = {} if render_mode is None else {"render_mode": render_mode}
        return getattr(module, fn)(**kwargs, **extra)
    return make


def _board_game(name: str, _rest: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    module_name, mirror = _BOARD_GAMES[name]
    module = _import(module_name, name)
    # raw_env skips PettingZoo's checking wrappers (half the step time); AECAdapter.act refuses
    # illegal moves itself.
    return _probe(name, "aec", _module_factory(module, "raw_env", kwargs), module_name.rsplit(".", 1)[1],
                  declared=declared, **mirror)


def _battle(name: str, _rest: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    module = _import("magent2.environments.battle_v4", name)
    return _probe(name, "parallel", _module_factory(module, "parallel_env", kwargs), "battle_v4", declared=declared,
                  outcome="units_left", units_left=_magent_units_left)


def _cue_recall(name: str, _rest: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    def make_cue_recall(render_mode: Optional[str] = None):
        return CueRecall(**kwargs, render_mode=render_mode)
    return _probe(name, "gym", make_cue_recall, CUE_RECALL_VERSION, declared=declared)


def _mpe(name: str, scenario: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    module_name = _mpe_module(name, scenario)
    module = _import(module_name, name)
    return _probe(name, "parallel", _module_factory(module, "parallel_env", kwargs), module_name.rsplit(".", 1)[1],
                  declared=declared)


def _pettingzoo(name: str, module_name: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    module = _import(module_name, name)
    fn = "parallel_env" if hasattr(module, "parallel_env") else "env"
    if not hasattr(module, fn):
        raise ValueError(f"env '{name}': module '{module_name}' has neither parallel_env() nor env()")
    return _probe(name, "parallel" if fn == "parallel_env" else "aec", _module_factory(module, fn, kwargs),
                  module_name.rsplit(".", 1)[-1], declared=declared)


def _gym(name: str, env_id: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    import gymnasium

    if env_id.startswith("popgym-") and env_id not in gymnasium.registry:
        _import("popgym", name)  # registers the popgym-* ids
    return _gymnasium(name, env_id, kwargs, declared)


def _popgym(name: str, env: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    return _gymnasium(name, _popgym_id(name, env), kwargs, declared)


def _gymnasium(name: str, env_id: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    """The registered gymnasium env `env_id` (of `gym:` and `popgym:`), made with `kwargs`."""
    import gymnasium

    if env_id not in gymnasium.registry:
        close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=1)
        hint = f"; did you mean 'gym:{close[0]}'?" if close else ""
        raise ValueError(f"unknown gymnasium env id '{env_id}'{hint}")

    def make(render_mode: Optional[str] = None):
        # render_mode only when asked for: POPGym's constructors take no render_mode argument
        extra = {} if render_mode is None else {"render_mode": render_mode}
        return gymnasium.make(env_id, **kwargs, **extra)
    return _probe(name, "gym", make, env_id, declared=declared)


def _atari(name: str, game: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    full_id, frame_skip = atari.env_id(game), atari.settings(kwargs)["frame_skip"]

    def make_atari(render_mode: Optional[str] = None):
        return atari.make_atari(game, kwargs, render_mode)
    return _probe(name, "gym", make_atari, full_id, declared=declared, frames_per_step=frame_skip)


def _atari2p(name: str, game: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    module_name, frame_skip = atari2p.module_name(game), atari2p.settings(game, kwargs)["frame_skip"]

    def make_atari2p(render_mode: Optional[str] = None):
        return atari2p.make_atari2p(game, kwargs, render_mode)
    return _probe(name, "parallel", make_atari2p, module_name, declared=declared, frames_per_step=frame_skip)


def _sc2(name: str, _map: str, kwargs: dict, declared: Optional[tuple]) -> _Game:
    from impala_league.envs.sc2_wrappers.env import sc2_spec

    if declared is not None:
        raise ValueError(f"env '{name}': env.seats does not apply to StarCraft II (each player is its own seat)")
    return _Game(sc2_spec(name, kwargs), (), lambda render_mode=None: None)


# Every env family: a name, or a prefix ending in ':', -> the function that builds its game from (the
# full name, the name after the prefix, env.kwargs, the declared seats or None). A new family is one line.
FAMILIES: dict[str, Callable[[str, str, dict, Optional[tuple]], _Game]] = {
    "connect_four": _board_game,
    "tictactoe": _board_game,
    "battle": _battle,
    "cue_recall": _cue_recall,
    "atari:": _atari,
    "atari2p:": _atari2p,
    "gym:": _gym,
    "mpe:": _mpe,
    "pettingzoo:": _pettingzoo,
    "popgym:": _popgym,
    "sc2:": _sc2,
}
ENV_NAMES: tuple[str, ...] = tuple(key for key in FAMILIES if not key.endswith(":"))
PREFIXES: tuple[str, ...] = tuple(key for key in FAMILIES if key.endswith(":"))


@functools.lru_cache(maxsize=64)
def _game(name: str, kwargs_json: str, seats_json: str = "null") -> _Game:
    """The game `name` names, by its family in FAMILIES (its exact name, else the prefix up to its first ':')."""
    seats = json.loads(seats_json)
    declared = None if seats is None else tuple(tuple(seat) for seat in seats)
    family = name if name in FAMILIES else name.split(":", 1)[0] + ":"
    if family not in FAMILIES:
        close = difflib.get_close_matches(name, ENV_NAMES, n=1)
        hint = f"; did you mean '{close[0]}'?" if close else ""
        raise ValueError(f"unknown env '{name}'{hint}; valid: {', '.join(ENV_NAMES)}, or a name starting with "
                         f"{', '.join(PREFIXES)}")
    return FAMILIES[family](name, name.removeprefix(family), json.loads(kwargs_json), declared)


def _lookup(name: str, kwargs: Optional[Mapping[str, Any]], seats: Optional[Sequence[Sequence[str]]] = None) -> _Game:
    try:
        key = json.dumps(dict(kwargs or {}), sort_keys=True)
    except TypeError as e:
        raise ValueError(f"env '{name}': env.kwargs must be plain values (numbers, strings, lists): {e}") from None
    seats_key = json.dumps(None if seats is None else [[str(a) for a in seat] for seat in seats])
    try:
        return _game(name, key, seats_key)
    except TypeError as e:  # a keyword the env's constructor does not take
        raise ValueError(f"env '{name}' does not accept env.kwargs {dict(kwargs or {})}: {e}") from None
    except AssertionError as e:  # MAgent2 checks its arguments with assert (e.g. a battle map under 12)
        raise ValueError(f"env '{name}' refuses env.kwargs {dict(kwargs or {})}: {e or 'a failed assertion'}") from None


def env_spec(name: str, kwargs: Optional[Mapping[str, Any]] = None,
             seats: Optional[Sequence[Sequence[str]]] = None) -> EnvSpec:
    """The spec of env `name` built with `kwargs`.

    seats: the config's `env.seats` for a simultaneous-move env: a list of seats, each a list of agent
      names (`[[player_0], [player_1]]`); None = inferred from the agents' names (`_team`), with a
      warning where the names cannot tell allies from opponents.

    Raises:
      ValueError: unknown name (naming the valid ones), a module that does not import, kwargs the
        env does not take, or seats that do not put each agent in exactly one seat.
      UnsupportedSpace (a ValueError): an observation or action space this stack cannot train on.
    """
    return _lookup(name, kwargs, seats).spec


def make_env(name: str, seed: int | np.random.SeedSequence, kwargs: Optional[Mapping[str, Any]] = None,
             render_mode: Optional[str] = None, seats: Optional[Sequence[Sequence[str]]] = None,
             empty_mask: str = "error"):
    """A fresh adapter around env `name` (AECAdapter or ParallelAdapter; see envs/base.py for what
    `advance` and `act` do). seed: an int (episode k is seeded `seed + k`) or a numpy SeedSequence
    (episode k gets a seed drawn from its child k; see `envs.base.EpisodeSeeds`).
    render_mode: as in `make_raw_env`. seats: as in `env_spec`. empty_mask: "error" or "skip", what an
    acting agent with an all-zero action mask means (see envs/base.py); "skip" only for simultaneous
    games (a turn-based game's turn cannot be skipped). An `atari:<Game>` is always the gymnasium env
    here, whatever its `emulator` (evaluation and replays play one game at a time); an actor's vector
    env comes from `make_envs`.

    Raises ValueError for `empty_mask="skip"` on a turn-based game."""
    game = _lookup(name, kwargs, seats)
    spec = game.spec
    make = functools.partial(game.make, render_mode)
    if empty_mask != "error" and spec.kind in ("aec", "sc2"):
        raise ValueError(f"env '{name}' is {'turn-based' if spec.kind == 'aec' else 'StarCraft II'}: "
                         f"env.empty_mask={empty_mask} is for simultaneous PettingZoo and gymnasium envs")
    if spec.kind == "aec":
        return AECAdapter(make, seed, game.encoders, spec.num_actions, name=name)
    if spec.kind == "sc2":
        from impala_league.envs.sc2_wrappers.env import SC2Adapter, sc2_game

        if isinstance(seed, np.random.SeedSequence):  # pysc2 seeds a game once, with 32 bits
            seed = int(seed.generate_state(1)[0])
        return SC2Adapter(sc2_game(name, kwargs), seed)
    if spec.kind == "gym":
        return single_agent_adapter(make, seed, game.encoders[0], spec.num_actions, name, empty_mask)
    return ParallelAdapter(make, seed, game.encoders, spec.agent_seats, spec.num_actions, game.outcome,
                           game.units_left, name=name, empty_mask=empty_mask)


def make_envs(name: str, seeds: Sequence[int | np.random.SeedSequence], kwargs: Optional[Mapping[str, Any]] = None,
              seats: Optional[Sequence[Sequence[str]]] = None, empty_mask: str = "error") -> list:
    """An actor's envs: one adapter per seed (each seed as in `make_env`).

    Normally `make_env` once per seed: independent adapters. For `atari:<Game>` with
    `env.kwargs.emulator=ale_vector`, the slots of one `AtariVectorGroup` (envs/atari_vector.py): one
    ale-py vector env steps all the games once every slot has acted, so a caller acts on every env
    before advancing any (for independent adapters that order changes nothing). Its games are seeded
    once from the seeds (see envs/atari_vector.py). For `atari2p:<game>`, the slots of one `Atari2pGroup`
    (envs/atari2p_vector.py), which steps every game as `make_env`'s adapter would, with the same
    seeds, once every slot has acted. seats, empty_mask: as in `make_env`.
    """
    kwargs = dict(kwargs or {})
    if name.startswith("atari2p:"):
        spec = env_spec(name, kwargs, seats)  # the game, its kwargs and env.seats checked as for one env
        if empty_mask not in EMPTY_MASK_RULES:
            raise ValueError(f"empty_mask must be one of {EMPTY_MASK_RULES}, got {empty_mask!r}")
        return list(Atari2pGroup(name[len("atari2p:"):], list(seeds), kwargs, spec.agent_seats, name).slots)
    if name.startswith("atari:") and atari.settings(kwargs)["emulator"] == "ale_vector":
        spec = env_spec(name, kwargs, seats)  # the game and env.seats checked as for one env
        if empty_mask not in EMPTY_MASK_RULES:
            raise ValueError(f"empty_mask must be one of {EMPTY_MASK_RULES}, got {empty_mask!r}")
        group = AtariVectorGroup(name[len("atari:"):], list(seeds), kwargs, name)
        if (group.obs_shape, group.num_actions) != (spec.obs_shape, spec.num_actions):
            raise ValueError(f"env '{name}': ale-py's vector env gives observations {group.obs_shape} and "
                             f"{group.num_actions} actions where the gymnasium env gives {spec.obs_shape} and "
                             f"{spec.num_actions}")
        return list(group.slots)
    return [make_env(name, seed, kwargs, seats=seats, empty_mask=empty_mask) for seed in seeds]


def make_raw_env(name: str, render_mode: Optional[str] = None, kwargs: Optional[Mapping[str, Any]] = None):
    """The PettingZoo (or gymnasium) env itself, for evaluation and replays that drive it directly.

    render_mode: None, or a mode the env supports (`"rgb_array"`: `env.render()` returns uint8
    `[H, W, 3]` frames; PettingZoo's classic games draw them with pygame, without a display).
    """
    return _lookup(name, kwargs).make(render_mode)
