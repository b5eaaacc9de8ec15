"""The evaluation at the end of `run.py train`: the final checkpoint, greedy, against the baseline bots and,
apart from them, against the outside judges (`evaluation.judges`, evaluation/judges.py) and, in two-player
Atari, against the one-player game's built-in player (evaluation/atari_judge.py), and earlier
policies of the run against the same bots and the first judge (evaluation/over_training.py), kept in
RUN_DIR/evaluation.json and the run's trackers; and the lines that show a match's results per seat."""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path

from impala_league.agents.checkpoint import CheckpointError, read_checkpoint
from impala_league.agents.policy import load_policy
from impala_league.analysis.runs import EVALUATION_FILE
from impala_league.config import Config
from impala_league.distributed.learner.checkpoint_history import history_files
from impala_league.envs import atari2p
from impala_league.evaluation.atari_judge import ONE_PLAYER_SEAT, JudgeError, judge, judge_line, one_player_game
from impala_league.evaluation.atari_protocol import ProtocolError, evaluate_atari, protocol_kwargs, summary_text
from impala_league.evaluation.evaluate import episode_returns, evaluate
from impala_league.evaluation.judges import resolve_judges
from impala_league.evaluation.over_training import earlier_policies, evaluate_over_training
from impala_league.evaluation.positions import evaluate_positions, positions_lines
from impala_league.evaluation.solver import SOLVER_GAMES
from impala_league.league.players import MAIN, checkpoint_dir
from impala_league.records import upgraded
from impala_league.text import plural
from impala_league.tracking import log_final_evaluation

log = logging.getLogger("run")  # lines of `run.py train`, as the rest of its output


def final_evaluation(cfg: Config, checkpoint: Path, games: int, run_dir: Path, history: int = 0,
                      history_games: int = 50) -> None:
    """Play the final checkpoint greedily against the baseline bots (one-agent envs: episodes alone), then
    against the judges (`play_judges`) and the built-in player of a two-player Atari game's one-player game
    (`play_built_in_player`), log the results and keep them in RUN_DIR/evaluation.json
    (`record_final_evaluation`). Games of several seats with `history` > 0: also up to `history` earlier
    policies, `history_games` per seat, against the bots the final policy played and the first judge, and
    in the built-in player's game as many games as the final policy (`play_earlier_policies`)."""
    policy = load_policy(checkpoint)
    record = {**checkpoint_facts(checkpoint), "seed": 0, "games": games}
    if len(policy.spec.seats) == 1:
        play_alone(cfg, policy, games, record)
        log.info("checkpoint: %s  (.venv/bin/python run.py evaluate --checkpoint %s)", checkpoint, checkpoint)
        record_final_evaluation(cfg, run_dir, record)
        return
    strongest = {"connect_four": "minimax:2", "tictactoe": "minimax:9"}  # the search depths docs/evaluation.md shows
    board = policy.spec.name in strongest
    record["opponents"] = {}
    for opponent in ("random", "tactical", strongest[policy.spec.name]) if board else ("random",):
        result = evaluate(policy, opponent, games)
        record["opponents"][opponent] = result["seats"]
        log.info("greedy policy vs %s over %s per seat:", opponent, plural(games, "game"))
        for seat, r in result["seats"].items():
            log.info("  %s", seat_line(seat, r))
    judges = play_judges(cfg, policy, record)
    positions = play_positions(cfg, policy, record)
    play_built_in_player(cfg, policy, checkpoint, record)
    log.info("checkpoint: %s  (.venv/bin/python run.py evaluate --checkpoint %s --opponent %s)", checkpoint, checkpoint,
             "tactical" if board else "random")
    if history > 0:
        opponents = ("tactical", strongest[policy.spec.name]) if board else ("random",)
        record["over_training"] = play_earlier_policies(cfg, run_dir, record, opponents, history, history_games,
                                                        judges[:1], positions)
    record_final_evaluation(cfg, run_dir, record)


def play_alone(cfg: Config, policy, games: int, record: dict) -> None:
    """A one-seat env's final policy alone, `games` episodes, kept in `record` as `episodes` (greedy) and
    logged. An `atari:<Game>` policy plays under the run's `evaluation.atari_protocol`
    (evaluation/atari_protocol.py), greedy and then sampled (`episodes_sampled`), the protocol kept as
    `protocol`; one the protocol cannot play (another frame skip or action set) plays its own game greedily,
    with a warning."""
    atari = policy.spec.name.startswith("atari:")
    if atari:
        try:
            protocol_kwargs(policy.spec.name, policy.config.env.kwargs, cfg.evaluation.atari_protocol)
        except ProtocolError as e:
            log.warning("not evaluated under the %s protocol: %s; playing its own game instead",
                        cfg.evaluation.atari_protocol, e)
            atari = False
    if not atari:
        r = episode_returns(policy, games)
        record["episodes"] = r
        log.info("greedy policy over %d episodes: mean return %.3g (std %.3g, min %.3g, max %.3g)", games,
                 r["mean_return"], r["std_return"], r["min_return"], r["max_return"])
        return
    start = time.monotonic()
    result = evaluate_atari(policy, games, name=cfg.evaluation.atari_protocol)
    record.update(protocol=result["protocol"], episodes=result["greedy"], episodes_sampled=result["sampled"])
    log.info("%s under the %s protocol (sticky actions %s), %s (%.0f s):", policy.spec.name,
             result["protocol"]["name"], result["protocol"]["sticky_actions"], plural(games, "game"),
             time.monotonic() - start)
    for mode in ("greedy", "sampled"):
        log.info("  %s", summary_text(result[mode]))


def play_judges(cfg: Config, policy, record: dict) -> tuple[str, ...]:
    """The final policy, greedy, against each judge of the run (`evaluation.judges`, or the game's ladder),
    `evaluation.judge_games` per seat, seed 0 (each seat's judge seeded as `evaluate` seeds a bot). Keeps
    them in `record` apart from the training opponents: `judges` {judge: {seat: `MatchResult.as_dict()`}}
    and `judge_games`; logs win/draw/loss and the score with its 95% interval per seat. Returns the judges
    played (none where `judge_games` is 0)."""
    judges = resolve_judges(cfg.evaluation.judges, cfg.env.name) if cfg.evaluation.judge_games > 0 else ()
    if not judges:
        return ()
    games = cfg.evaluation.judge_games
    record["judge_games"], record["judges"] = games, {}
    for judge in judges:
        start = time.monotonic()
        record["judges"][judge] = evaluate(policy, judge, games)["seats"]
        log.info("held out: greedy policy vs judge %s over %s per seat (%.0f s):", judge, plural(games, "game"),
                 time.monotonic() - start)
        for seat, r in record["judges"][judge].items():
            log.info("  %s", seat_line(seat, r))
    return judges


def play_positions(cfg: Config, policy, record: dict) -> int:
    """Connect four: the final policy's greedy move in `evaluation.positions` seeded positions, scored by the
    solver (evaluation/positions.py), kept in `record` as `positions` and logged. Returns the count played
    (0 for other games or where `evaluation.positions` is 0)."""
    count = cfg.evaluation.positions if cfg.env.name in SOLVER_GAMES else 0
    if count <= 0:
        return 0
    start = time.monotonic()
    record["positions"] = evaluate_positions(policy, cfg.env.name, count)
    lines = positions_lines(record["positions"])
    log.info("held out: %s (%.0f s)", lines[0], time.monotonic() - start)
    for line in lines[1:]:
        log.info("%s", line)
    return count


def play_earlier_policies(cfg: Config, run_dir: Path, record: dict, opponents: tuple[str, ...], count: int,
                   games: int, judges: tuple[str, ...] = (), positions: int = 0) -> list[dict]:
    """Up to `count` earlier policies of the run (a league's snapshots of the main agent, else the copies in
    checkpoints/history/) against `opponents` and `judges`, `games` per seat, and their moves in `positions`
    solved positions (evaluation/over_training.py), then the final checkpoint's results from `record`: the
    list kept as `over_training` in evaluation.json."""
    if cfg.league.enabled:
        candidates = sorted((run_dir / "league" / "snapshots").glob(f"{MAIN}-*.safetensors"))
    else:
        candidates = history_files(checkpoint_dir(run_dir, MAIN))
    start = time.monotonic()
    entries = evaluate_over_training(earlier_policies(candidates, record["step"], count), opponents, games,
                                     judges=judges, positions=positions)
    final = {"checkpoint": record["checkpoint"], "step": record["step"],
             "agent_steps_trained": record["agent_steps_trained"], "games": record["games"],
             "opponents": {o: record["opponents"][o] for o in opponents}}
    if judges:
        final["judges"] = {j: record["judges"][j] for j in judges}
    if positions:
        final["positions"] = record["positions"]
    if "built_in_player" in record:
        built_in_over_training(entries, record["built_in_player"])
        final["built_in_player"] = record["built_in_player"]
    if entries:
        log.info("over training: %s, %s per seat and bot, in %.1f s (first / second seat):",
                 plural(len(entries), "earlier policy", "earlier policies"), plural(games, "game"),
                 time.monotonic() - start)
    else:
        log.info("over training: no earlier policy of this run to play (%s)", "no snapshot of the main agent"
                 if cfg.league.enabled else "no copy in checkpoints/history/")
    for entry in entries + [final]:
        for opponent, seats in {**entry["opponents"], **entry.get("judges", {})}.items():
            log.info("  update %s%s, %s agent steps, vs %s: %s", entry["step"], " (final)" if entry is final else "",
                     f"{entry['agent_steps_trained'] or 0:,}", opponent, seats_summary(seats))
        if "positions" in entry:
            r = entry["positions"]["all"]
            log.info("  update %s%s, %s agent steps, solver's positions: optimal %.1f%%, blunder %.1f%% of %d",
                     entry["step"], " (final)" if entry is final else "", f"{entry['agent_steps_trained'] or 0:,}",
                     100 * r["optimal"], 100 * r["blunder"], r["positions"])
        if "built_in_player" in entry:
            r = entry["built_in_player"]
            log.info("  update %s%s, %s agent steps, in %s vs the built-in player: mean return %+.1f over %d games",
                     entry["step"], " (final)" if entry is final else "", f"{entry['agent_steps_trained'] or 0:,}",
                     r["env"], r["mean_return"], r["games"])
    return entries + [final]


def play_built_in_player(cfg: Config, policy, checkpoint: Path, record: dict) -> None:
    """Two-player Atari (`atari2p:<game>`) whose ROM has a one-player `atari:<Game>` of the same action set:
    the final policy as first_0 there against the game's built-in player (evaluation/atari_judge.py),
    `evaluation.built_in_games` games greedy and as many sampled, seed 0, under `evaluation.atari_protocol`,
    cut at the run's own time limit (`env.kwargs.max_cycles` emulator frames). Kept in `record` as
    `built_in_player` and `built_in_player_sampled` (`judge`'s dicts), apart from the league's payoff and the
    training opponents; a policy the judge cannot play is logged and left out."""
    games = cfg.evaluation.built_in_games
    if games <= 0 or not cfg.env.name.startswith("atari2p:"):
        return
    env = one_player_game(cfg.env.name, cfg.env.kwargs)
    if env is None:
        log.info("no game against a built-in player: %s has no one-player atari: game of the same ROM and actions",
                 cfg.env.name)
        return
    start = time.monotonic()
    try:
        limit = atari2p.settings(cfg.env.name.split(":", 1)[1], cfg.env.kwargs)["max_cycles"]
        for key, greedy in (("built_in_player", True), ("built_in_player_sampled", False)):
            record[key] = judge(policy, env, ONE_PLAYER_SEAT, games, greedy=greedy, max_episode_frames=limit,
                                checkpoint=str(checkpoint), protocol=cfg.evaluation.atari_protocol)
            log.info("held out: %s (%.0f s)", judge_line(record[key]), time.monotonic() - start)
    except JudgeError as e:
        log.warning("no game against the built-in player: %s", e)


def built_in_over_training(entries: list[dict], final: dict) -> None:
    """Each earlier policy of `entries` (evaluation/over_training.py's) in the game the final policy played
    against the built-in player (`final`, `judge`'s dict): the same games, kept in its entry as
    `built_in_player`."""
    for entry in entries:
        try:
            entry["built_in_player"] = judge(load_policy(entry["checkpoint"]), final["env"], final["seat"],
                                             final["games"], final["seed"],
                                             max_episode_frames=final["max_episode_frames"],
                                             checkpoint=entry["checkpoint"],
                                             protocol=final.get("protocol", {}).get("name", "deterministic"))
        except (CheckpointError, JudgeError) as e:
            log.warning("over training: %s not played against the built-in player: %s", entry["checkpoint"], e)


def seats_summary(seats: dict) -> str:
    """'won 90% / 80%, took 70% / 65% of immediate wins, made 50% / 55% of forced blocks' over the seats
    of one match (`MatchResult.as_dict()` per seat; '-' where a seat had no chance); in games without
    one-move tactics 'won 90% / 80%, mean return +12.5 / +9.0'."""
    def rates(key: str) -> str:
        return " / ".join("-" if r["tactics"][key] is None else f"{r['tactics'][key]:.0%}" for r in seats.values())

    won = " / ".join(f"{r['win_rate']:.0%}" for r in seats.values())
    if all("score" in r for r in seats.values()):
        won += ", score " + " / ".join(f"{r['score']:.2f}" for r in seats.values())
    if any(r.get("tactics") is None for r in seats.values()):
        return f"won {won}, mean return " + " / ".join(f"{r.get('mean_return', 0.0):+.1f}" for r in seats.values())
    return f"won {won}, took {rates('wins_taken_rate')} of immediate wins, made {rates('blocks_made_rate')} of forced blocks"


def record_final_evaluation(cfg: Config, run_dir: Path, record: dict) -> None:
    """The one place the final evaluation of `train` is kept: RUN_DIR/evaluation.json (shown by
    `run.py report`), and its numbers in the run's trackers (wandb, TensorBoard) as
    `final_evaluation/<opponent>/<seat>/<rate>`, `final_evaluation/judges/<judge>/<seat>/<rate>` and
    `final_evaluation/built_in_player/<stat>` and `.../built_in_player_sampled/<stat>` (one-agent envs:
    `final_evaluation/episodes/<stat>`, Atari's sampled play `final_evaluation/episodes_sampled/<stat>`)."""
    (run_dir / EVALUATION_FILE).write_text(json.dumps(record, indent=2) + "\n")
    log.info("final evaluation saved to %s", run_dir / EVALUATION_FILE)
    kept = ("episodes", "episodes_sampled") if "episodes" in record else ("judges", "built_in_player",
                                                                          "built_in_player_sampled")
    results = {**({} if "episodes" in record else record.get("opponents", {})),
               **{key: record[key] for key in kept if record.get(key)}}
    log_final_evaluation(cfg, run_dir, flat(results), step=record.get("step"))


def flat(tree: dict, prefix: str = "") -> dict[str, float]:
    """{"a": {"b": 1}} -> {"a/b": 1}: the numbers of a nested dict under slash-joined keys."""
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict):
            out.update(flat(value, f"{prefix}{key}/"))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            out[f"{prefix}{key}"] = value
    return out


def checkpoint_facts(checkpoint: str | Path) -> dict:
    """The checkpoint's path, update step and agent steps trained (from its metadata; None where it has none)."""
    meta = upgraded(json.loads(read_checkpoint(checkpoint)[1]["meta"]))
    return {"checkpoint": str(checkpoint), "step": meta.get("step"),
            "agent_steps_trained": meta.get("agent_steps_trained")}


def seat_line(seat: str, result: dict) -> str:
    """'as player_0: won 95.0%  drew 1.0%  lost 4.0%  score 0.955 [0.921, 0.975] of 200  mean return +0.9'
    and the seat's tactics (`tactics_line`), for one seat's `MatchResult.as_dict()` (the score and its 95%
    interval where it has them)."""
    mean_return = f"  mean return {result['mean_return']:+.1f}" if "mean_return" in result else ""
    return (f"as {seat}: won {result['win_rate']:.1%}  drew {result['draw_rate']:.1%}  lost {result['loss_rate']:.1%}"
            + score_text(result) + mean_return + tactics_line(result["tactics"]))


def score_text(result: dict) -> str:
    """'  score 0.955 [0.921, 0.975] of 200' for one seat's `MatchResult.as_dict()` ('' without a score)."""
    if "score_ci95" not in result:
        return ""
    low, high = result["score_ci95"]
    return f"  score {result['score']:.3f} [{low:.3f}, {high:.3f}] of {result['games']}"


def tactics_line(tactics: dict | None) -> str:
    """'; took 30/40 immediate wins (75%), made 9/12 forced blocks (75%)' (evaluation/tactics.py; no rate
    where there was no chance); '' for games without a board model."""
    if tactics is None:
        return ""

    def part(done: int, chances: int, what: str) -> str:
        # Rounded down: 200 of 201 reads 99%, never the 100% that means every one.
        return f"{done}/{chances} {what}" + (f" ({100 * done // chances}%)" if chances else "")

    return (f"; took {part(tactics['wins_taken'], tactics['win_chances'], 'immediate wins')}, "
            f"made {part(tactics['blocks_made'], tactics['block_chances'], 'forced blocks')}")
