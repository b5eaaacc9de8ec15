"""`run.py compare --study league`: the league's worth, measured (AlphaStar's league ablation in miniature).

Vinyals et al. 2019 ("Grandmaster level in StarCraft II using multi-agent reinforcement learning",
Fig. 4 and Methods) trained the same agent with parts of its league taken away: plain self-play, PFSP
over past players, and the league's exploiters (main exploiters, which train against the main agent,
and league exploiters, PFSP against the whole league), and rated every result in one Elo scale. Here
each arm of `ARMS` (a name, a one-line meaning and `--set` overrides over the study's config, by
default configs/connect_four_league.yaml) trains for the same minutes and seeds as a normal `run.py
train` run with its own league settings (`compare.train_variants`). Then every final policy, greedy,
plays the outside judges (`mcts:N`, evaluation/judges.py: never a training opponent of any arm), and
all final policies (every arm x seed) play one round-robin, sampled, rated by evaluation/elo.py's
Bradley-Terry fit. Each arm's row gives each judge's score (wins + draws / 2, both seats pooled) and
its seeds' Elo as the mean over seeds ± the 95% Student-t half-width, with the IQM and its bootstrap
interval (analysis/compare.py's seed statistics).
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from impala_league import REPO
from impala_league.analysis.compare import (add_score, cell, markdown_table, plot_curves, plot_seed_curves,
                                            summarize, train_variants)
from impala_league.analysis.runs import Run
from impala_league.checked_config import load_config
from impala_league.text import plural
from impala_league.config import Config, ConfigError
from impala_league.envs.registry import env_spec
from impala_league.evaluation.judges import check_judges, is_judge_spec

log = logging.getLogger("compare")

STUDY = "league"
DEFAULT_CONFIG = REPO / "configs" / "connect_four_league.yaml"
DEFAULT_JUDGES = ("mcts:100", "mcts:400")
DEFAULT_JUDGE_GAMES = 10  # per seat
DEFAULT_ROUND_ROBIN_GAMES = 10  # per pair and seat
JUDGES_FILE = "judges.json"  # in each run directory: its final policy against the judges
PLOT = "league_study.png"
NEVER = 10**9  # league.snapshot_every of the bots arm: no snapshot by the clock


@dataclass(frozen=True)
class Arm:
    """One arm of the study: `meaning`, one line for the table; `overrides`, `section.key=value`
    applied after the config and the command's own --set."""

    meaning: str
    overrides: tuple[str, ...]


_NO_EXPLOITERS = ("league.main_exploiters=0", "league.league_exploiters=0")
_PFSP = ("league.enabled=true", "league.bots=[]", "league.bot_share=0")
# The arms, in the table's order. `pfsp` keeps the config's main-agent mix (self_play, pfsp, forgotten:
# AlphaStar's 35/50/15 by default) over a league of its own snapshots only. `bots` gives every game to the
# bots by PFSP (bot_share 1, no self-play, no PFSP over the league) and freezes no snapshot by the clock
# (snapshot_every NEVER): nothing would play one.
ARMS: dict[str, Arm] = {
    "selfplay": Arm("self-play against the latest weights only: no league, no bots",
                    ("league.enabled=false", "league.bots=[]", *_NO_EXPLOITERS)),
    "pfsp": Arm("the main agent's mix (self-play, PFSP over its snapshots, forgotten snapshots); no bots",
                (*_PFSP, *_NO_EXPLOITERS)),
    "pfsp-main-exploiters": Arm("pfsp, plus a main exploiter that trains against the main agent",
                                (*_PFSP, "league.main_exploiters=1", "league.league_exploiters=0")),
    "pfsp-league-exploiters": Arm("pfsp, plus a league exploiter: PFSP against the whole league",
                                  (*_PFSP, "league.main_exploiters=0", "league.league_exploiters=1")),
    "bots": Arm("every main-agent game against league.bots, by PFSP: no self-play, no snapshots",
                ("league.enabled=true", "league.self_play=0", "league.pfsp=0", "league.forgotten=0",
                 "league.bot_share=1", f"league.snapshot_every={NEVER}", *_NO_EXPLOITERS)),
    "main-job": Arm("the config as it is (connect four: self-play, PFSP over snapshots and bots, bot_share)", ()),
}


def arm_plan(only: list[str] | None = None) -> dict[str, list[str]]:
    """Arm name -> its overrides (`ARMS`), limited to the arms in `only` (in the table's order) where
    given. Raises ValueError naming the arms for an unknown one."""
    unknown = sorted(set(only or ()) - set(ARMS))
    if unknown:
        raise ValueError(f"--variants {' '.join(unknown)}: the league study has {', '.join(ARMS)}")
    return {name: list(arm.overrides) for name, arm in ARMS.items() if not only or name in only}


def check_arms(config: str | Path, extra: list[str], arms: dict[str, list[str]], judges: list[str]
               ) -> dict[str, Config]:
    """Each arm's config (`config`, then `extra`, then the arm's overrides), checked before anything
    trains: a valid config of a two-player game, no judge among its league.bots (a judge is never a
    training opponent, evaluation/judges.py `check_judges`), and for `bots` at least one bot. Other
    judges than `mcts:N` must be bot specs of the game. Raises ConfigError naming the arm."""
    from impala_league.evaluation.bots import make_bot

    configs = {}
    for name, overrides in arms.items():
        try:
            cfg = load_config(config, [*extra, *overrides])
            check_judges(judges, cfg.env.name, cfg.league.bots, judges_from="--judges")
            for judge in judges:
                if not is_judge_spec(judge):
                    make_bot(judge, cfg.env.name)
        except (ConfigError, ValueError) as e:
            raise ConfigError(f"arm {name}: {e}") from None
        if len(env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats).seats) != 2:
            raise ConfigError(f"arm {name}: the league study plays two-player games; {cfg.env.name} is not one")
        if name == "bots" and not cfg.league.bots:
            raise ConfigError("arm bots: league.bots is empty; the bots arm trains against the config's bots")
        configs[name] = cfg
    return configs


def judge_run(run_dir: Path, judges: list[str], games: int, seed: int = 0) -> dict:
    """The run's final checkpoint, greedy, against each judge, `games` per seat (game k of the policy in
    seat s seeded seed + 1,000,003 s + k, as evaluation/evaluate.py `evaluate` seeds them); written to
    RUN_DIR/judges.json and returned: {judge: {"score": wins + draws / 2 over both seats' games,
    "seats": {seat: `MatchResult.as_dict()`}}}. {} without a checkpoint or with `games` 0."""
    from impala_league.agents.policy import load_policy
    from impala_league.evaluation.evaluate import evaluate

    checkpoint = run_dir / "checkpoints" / "latest.safetensors"
    if games <= 0 or not checkpoint.is_file():
        return {}
    policy = load_policy(checkpoint)
    results = {}
    for judge in judges:
        start = time.monotonic()
        seats = evaluate(policy, judge, games, seed)["seats"]
        results[judge] = {"score": float(np.mean([r["score"] for r in seats.values()])), "seats": seats}
        log.info("%s vs judge %s, %s per seat: score %s (%.0f s)", run_dir.name, judge, plural(games, "game"),
                 " / ".join(f"{r['score']:.2f}" for r in seats.values()), time.monotonic() - start)
    (run_dir / JUDGES_FILE).write_text(json.dumps({"games_per_seat": games, "seed": seed, "judges": results},
                                                  indent=2) + "\n")
    return results


def play_round_robin(runs: dict[str, list[Run]], games: int, seed: int = 0) -> dict | None:
    """Every final policy (the runs' checkpoints/latest.safetensors, each named by its run directory,
    `<arm>-seed<seed>`) against every other, `games` per pair and seat, sampling from the policies (two
    greedy policies play one game per seat, again and again): evaluation/tournament.py `round_robin`,
    with its Elo fit (evaluation/elo.py: Bradley-Terry, mean 0, ± standard errors). None below two
    policies or with `games` 0."""
    from impala_league.evaluation.tournament import checkpoint_player, round_robin

    finals = [r for rs in runs.values() for r in rs if (r.path / "checkpoints" / "latest.safetensors").is_file()]
    if games <= 0 or len(finals) < 2:
        return None
    players = [checkpoint_player(r.path / "checkpoints" / "latest.safetensors", r.name, r.name) for r in finals]
    start = time.monotonic()
    result = round_robin(players[0].env, players, games, seed, greedy=False)
    log.info("round-robin of %d final policies, %s per pair and seat: %.0f s", len(players), plural(games, "game"),
             time.monotonic() - start)
    return result


def judge_key(judge: str) -> str:
    """The summary key of a judge's score: `judge_mcts:100`."""
    return f"judge_{judge}"


def league_summary(runs: dict[str, list[Run]], judged: dict[str, dict], tournament: dict | None,
                   judges: list[str], metric: str = "auto") -> dict:
    """compare's `summarize` of the runs (the training table), with in each arm's row its `meaning`, each
    judge's score (key `judge_key(judge)`) and the round-robin `elo` as scores over seeds (`add_score`:
    mean, t half-width, IQM and bootstrap interval, per seed), and in each run's row its `judges` and
    `elo` (the fit's rating and standard error); `extra_scores` names them (compare's table of every
    score over seeds shows them), `round_robin` is the tournament. judged: run name -> `judge_run`'s
    result."""
    summary = summarize(runs, metric)
    ratings = {r["name"]: r for r in tournament["ratings"]} if tournament else {}
    for name, rs in runs.items():
        v = summary["variants"][name]
        v["meaning"] = ARMS[name].meaning if name in ARMS else ""
        for judge in judges:
            add_score(v, judge_key(judge), [judged.get(r.name, {}).get(judge, {}).get("score") for r in rs])
        add_score(v, "elo", [ratings[r.name]["elo"] if r.name in ratings else None for r in rs])
        for row, r in zip(v["runs"], rs):
            row["judges"] = judged.get(r.name, {})
            row["elo"] = ratings.get(r.name)
            row["snapshots"] = len(list((r.path / "league" / "snapshots").glob("*.safetensors")))
    summary["extra_scores"] = {**{judge_key(j): f"vs {j}" for j in judges}, "elo": "round-robin Elo"}
    summary["round_robin"] = tournament
    return summary


def elo_text(variant: dict) -> str:
    """An arm's round-robin Elo over seeds: `+35 ± 40` (mean ± t half-width, whole points), `+35 (one run)`
    for one seed, `-` without one; `(n of N seeds)` where some seeds had none."""
    mean, half, seeds = variant.get("elo"), variant.get("elo_ci95"), variant.get("elo_seeds")
    if mean is None:
        return "-"
    partial = f" ({seeds} of {len(variant['runs'])} seeds)" if 1 < seeds < len(variant["runs"]) else ""
    return f"{mean:+.0f} " + ("(one run)" if half is None else f"± {half:.0f}") + partial


def league_table(summary: dict) -> str:
    """compare.md of the league study: one row per arm (seeds, agent steps trained, each judge's score
    and the round-robin Elo over seeds, the arm's meaning), a note on how they were measured, one row
    per final policy, then compare's training table (`markdown_table`)."""
    judges = summary.get("judges", [])
    keys = [judge_key(j) for j in judges] + ["elo"]
    lines = ["| arm | seeds | agent steps trained | " + " | ".join(f"vs {j}" for j in judges)
             + " | round-robin Elo | meaning |", "|" + "---|" * (len(keys) + 4)]
    for name, v in summary["variants"].items():
        cells = [elo_text(v) if key == "elo" else cell(v, key, None) for key in keys]
        lines.append(f"| {name} | {len(v['runs'])} | {cell(v, 'agent_steps_trained', '{:,.0f}')} | " + " | ".join(cells)
                     + f" | {v.get('meaning', '')} |")
    rr = summary.get("round_robin")
    judge_games = plural(summary.get("judge_games"), "game")
    lines += ["", f"Judges: each final checkpoint, greedy, {judge_games} per seat against each "
              "judge (never a training opponent); score = (wins + draws / 2) / games, both seats pooled. Round-robin "
              + (f"Elo: every final policy against every other, {plural(rr['games_per_seat'], 'game')} per pair "
                 "and seat, "
                 "sampled; Bradley-Terry fit, mean 0 over the policies (evaluation/elo.py). " if rr else
                 "Elo: none (fewer than two final policies). ")
              + "Each arm: mean over its seeds ± the half-width of the 95% interval of the mean (Student t); "
              "`(one run)`: one seed, no interval.", "", "| policy | agent steps trained | snapshots | "
              + " | ".join(f"vs {j} (seat 0 / seat 1)" for j in judges) + " | Elo ± s.e. | round-robin score |",
              "|" + "---|" * (len(judges) + 5)]
    for v in summary["variants"].values():
        for row in v["runs"]:
            scores = [" / ".join(f"{s['score']:.2f}" for s in row["judges"][j]["seats"].values())
                      if j in row["judges"] else "-" for j in judges]
            elo = row.get("elo")
            lines.append(f"| {row['run']} | {row['agent_steps_trained']:,} | {row['snapshots']} | " + " | ".join(scores)
                         + (f" | {elo['elo']:+.0f} ± {elo['stderr']:.0f} | {elo['score']:.3f} |" if elo else " | - | - |"))
    return "\n".join(lines) + "\n\n## Training\n\n" + markdown_table(summary)


def plot_league(summary: dict, out: Path) -> Path | None:
    """PLOT in `out`: a panel per judge (score) and one for the round-robin Elo, an arm per column:
    every seed's value as a dot, the mean over seeds as a bar with its 95% t interval where there are
    two seeds or more. None when no arm has any of these scores."""
    keys = [(judge_key(j), f"score vs {j}") for j in summary.get("judges", [])] + [("elo", "round-robin Elo")]
    keys = [(k, t) for k, t in keys if any(v.get(k) is not None for v in summary["variants"].values())]
    if not keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    arms = list(summary["variants"])
    fig, axes = plt.subplots(1, len(keys), figsize=(4.5 * len(keys), 4), squeeze=False)
    for ax, (key, title) in zip(axes[0], keys):
        for x, arm in enumerate(arms):
            v = summary["variants"][arm]
            seeds = [s for s in v.get(f"{key}_per_seed", []) if s is not None]
            ax.plot(x + np.linspace(-0.15, 0.15, len(seeds)) if len(seeds) > 1 else [x] * len(seeds), seeds, "o",
                    color=f"C{x}", alpha=0.6)
            if v.get(key) is not None:
                ax.errorbar([x], [v[key]], yerr=None if v[f"{key}_ci95"] is None else [[v[f"{key}_ci95"]]] * 2,
                            fmt="_", markersize=20, capsize=6, color="black")
        ax.set_xticks(range(len(arms)), arms, rotation=30, ha="right")
        ax.set_title(title)
        ax.grid(alpha=0.3, axis="y")
        if key != "elo":
            ax.set_ylim(-0.05, 1.05)
    fig.suptitle("every seed (dots), the mean over seeds and its 95% t interval (black)")
    fig.tight_layout()
    fig.savefig(out / PLOT, dpi=100)
    plt.close(fig)
    return out / PLOT


def write_league_outputs(runs: dict[str, list[Run]], judged: dict[str, dict], tournament: dict | None, out: Path,
                         meta: dict, metric: str = "auto") -> dict:
    """compare.json, compare.md (`league_table`), PLOT and compare's learning curves in `out`; returns
    the summary (`league_summary` with `meta`: study, config, seeds, minutes, judges, judge_games, arms)."""
    summary = league_summary(runs, judged, tournament, meta.get("judges", []), metric)
    summary.update(meta)
    seeds = plot_seed_curves(runs, summary["metric"], out)
    plots = [plot_league(summary, out), *plot_curves(runs, summary["metric"], out), seeds]
    summary["plots"] = [p.name for p in plots if p is not None]
    (out / "compare.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "compare.md").write_text(league_table(summary), encoding="utf-8")
    return summary


def run_league_study(config: str | Path, arms: dict[str, list[str]], out: Path, seeds: list[int], minutes: float,
                     agent_steps: int | None, extra: list[str], redis_url: str | None, judges: list[str],
                     judge_games: int = DEFAULT_JUDGE_GAMES, round_robin_games: int = DEFAULT_ROUND_ROBIN_GAMES,
                     metric: str = "auto") -> dict:
    """Train every arm (name -> overrides, see `arm_plan`; checked by `check_arms`) x seed one after
    another as normal `run.py train` runs with their league settings, `minutes` of wall clock each (or
    `agent_steps` trained; compare's `train_variants`); judge each final policy as it finishes
    (`judge_run`, `judge_games` per seat); then the round-robin of all final policies (`play_round_robin`,
    `round_robin_games` per pair and seat) and the outputs in `out` (`write_league_outputs`). Returns the
    summary. A run that fails is reported and left out; all failing is a RuntimeError."""
    judged: dict[str, dict] = {}

    def after(run_dir: Path) -> None:
        judged[run_dir.name] = judge_run(run_dir, judges, judge_games)

    runs = train_variants(config, arms, out, seeds, minutes, agent_steps, extra, redis_url, after)
    tournament = play_round_robin(runs, round_robin_games)
    meta = {"study": STUDY, "config": str(config), "seeds": seeds, "minutes": minutes, "judges": list(judges),
            "judge_games": judge_games, "round_robin_games": round_robin_games,
            "arms": {name: {"meaning": ARMS[name].meaning, "overrides": overrides} for name, overrides in arms.items()}}
    return write_league_outputs(runs, judged, tournament, out, meta, metric)
