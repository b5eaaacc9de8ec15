"""Round-robin tournaments between players: baseline bots, checkpoints and whole run directories.

A *player spec* (``run.py evaluate --players SPEC ...``) is one of:

* a bot: ``random``, ``tactical``, ``minimax:D`` or the judge ``mcts:N`` (see ``evaluation/bots.py``,
  ``evaluation/judges.py``; a bot name is never read as a path: write ``./random`` for a directory
  called ``random``);
* a ``.safetensors`` checkpoint file (a learner checkpoint or a league snapshot: same format);
* a run directory, which stands for its learners' latest checkpoints
  (``RUN/checkpoints/latest.safetensors``, and ``RUN/checkpoints/<learner>/latest.safetensors`` of
  other learners) and every league snapshot ``RUN/league/snapshots/*.safetensors``.

Display names: bots by their spec; a learner checkpoint as ``<run>/<player>`` (``<player>`` is the
checkpoint's ``meta.player``, else ``main``; for ``checkpoints/<learner>/latest.safetensors`` it is
``<learner>``); a snapshot by its ``meta.id``; any other file by its stem. A name met twice gets
``#2``, ``#3``, ... appended.

Every pair plays ``games`` games with each player in each seat. Pairs run in this process, or with
``workers > 1`` in that many subprocesses of this module at once: each gets its pair as plain strings
on its command line (as ``--opt=VALUE``, so names and paths starting with ``-`` pass) and prints its
result as one JSON object (nothing is pickled). Seeds depend only on the pair's position in the
round-robin, so the results do not depend on ``workers``.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor, as_completed
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

import numpy as np

from impala_league import REPO
from impala_league.config import UserError
from impala_league.evaluation.bots import BOT_SPECS, did_you_mean, is_bot_spec, make_bot
from impala_league.evaluation.elo import fit_elo
from impala_league.evaluation.evaluate import count_outcomes, play_games
from impala_league.text import plural

MATCH_SEED_STRIDE = 1_000_003
"""Seed distance between consecutive matches (one player in seat 0); more than any match's games."""
PRIOR_DRAWS = 1.0
"""Virtual draws per pair in the Elo fit (see ``evaluation/elo.py``): keeps undefeated players finite."""


class TournamentError(UserError, ValueError):
    """A tournament that cannot be played as asked (e.g. a worker process failed); says which pair."""


class PlayerError(UserError, ValueError):
    """A player spec that does not resolve to usable players; the message names the spec."""


@dataclass(frozen=True)
class Player:
    """One entrant.

    name: display name (unique in a tournament); kind: ``"bot"`` or ``"checkpoint"``;
    load: the bot spec, or the checkpoint's absolute path; source: the player spec it came from;
    env: the checkpoint's env name (None for bots); meta: the checkpoint's ``meta`` JSON;
    kwargs: the checkpoint's env kwargs (a battle's map size; None for bots).
    seats: the checkpoint's declared `env.seats` (None: inferred, or a bot).
    """

    name: str
    kind: str
    load: str
    source: str
    env: str | None = None
    meta: dict = field(default_factory=dict)
    kwargs: dict | None = None
    seats: list | None = None


def checkpoint_name(path: Path, meta: dict) -> str:
    """Display name of the checkpoint at `path` (resolved) with `meta` (see the module docstring)."""
    if path.name == "latest.safetensors" and path.parent.name == "checkpoints":
        return f"{path.parent.parent.name}/{meta.get('player') or 'main'}"
    if path.name == "latest.safetensors" and path.parent.parent.name == "checkpoints":
        return f"{path.parent.parent.parent.name}/{path.parent.name}"
    if meta.get("id") not in (None, ""):
        return str(meta["id"])
    return path.stem


def checkpoint_player(path: Path, source: str, name: str | None = None) -> Player:
    """The player of the checkpoint at `path`, named `name` or by `checkpoint_name`.

    The checkpoint is loaded, and so fully checked. Raises PlayerError naming `source` (the spec it
    came from) and the file if it is missing, corrupt or not a policy of this project.
    """
    from impala_league.agents.policy import load_policy
    from impala_league.agents.checkpoint import CheckpointError, read_checkpoint
    from impala_league.records import upgraded

    try:
        _, metadata = read_checkpoint(path)
        policy = load_policy(path)
    except CheckpointError as e:
        raise PlayerError(f"player {source!r}: {e}") from None
    try:
        meta = json.loads(metadata["meta"])
    except json.JSONDecodeError:
        raise PlayerError(f"player {source!r}: {path} has unreadable 'meta' JSON in its metadata") from None
    meta = upgraded(meta) if isinstance(meta, dict) else {}
    path = path.resolve()
    return Player(name or checkpoint_name(path, meta), "checkpoint", str(path), source, policy.spec.name, meta,
                  dict(policy.config.env.kwargs), policy.config.env.seats)


def _run_dir_players(run_dir: Path, source: str) -> list[Player]:
    run_dir = run_dir.resolve()
    checkpoints = run_dir / "checkpoints"
    players = []
    if (checkpoints / "latest.safetensors").is_file():
        players.append(checkpoint_player(checkpoints / "latest.safetensors", source))
    for path in sorted(checkpoints.glob("*/latest.safetensors")):
        players.append(checkpoint_player(path, source, f"{run_dir.name}/{path.parent.name}"))
    snapshots = [checkpoint_player(p, source) for p in sorted((run_dir / "league" / "snapshots").glob("*.safetensors"))]
    # Oldest first: by update step where the snapshot records it, else by file name.
    snapshots.sort(key=lambda p: (not isinstance(p.meta.get("step"), int), p.meta.get("step", 0), Path(p.load).name))
    players += snapshots
    if not players:
        raise PlayerError(f"player {source!r}: a directory without checkpoints (looked for checkpoints/latest."
                          "safetensors, checkpoints/*/latest.safetensors and league/snapshots/*.safetensors)")
    return players


def resolve_players(specs: list[str], env_name: str | None = None, minimum: int = 2) -> tuple[str, list[Player]]:
    """Expand player specs (see the module docstring) into players of one env.

    Args:
      specs: player specs, in the order their players are listed.
      env_name: the env to play; None = the env of the checkpoints (needed when all are bots).
      minimum: the fewest players the specs must give (a tournament's 2).

    Returns:
      (env name, players with unique names). A file reached twice (e.g. a snapshot given both
      directly and through its run directory) is entered once.

    Raises:
      PlayerError naming the spec: unknown bot or bad bot parameters, missing or corrupt file,
        a directory without checkpoints, checkpoints of different envs (or of another env than
        `env_name`, or with other env kwargs), only bots and no `env_name`, the same bot twice, or
        fewer than `minimum` players.
    """
    players = [player for spec in specs for player in _expanded(spec)]
    env_name = _one_env(players, env_name)
    named = _named(_unique(players, env_name))
    if len(named) < minimum:
        raise PlayerError(f"a tournament needs at least {minimum} players; {specs} gave {len(named)}")
    return env_name, named


def _expanded(spec: str) -> list[Player]:
    """The players of one spec: a bot, a checkpoint file, or a run directory's checkpoints."""
    path = Path(spec)
    if is_bot_spec(spec):  # bot names win over same-named paths (write ./random for a directory)
        return [Player(spec, "bot", spec, spec)]
    if path.is_dir():
        return _run_dir_players(path, spec)
    if path.is_file():
        return [checkpoint_player(path, spec)]
    if spec.endswith(".safetensors") or "/" in spec:
        raise PlayerError(f"player {spec!r}: no such checkpoint file or run directory")
    raise PlayerError(f"player {spec!r}{did_you_mean(spec)}: not a bot ({', '.join(BOT_SPECS)}) "
                      "nor an existing checkpoint file or run directory")


def _one_env(players: list[Player], env_name: str | None) -> str:
    """The env every player plays (`env_name`, else the checkpoints'), as one env: the same name, env
    kwargs and seats for every checkpoint, and an env the registry makes with them."""
    envs = {p.env: p.source for p in players if p.env is not None}
    if env_name is not None and env_name not in envs and envs:
        other, source = next(iter(envs.items()))
        raise PlayerError(f"player {source!r} plays {other}, not {env_name}")
    if len(envs) > 1:
        (env_a, src_a), (env_b, src_b) = list(envs.items())[:2]
        raise PlayerError(f"players must all play one env: {src_a!r} plays {env_a} but {src_b!r} plays {env_b}")
    built = {json.dumps(p.kwargs, sort_keys=True): p.source for p in players if p.kwargs is not None}
    if len(built) > 1:
        (kw_a, src_a), (kw_b, src_b) = list(built.items())[:2]
        raise PlayerError(f"players must all play one env: {src_a!r} was trained with env.kwargs {kw_a} "
                          f"but {src_b!r} with {kw_b}")
    seated = {json.dumps(p.seats): p.source for p in players if p.kind == "checkpoint"}
    if len(seated) > 1:
        (seats_a, src_a), (seats_b, src_b) = list(seated.items())[:2]
        raise PlayerError(f"players must all play one env: {src_a!r} was trained with env.seats {seats_a} "
                          f"but {src_b!r} with {seats_b}")
    env_name = env_name or next(iter(envs), None)
    if env_name is None:
        raise PlayerError("only bots were given: name the game with --env (connect_four or tictactoe)")
    from impala_league.envs.registry import env_spec

    try:
        env_spec(env_name, env_kwargs(players), env_seats(players))
    except ValueError as e:
        raise PlayerError(f"--env: {e}") from None
    return env_name


def _unique(players: list[Player], env_name: str) -> list[Player]:
    """`players` with each file entered once; a bot must play `env_name` and be given once."""
    unique: list[Player] = []
    seen_loads: set[str] = set()
    for player in players:
        if player.kind == "bot":
            try:
                make_bot(player.load, env_name)
            except ValueError as e:
                raise PlayerError(f"player {player.source!r}: {e}") from None
            if player.load in seen_loads:
                raise PlayerError(f"player {player.source!r} is given twice")
        if player.load not in seen_loads:
            seen_loads.add(player.load)
            unique.append(player)
    return unique


def _named(players: list[Player]) -> list[Player]:
    """`players` with unique names: the second of a name gets `#2`, the third `#3` ..."""
    names: dict[str, int] = {}
    named = []
    for player in players:
        names[player.name] = names.get(player.name, 0) + 1
        suffix = f"#{names[player.name]}" if names[player.name] > 1 else ""
        named.append(Player(player.name + suffix, player.kind, player.load, player.source, player.env, player.meta,
                            player.kwargs, player.seats))
    return named


def load_side(load: str, env_name: str, seed: int):
    """A playing side: ``make_bot(load, env_name, seed)`` for a bot spec, else the checkpoint's
    policy at path ``load`` with its sampling generator seeded ``seed``."""
    if is_bot_spec(load):
        return make_bot(load, env_name, seed)
    from impala_league.agents.policy import load_policy

    return load_policy(load, seed=seed)


def pair_seeds(pair_index: int, seed: int) -> tuple[int, int]:
    """Base seeds of a pair's two matches: its first-listed player in seat 0, then in seat 1."""
    return seed + 2 * pair_index * MATCH_SEED_STRIDE, seed + (2 * pair_index + 1) * MATCH_SEED_STRIDE


def play_pair(env_name: str, a: tuple[str, str], b: tuple[str, str], games: int, seed: int, greedy: bool = True,
              record_dir: str | None = None, pair_index: int = 0,
              load: Callable[[str, str, int], object] = load_side,
              kwargs: Mapping[str, Any] | None = None, seats: list | None = None) -> list[dict]:
    """Both matches of one pair: `games` games with `a` in seat 0, then `games` with `b` in seat 0.

    a, b: (display name, load string) of the two players. Match m's games are seeded
    ``pair_seeds(pair_index, seed)[m] + k``; the side in seat s is seeded with that base + s.
    With `record_dir`, every game is saved as a replay there. kwargs: the env's constructor arguments
    (`env_kwargs` of the tournament's players), the same for every pair; seats: their declared
    `env.seats` (`env_seats`).

    Returns two JSON-ready dicts: ``first``, ``second`` (names by seat), ``seed``, ``games``,
    ``first_wins``, ``draws``, ``second_wins``, ``mean_length`` (actions per game).
    """
    results = []
    for (first, second), match_seed in zip(((a, b), (b, a)), pair_seeds(pair_index, seed)):
        sides = (load(first[1], env_name, match_seed), load(second[1], env_name, match_seed + 1))
        records = play_games(env_name, sides, games, match_seed, greedy, kwargs, seats)
        if record_dir is not None:
            from impala_league.evaluation.replays import save_match

            save_match(record_dir, env_name, (first[0], second[0]), records, kwargs, seats)
        outcome = count_outcomes(records, 0)
        results.append({"first": first[0], "second": second[0], "seed": match_seed, "games": games,
                        "first_wins": outcome.wins, "draws": outcome.draws, "second_wins": outcome.losses,
                        "mean_length": float(np.mean([r.length for r in records]))})
    return results


def env_kwargs(players: list[Player]) -> dict:
    """The env kwargs every pair plays with: the checkpoints' (`resolve_players` checked that they
    agree), so that bot pairs play the same env (e.g. a battle's map size); {} among bots only."""
    return next((p.kwargs for p in players if p.kwargs is not None), {})


def env_seats(players: list[Player]) -> list | None:
    """The seats every pair plays with: the checkpoints' declared `env.seats` (`resolve_players`
    checked that they agree); None = inferred from the env's agent names."""
    return next((p.seats for p in players if p.kind == "checkpoint"), None)


def _worker_command(env_name: str, a: Player, b: Player, games: int, seed: int, greedy: bool,
                    record_dir: str | None, pair_index: int, kwargs: dict, seats: list | None = None) -> list[str]:
    # Every value as --opt=VALUE: a name or path starting with "-" (a snapshot id "--a", a file "-x.safetensors")
    # must not be read as an option.
    cmd = [sys.executable, "-m", "impala_league.evaluation.tournament", f"--env={env_name}", f"--a-name={a.name}", f"--a={a.load}",
           f"--b-name={b.name}", f"--b={b.load}", f"--games={games}", f"--seed={seed}", f"--pair-index={pair_index}",
           f"--env-kwargs={json.dumps(kwargs)}", f"--env-seats={json.dumps(seats)}"]
    if not greedy:
        cmd.append("--sample")
    if record_dir is not None:
        cmd.append(f"--record={Path(record_dir).resolve()}")
    return cmd


def _run_worker(cmd: list[str], a: Player, b: Player) -> list[dict]:
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True)
    if proc.returncode != 0:
        last = (proc.stderr.strip().splitlines() or ["(no message)"])[-1]
        raise TournamentError(f"{a.name} vs {b.name}: the worker process failed (exit {proc.returncode}): {last}")
    try:
        return json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise TournamentError(f"{a.name} vs {b.name}: the worker process printed no JSON result") from None


def round_robin(env_name: str, players: list[Player], games: int, seed: int = 0, greedy: bool = True,
                workers: int = 1, record_dir: str | None = None, show_progress: bool = False) -> dict:
    """Every pair of `players` plays `games` games in each seat; results and Elo ratings.

    Args:
      env_name / players: as returned by `resolve_players`.
      games: games per pair and seat.
      seed: base seed (see `pair_seeds`).
      greedy: policies play their argmax action (deterministic: a greedy policy against another
        greedy policy plays the same game every time); False samples.
      workers: pairs played at once, each in its own subprocess; 1 = all in this process.
      record_dir: save every game there as a replay.
      show_progress: draw a rich progress bar (counted in games).

    Returns:
      A JSON-ready dict: ``env``, ``games_per_seat``, ``greedy``, ``seed``, ``players`` (name, kind,
      source, file, step, agent_steps_trained), ``matches`` (see `play_pair`), ``ratings`` (name, elo, stderr,
      games, wins, draws, losses, score; best first) and ``elo`` (how ratings were fitted).

    Raises:
      TournamentError: a worker process failed; the message names the pair.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    pairs = [(i, j) for i in range(len(players)) for j in range(i + 1, len(players))]
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("games"),
               TimeRemainingColumn())
    with Progress(*columns, disable=not show_progress, transient=False) as progress:
        task = progress.add_task("round-robin", total=2 * games * len(pairs))
        if workers <= 1:
            matches = _play_here(env_name, players, pairs, games, seed, greedy, record_dir, progress, task)
        else:
            matches = _play_in_workers(env_name, players, pairs, games, seed, greedy, record_dir, workers,
                                       progress, task)
    return summarize(env_name, players, matches, games, seed, greedy)


def _play_here(env_name: str, players: list[Player], pairs: list[tuple[int, int]], games: int, seed: int,
               greedy: bool, record_dir: str | None, progress, task) -> list[dict]:
    """`round_robin`'s pairs played in this process, in order, each checkpoint loaded once; their match
    results in pair order. `progress` (rich) shows the pair playing and counts the games under `task`."""
    kwargs, seats = env_kwargs(players), env_seats(players)
    policies: dict[str, object] = {}

    def load_cached(load: str, env: str, side_seed: int):
        if is_bot_spec(load):
            return make_bot(load, env, side_seed)
        if load not in policies:
            policies[load] = load_side(load, env, side_seed)
        policies[load].generator.manual_seed(side_seed)  # as if freshly loaded with this seed
        return policies[load]

    matches: list[dict] = []
    for index, (i, j) in enumerate(pairs):
        a, b = players[i], players[j]
        progress.update(task, description=f"{a.name} vs {b.name}")
        matches += play_pair(env_name, (a.name, a.load), (b.name, b.load), games, seed, greedy,
                             record_dir, index, load_cached, kwargs, seats)
        progress.advance(task, 2 * games)
    return matches


def _play_in_workers(env_name: str, players: list[Player], pairs: list[tuple[int, int]], games: int, seed: int,
                     greedy: bool, record_dir: str | None, workers: int, progress, task) -> list[dict]:
    """`round_robin`'s pairs played by up to `workers` subprocesses at once; their match results in pair
    order. A failed worker cancels the pairs not started yet and raises TournamentError."""
    kwargs, seats = env_kwargs(players), env_seats(players)
    with ThreadPoolExecutor(max_workers=workers) as pool:
        futures = {pool.submit(_run_worker, _worker_command(env_name, players[i], players[j], games, seed,
                                                            greedy, record_dir, index, kwargs, seats),
                               players[i], players[j]): index
                   for index, (i, j) in enumerate(pairs)}
        by_pair: dict[int, list[dict]] = {}
        try:
            for future in as_completed(futures):
                by_pair[futures[future]] = future.result()
                progress.advance(task, 2 * games)
        except BaseException:
            for future in futures:
                future.cancel()  # running workers finish; queued ones never start
            raise
    return [match for index in range(len(pairs)) for match in by_pair[index]]


def summarize(env_name: str, players: list[Player], matches: list[dict], games: int, seed: int,
              greedy: bool) -> dict:
    """The tournament result dict of `round_robin` from its match results."""
    names = [p.name for p in players]
    index = {name: i for i, name in enumerate(names)}
    n = len(names)
    points, played = np.zeros((n, n)), np.zeros((n, n))
    wins, draws, losses = np.zeros(n, int), np.zeros(n, int), np.zeros(n, int)
    for m in matches:
        f, s = index[m["first"]], index[m["second"]]
        points[f, s] += m["first_wins"] + m["draws"] / 2
        points[s, f] += m["second_wins"] + m["draws"] / 2
        played[f, s] += m["games"]
        played[s, f] += m["games"]
        wins[f] += m["first_wins"]
        wins[s] += m["second_wins"]
        losses[f] += m["second_wins"]
        losses[s] += m["first_wins"]
        draws[f] += m["draws"]
        draws[s] += m["draws"]
    fit = fit_elo(points, played, prior_draws=PRIOR_DRAWS)
    ratings = []
    for i in np.argsort(-fit.ratings, kind="stable"):
        total = int(wins[i] + draws[i] + losses[i])
        ratings.append({"name": names[i], "elo": float(fit.ratings[i]), "stderr": float(fit.stderr[i]),
                        "games": total, "wins": int(wins[i]), "draws": int(draws[i]), "losses": int(losses[i]),
                        "score": float((wins[i] + draws[i] / 2) / total) if total else None})
    described = [{"name": p.name, "kind": p.kind, "source": p.source,
                  **({"file": p.load, "step": p.meta.get("step"),
                      "agent_steps_trained": p.meta.get("agent_steps_trained")}
                     if p.kind == "checkpoint" else {})} for p in players]
    return {"env": env_name, "env_kwargs": env_kwargs(players), "games_per_seat": games, "greedy": greedy,
            "seed": seed, "players": described, "matches": matches, "ratings": ratings,
            "elo": {"model": "Bradley-Terry maximum likelihood, draws = half a win", "scale": "400 log10",
                    "anchor": "mean rating 0", "prior_draws_per_pair": PRIOR_DRAWS,
                    "stderr": "inverse observed Fisher information (pseudo-inverse)"}}


def ratings_table(result: dict):
    """A rich Table of `round_robin`'s ratings: games, win/draw/loss %, Elo ± standard error."""
    from rich.table import Table

    mode = "greedy" if result["greedy"] else "sampled"
    games = plural(result["games_per_seat"], "game")
    table = Table(title=f"{result['env']} round-robin: {games} per pair and seat, {mode}",
                  caption="Elo: Bradley-Terry fit, mean 0; ± one standard error")
    for column, justify in (("#", "right"), ("player", "left"), ("games", "right"), ("win %", "right"),
                            ("draw %", "right"), ("loss %", "right"), ("Elo", "right"), ("±", "right")):
        table.add_column(column, justify=justify)
    for rank, r in enumerate(result["ratings"], 1):
        g = max(r["games"], 1)
        table.add_row(str(rank), r["name"], str(r["games"]), f"{100 * r['wins'] / g:.1f}",
                      f"{100 * r['draws'] / g:.1f}", f"{100 * r['losses'] / g:.1f}", f"{r['elo']:+.0f}",
                      f"{r['stderr']:.0f}")
    return table


def _worker_main(argv: list[str] | None = None) -> int:
    """One pair, for `round_robin(workers > 1)`: arguments on the command line, JSON on stdout."""
    p = argparse.ArgumentParser(description="play one tournament pair (started by run.py evaluate --workers); "
                                "give every value as --opt=VALUE", allow_abbrev=False)
    p.add_argument("--env", required=True)
    p.add_argument("--a", required=True, help="bot spec or checkpoint path")
    p.add_argument("--a-name", required=True)
    p.add_argument("--b", required=True, help="bot spec or checkpoint path")
    p.add_argument("--b-name", required=True)
    p.add_argument("--games", type=int, required=True)
    p.add_argument("--seed", type=int, required=True)
    p.add_argument("--pair-index", type=int, required=True)
    p.add_argument("--sample", action="store_true")
    p.add_argument("--record")
    p.add_argument("--env-kwargs", type=json.loads, default={}, help="the env's constructor arguments, as JSON")
    p.add_argument("--env-seats", type=json.loads, default=None,
                   help="the env's declared seats, as JSON (null: inferred from the agents' names)")
    args = p.parse_args(argv)
    try:
        result = play_pair(args.env, (args.a_name, args.a), (args.b_name, args.b), args.games, args.seed,
                           not args.sample, args.record, args.pair_index, kwargs=args.env_kwargs, seats=args.env_seats)
    except ValueError as e:  # includes CheckpointError
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(_worker_main())
