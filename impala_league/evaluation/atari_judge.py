"""The cross-game judge: a policy of a two-player Atari game (`atari2p:<game>`) plays one seat of the
one-player game (`atari:<Game>`, gymnasium's `ALE/<Game>-v5`) against the game's built-in player.

PettingZoo's two-player Pong (`pong_v3`) and ALE/Pong-v5 run the same ROM: from the second emulator
frame on they draw with the same grayscale values (0, 87, 147, 148, 236), the two-player game's
`first_0` moves the right paddle, the one-player game's own (given the same actions, its pixels agree
frame by frame), and both use the minimal action set [0, 1, 3, 4, 11, 12] (NOOP, FIRE, RIGHT, LEFT,
RIGHTFIRE, LEFTFIRE). So a policy trained in self-play can be scored afterwards against an opponent it
never met in training: the built-in player, on the left, whose points count against it.

The judged game is gymnasium's own, nothing of ours between the emulator and the policy but the seat's
indicator planes: `gymnasium.make("ALE/<Game>-v5", frameskip=1, repeat_action_probability=P)` under
`AtariPreprocessing(noop_max=30, frame_skip=4, screen_size=84)` and `FrameStackObservation(4)`, P the
sticky actions of the evaluation protocol (evaluation/atari_protocol.py: 0.25 by default, 0 with
`deterministic`). The
observation the policy gets is exactly what `atari2p:<game>` gives that seat: uint8
[frame_stack + players, 84, 84], the 4 stacked frames then one plane per player, 255 on the seat's own
(`envs.atari2p.indicator_planes`; without `agent_indicator` the frames alone).

Only `first_0` has a place in the one-player game: ALE's player one. A policy that cannot read the
judged game (another frame size, stack or skip, another action set, another ROM), a seat the game lacks,
or a policy that is not of a two-player Atari game is refused with a `JudgeError` naming what was
expected (`run.py` prints it as one line and exits 2).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from impala_league.agents.policy import Policy
from impala_league.config import UserError
from impala_league.envs import atari, atari2p
from impala_league.evaluation.atari_protocol import DEFAULT, protocol_record, protocol_settings, returns_summary

ONE_PLAYER_SEAT = "first_0"  # ALE's player one: the player of every one-player game
# The judged frames: atari:'s defaults, with the frame skip every protocol shares.
FRAMES = {"frame_stack": atari.DEFAULTS["frame_stack"], "frame_skip": protocol_settings(DEFAULT)["frame_skip"],
          "screen_size": atari.DEFAULTS["screen_size"]}
SHAPED = tuple(FRAMES)  # settings a policy must have been trained with
MAX_EPISODE_FRAMES = protocol_settings(DEFAULT)["max_episode_frames"]


class JudgeError(UserError, ValueError):
    """A policy, game or seat the cross-game judge cannot play; the message names what was expected."""


@dataclass(frozen=True)
class SeatInGame:
    """A checked pairing: the policy of `trained_env`, playing `seat` of `env` (gymnasium id `env_id`).

    planes: uint8 [players, 84, 84], what `atari2p` adds after the frames for `seat` ([0, 84, 84] for a
      policy trained without `agent_indicator`).
    """

    trained_env: str
    env: str
    env_id: str
    seat: str
    planes: np.ndarray


def make_judged_game(env_id: str, max_episode_frames: int = MAX_EPISODE_FRAMES, protocol: str = DEFAULT) -> Any:
    """gymnasium's `env_id` (e.g. `ALE/Pong-v5`) under gymnasium's own `AtariPreprocessing` and
    `FrameStackObservation`, with `FRAMES` and the sticky actions and no-op starts of `protocol`
    (evaluation/atari_protocol.py): observations uint8 [4, 84, 84], the minimal action set, episodes cut at
    `max_episode_frames` emulator frames (truncated). Raises ProtocolError for an unknown protocol."""
    import gymnasium
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    settings = protocol_settings(protocol)
    atari.env_id(atari_game(env_id))  # registers the ALE ids
    # obs_type grayscale: AtariPreprocessing reads the screens from the emulator itself either way.
    env = gymnasium.make(env_id, frameskip=1, obs_type="grayscale", full_action_space=False,
                         repeat_action_probability=float(settings["sticky_actions"]),
                         max_num_frames_per_episode=max_episode_frames)
    env = AtariPreprocessing(env, noop_max=settings["noop_max"], frame_skip=FRAMES["frame_skip"],
                             screen_size=FRAMES["screen_size"], terminal_on_life_loss=False,
                             grayscale_obs=True, scale_obs=False)
    return FrameStackObservation(env, FRAMES["frame_stack"])


def atari_game(env_id: str) -> str:
    """'ALE/Pong-v5' -> 'Pong'."""
    return env_id[len("ALE/"):-len("-v5")]


def one_player_game(trained_env: str, kwargs: dict | None = None) -> str | None:
    """`atari:<Game>`, the one-player game of the ROM that `trained_env` (`atari2p:<game>` built with
    `kwargs`) runs, with the same action set; None where there is none (or `trained_env` is no
    `atari2p:` game)."""
    if not trained_env.startswith("atari2p:"):
        return None
    rom, actions = rom_and_actions(trained_env, kwargs)
    env_id = one_player_id(rom)
    return f"atari:{atari_game(env_id)}" if env_id and minimal_actions(env_id) == actions else None


def rom_and_actions(trained_env: str, kwargs: dict | None = None) -> tuple[str, list[int]]:
    """The ROM `atari2p:<game>` (built with `kwargs`) runs ('pong') and its players' actions as ALE
    action indices ([0, 1, 3, 4, 11, 12])."""
    env = atari2p.make_atari2p(trained_env.split(":", 1)[1], dict(kwargs or {}))
    try:
        return Path(env.raw.rom_path).stem, [int(a) for a in env.raw.action_mapping]
    finally:
        env.close()


def one_player_id(rom: str) -> str | None:
    """The gymnasium id of the one-player game of ROM `rom` ('pong' -> 'ALE/Pong-v5'); None if ALE has none."""
    import gymnasium

    try:
        env_id = atari.env_id("".join(part.capitalize() for part in rom.split("_")))
    except ValueError:
        return None
    return env_id if gymnasium.spec(env_id).kwargs.get("game") == rom else None


def minimal_actions(env_id: str) -> list[int]:
    """ALE's minimal action set of the one-player game `env_id`, as ALE action indices."""
    game = make_judged_game(env_id)
    try:
        return [int(a.value) for a in game.unwrapped.ale.getMinimalActionSet()]
    finally:
        game.close()


def seat_in_game(policy: Policy, env: str, seat: str, checkpoint: str = "the checkpoint") -> SeatInGame:
    """Check that `policy` (loaded from `checkpoint`, named in messages) can play `seat` of the one-player
    game `env` (`atari:<Game>`) and return the pairing.

    Raises JudgeError: a policy not of a two-player `atari2p:` game (a one-player policy has no seat), an
    env that is not `atari:<Game>` or runs another ROM, a seat the game lacks, or a policy that cannot
    read the judged game's frames (`SHAPED` settings, observation shape) or whose actions differ.
    """
    import gymnasium

    spec = policy.spec
    if not spec.name.startswith("atari2p:"):
        if len(spec.seats) == 1:
            raise JudgeError(f"{checkpoint} plays {spec.name}, a one-player game: it has no seat to play; --seat "
                             f"is for a policy of a two-player atari2p:<game> (run.py evaluate --checkpoint "
                             f"{checkpoint} plays its own game)")
        raise JudgeError(f"{checkpoint} plays {spec.name}; the judge plays a policy of a two-player Atari game "
                         f"(atari2p:<game>, e.g. atari2p:pong) in its one-player game (atari:<Game>)")
    kwargs = dict(policy.config.env.kwargs)
    rom, actions = rom_and_actions(spec.name, kwargs)
    own_id = one_player_id(rom)
    own = f"atari:{atari_game(own_id)}" if own_id else None
    if own is None:
        raise JudgeError(f"{spec.name} runs the ROM {rom}, of which ALE has no one-player game: the judge cannot "
                         f"play it")
    if not env.startswith("atari:"):
        raise JudgeError(f"--env {env}: the judged game is a one-player Atari game atari:<Game> ({spec.name}'s "
                         f"is {own})")
    try:
        env_id = atari.env_id(env.split(":", 1)[1])
    except ValueError as e:
        raise JudgeError(f"--env {env}: {e}") from None
    if gymnasium.spec(env_id).kwargs.get("game") != rom:
        raise JudgeError(f"--env {env} is another game than {checkpoint}'s {spec.name}: its one-player game is {own}")
    players = list(spec.agents)
    if seat not in players:
        raise JudgeError(f"{spec.name} has no player {seat!r}; its players: {', '.join(players)} "
                         f"(in {env} the player is {ONE_PLAYER_SEAT})")
    if seat != ONE_PLAYER_SEAT:
        raise JudgeError(f"{env} has one player, ALE's first, which is {spec.name}'s {ONE_PLAYER_SEAT}; "
                         f"{seat} is the built-in player's side there: use --seat {ONE_PLAYER_SEAT}")
    settings = atari2p.settings(spec.name.split(":", 1)[1], kwargs)
    if seat in settings["mirrored_players"]:
        raise JudgeError(f"{checkpoint} saw {seat}'s frames flipped left to right (env.kwargs.mirrored_players); "
                         f"{env} shows them as the emulator draws them")
    for key in SHAPED:
        if settings[key] != FRAMES[key]:
            raise JudgeError(f"{checkpoint} was trained with env.kwargs.{key}={settings[key]}; the judge plays "
                             f"{env} with {key}={FRAMES[key]} ({_protocol_text()})")
    judged_actions = minimal_actions(env_id)
    if actions != judged_actions:
        raise JudgeError(f"{checkpoint}'s actions are the ALE actions {actions} (env.kwargs.full_action_space="
                         f"{str(settings['full_action_space']).lower()}); {env} plays its minimal action set "
                         f"{judged_actions}")
    size = FRAMES["screen_size"]
    planes = atari2p.indicator_planes(players, seat, size) if settings["agent_indicator"] \
        else np.zeros((0, size, size), np.uint8)
    shape = (FRAMES["frame_stack"] + len(planes), size, size)
    if tuple(spec.obs_shape) != shape:
        raise JudgeError(f"{checkpoint} reads observations of shape {tuple(spec.obs_shape)}; {env} as {seat} gives "
                         f"{shape} ({FRAMES['frame_stack']} frames and {len(planes)} indicator planes)")
    return SeatInGame(spec.name, env, env_id, seat, planes)


def _protocol_text() -> str:
    return ", ".join(f"{key} {FRAMES[key]}" for key in SHAPED) + ", the minimal action set"


def judge(policy: Policy, env: str, seat: str, games: int, seed: int = 0, greedy: bool = True,
          max_episode_frames: int = MAX_EPISODE_FRAMES, checkpoint: str = "the checkpoint",
          protocol: str = DEFAULT) -> dict:
    """Play `games` games of the one-player `env` (`atari:<Game>`) with `policy` as `seat` against the
    game's built-in player (`seat_in_game` checks the pairing first), under the evaluation `protocol`
    (evaluation/atari_protocol.py: `sticky` by default).

    Game k is reset with seed `seed + k` (the ALE and the no-op start), so a rerun plays the same games.
    All games advance together, one forward pass a step (greedy: argmax, else a sample from the policy's
    generator); a recurrent policy keeps one core state per game, fed the game's rewards.
    max_episode_frames: the time limit in emulator frames (no-op starts included); a game cut there ends
      truncated with the score so far.

    Returns a JSON-ready dict: `env`, `env_id`, `trained_env`, `seat`, `games`, `seed`, `greedy`,
    `max_episode_frames`, `protocol` (`protocol_record`); `returns` (one per game: the policy's points minus
    the built-in player's), their `mean_return` with its 95% `interval` (half-width), `std_return`,
    `min_return`, `max_return` and `distinct_returns` (`returns_summary`); `wins`, `draws`, `losses` (the
    sign of each return); `truncated` (games cut by the time limit); `mean_length` (agent steps per game).

    Raises JudgeError as `seat_in_game` does, ProtocolError for an unknown protocol.
    """
    pairing = seat_in_game(policy, env, seat, checkpoint)
    envs = [make_judged_game(pairing.env_id, max_episode_frames, protocol) for _ in range(games)]
    observations = [game.reset(seed=seed + k)[0] for k, game in enumerate(envs)]
    returns, lengths, truncated = [0.0] * games, [0] * games, [False] * games
    active = list(range(games))
    policy.reset()
    num_actions = policy.spec.num_actions
    try:
        while active:
            batch = np.stack([np.concatenate([observations[k], pairing.planes]) for k in active])
            actions = policy.act_batch(batch, np.ones((len(active), num_actions), np.uint8), greedy, streams=active)
            still = []
            for k, action in zip(active, actions.tolist()):
                observations[k], reward, ended, cut, _ = envs[k].step(action)
                returns[k] += float(reward)
                lengths[k] += 1
                policy.settle(k, float(reward), ended or cut)
                if ended or cut:
                    truncated[k] = bool(cut and not ended)
                else:
                    still.append(k)
            active = still
    finally:
        for game in envs:
            game.close()
    scores = np.array(returns)
    return {"env": pairing.env, "env_id": pairing.env_id, "trained_env": pairing.trained_env, "seat": seat,
            "games": games, "seed": seed, "greedy": greedy, "max_episode_frames": max_episode_frames,
            "protocol": {**protocol_record(protocol, games), "max_episode_frames": max_episode_frames}, "returns": returns, **returns_summary(returns),
            "wins": int((scores > 0).sum()), "draws": int((scores == 0).sum()), "losses": int((scores < 0).sum()),
            "truncated": int(sum(truncated)), "mean_length": float(np.mean(lengths))}


def judge_line(result: dict) -> str:
    """'atari:Pong (ALE/Pong-v5) as first_0 of atari2p:pong against the built-in player, 30 games, sticky
    protocol, greedy: mean return +12.3 ± 0.8 (std 2.1, min +9, max +16, 11 distinct); won 30, drew 0,
    lost 0' for `judge`'s result (one written before protocols were recorded: no protocol, interval or
    distinct count)."""
    cut = f", {result['truncated']} cut at the time limit" if result["truncated"] else ""
    games = f"{result['games']} game{'s' if result['games'] != 1 else ''}"
    protocol = f", {result['protocol']['name']} protocol" if result.get("protocol") else ""
    half = f" ± {result['interval']:.1f}" if result.get("interval") is not None else ""
    distinct = f", {result['distinct_returns']} distinct" if "distinct_returns" in result else ""
    return (f"{result['env']} ({result['env_id']}) as {result['seat']} of {result['trained_env']} against the built-in "
            f"player, {games}{protocol}, {'greedy' if result['greedy'] else 'sampled'}: mean return "
            f"{result['mean_return']:+.1f}{half} (std {result['std_return']:.1f}, min {result['min_return']:+.0f}, "
            f"max {result['max_return']:+.0f}{distinct}); won {result['wins']}, drew {result['draws']}, "
            f"lost {result['losses']}{cut}")
