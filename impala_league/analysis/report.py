"""`run.py report`: one self-contained HTML page about run directories and compare outputs.

Every figure is drawn by matplotlib and embedded as a base64 PNG, so the page is one file that
opens anywhere. Per run: the architecture with the run's own figures, learning curves, throughput,
the policy-lag histogram, V-trace diagnostics, where a league ran its Elo ratings over time and the
main agent's payoff against each opponent, and the final evaluation with, in board games, how earlier
policies played the bots. The page counts training in agent steps throughout (metrics' `agent_steps_trained` key).
Per compare output (a folder with compare.json): its tables (the variants; every score over seeds)
and figures.
"""

from __future__ import annotations

import base64
import html
import io
import json
import time
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from impala_league.analysis.runs import SCORE_KEYS, Run, load_run, read_jsonl
from impala_league.config import ConfigError
from impala_league.league.players import MAIN
from impala_league.records import upgraded
from impala_league.text import plural

if TYPE_CHECKING:
    from matplotlib.figure import Figure

CURVE_KEYS = (*SCORE_KEYS, "first_seat_win_rate", "draw_rate", "episode_length")
VTRACE_KEYS = ("mean_rho", "rho_clipped_fraction", "c_clipped_fraction")
MAX_PAYOFF_PLAYERS = 40  # the payoff figure's opponents: taller is unreadable (and megapixels per snapshot)
MAX_ELO_LINES = 12  # the Elo figure's lines: every learner and bot, then the newest snapshots


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def _png(fig: Figure | None) -> str | None:
    """An <img> holding `fig` as a base64 PNG (None for None); closes the figure."""
    if fig is None:
        return None
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    _pyplot().close(fig)
    return f'<img alt="plot" src="data:image/png;base64,{base64.b64encode(buf.getvalue()).decode()}">'


def _median(records: list[dict], key: str) -> float | None:
    """The median of `key` over the records that have a finite value of it (None without one)."""
    values = [r[key] for r in records if isinstance(r.get(key), (int, float)) and np.isfinite(r[key])]
    return float(np.median(values)) if values else None


def learner_device(run: Run) -> str:
    """The device the learner trained on: the newest record's `learner_device` ('cuda:0', 'cpu'); runs
    from before that key show learner.device with ' (configured)', since 'auto' says not which one ran."""
    recorded = [r["learner_device"] for r in run.records if r.get("learner_device")]
    return recorded[-1] if recorded else f"{run.config.learner.device} (configured)"


def figures(run: Run) -> dict[str, float | None]:
    """The run's own numbers for the diagram, whole-run figures: the median over the metrics records of
    SPS, queue depth and policy lag (the last records, while the actors stop, are not the run), and
    publish rate = weight publishes per second (updates per second between the first and last records,
    or since the start with one record, / publish_every)."""
    recs = run.records
    rate = None
    if len(recs) >= 2 and run.elapsed(recs[-1]) > run.elapsed(recs[0]):
        rate = (recs[-1]["step"] - recs[0]["step"]) / (run.elapsed(recs[-1]) - run.elapsed(recs[0]))
    elif recs and run.elapsed(recs[-1]) > 0:  # one record: updates since the start (a resumed run overstates)
        rate = recs[-1]["step"] / run.elapsed(recs[-1])
    if rate is not None:
        rate /= run.config.learner.publish_every
    return {"sps": _median(recs, "sps"), "queue_depth": _median(recs, "queue_depth"),
            "policy_lag": _median(recs, "policy_lag"), "publish_rate": rate}


def architecture(run: Run) -> Figure:
    """Boxes and arrows: actors -> Redis stream -> learner -> weights -> actors (+ league manager),
    each labelled with the run's figures (`figures`: medians over the run) and the learner's device as
    recorded (`learner_device`). A3C runs show workers, the gradient stream and the parameter server
    instead."""
    plt = _pyplot()
    from matplotlib.patches import FancyArrowPatch, FancyBboxPatch

    cfg, f = run.config, figures(run)
    a3c = cfg.learner.algo == "a3c"
    fmt = lambda v, spec: "n/a" if v is None else format(v, spec)  # noqa: E731
    boxes = {
        "actors": (0.03, 0.55, f"{'A3C workers' if a3c else 'actors'}\n{cfg.actor.num_actors} processes x "
                   f"{cfg.actor.num_envs} envs\n{cfg.env.name}, T = {cfg.actor.unroll_length}"),
        "stream": (0.37, 0.55, f"Redis stream\n{cfg.run.name}:{'grads' if a3c else 'traj'}\nqueue depth "
                   f"{fmt(f['queue_depth'], '.1f')} (median)"),
        "learner": (0.71, 0.55, f"{'parameter server' if a3c else 'learner'}\n{learner_device(run)}, "
                    f"B = {1 if a3c else cfg.learner.batch_size}\nSPS {fmt(f['sps'], ',.0f')} (median)"),
        "params": (0.37, 0.12, f"weights ({cfg.run.name}:params)\n{fmt(f['publish_rate'], '.2f')} publishes/s\n"
                   f"policy lag {fmt(f['policy_lag'], '.1f')} updates (median)"),
    }
    if cfg.league.enabled:
        boxes["league"] = (0.71, 0.12, "league manager\nsnapshots, payoff, Elo, PFSP\n"
                           f"{cfg.league.main_exploiters} + {cfg.league.league_exploiters} exploiters")
    w, h = 0.26, 0.3
    fig, ax = plt.subplots(figsize=(9, 4.2))
    ax.set_axis_off()
    for name, (x, y, text) in boxes.items():
        ax.add_patch(FancyBboxPatch((x, y), w, h, boxstyle="round,pad=0.01", fc="#e8f0fe" if name != "stream"
                                    else "#fdecea", ec="#333"))
        ax.text(x + w / 2, y + h / 2, text, ha="center", va="center", fontsize=9)

    def arrow(a, b, label):
        (xa, ya), (xb, yb) = a, b
        ax.add_patch(FancyArrowPatch((xa, ya), (xb, yb), arrowstyle="-|>", mutation_scale=14, color="#333"))
        ax.text((xa + xb) / 2, (ya + yb) / 2 + 0.03, label, ha="center", fontsize=8, color="#555")

    arrow((0.03 + w, 0.7), (0.37, 0.7), "gradients" if a3c else "unrolls")
    arrow((0.37 + w, 0.7), (0.71, 0.7), "XREADGROUP")
    arrow((0.71 + w / 2, 0.55), (0.37 + w, 0.27), "publish")
    arrow((0.37, 0.27), (0.03 + w / 2, 0.55), "pull")
    if cfg.league.enabled:
        arrow((0.71 + w / 2, 0.42), (0.71 + w / 2, 0.12 + h), "")
    ax.set_xlim(0, 1)
    ax.set_ylim(0.05, 0.9)
    ax.set_title(f"{run.name}: {'A3C' if a3c else 'IMPALA'} on {cfg.env.name}")
    return fig


def _broken(run: Run, records: list[dict], x, y) -> tuple[list[float], list[float]]:
    """x(r), y(r) of `records` with a NaN between the learner processes of a resumed run, so that the
    time it was stopped is not drawn as a line."""
    xs, ys = [], []
    for segment in run.segments(records):
        if xs:
            xs.append(float("nan"))
            ys.append(float("nan"))
        xs += [x(r) for r in segment]
        ys += [y(r) for r in segment]
    return xs, ys


X_AXES = {"agent_steps_trained": "agent steps trained", "emulator_frames": "emulator frames (Atari: 4 per agent step)",
          "time": "wall clock (s)"}


def _lines(run: Run, keys: tuple[str, ...], x: str, title: str, ylabel: str = "") -> Figure | None:
    """One line per key of `keys` that the records have, against `x` (a key of X_AXES: agent steps
    trained, emulator frames, or the run's training seconds; a resumed run's learner processes as
    separate pieces of one line)."""
    # A key at 0 in every record says nothing: e.g. the mean return of self-play, whose seats' returns cancel.
    present = [k for k in keys if any(r.get(k) not in (None, 0) and (x == "time" or x in r) for r in run.records)]
    if not present:
        return None
    # Keys with the same series (rho_clipped_fraction and c_clipped_fraction with both thresholds 1.0) are
    # one line: a second one on top of it would be named in the legend and never seen.
    series: dict[tuple, list[str]] = {}
    for k in present:
        recs = [r for r in run.records if k in r and (x == "time" or x in r)]
        xy = _broken(run, recs, run.elapsed if x == "time" else (lambda r: r[x]), lambda r: r[k])
        series.setdefault((tuple(xy[0]), tuple(xy[1])), []).append(k)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    for (xs, ys), names in series.items():
        ax.plot(xs, ys, ".-", label=" = ".join(names))
    ax.set_xlabel(X_AXES[x])
    if x != "time":
        from matplotlib.ticker import EngFormatter  # matplotlib loads with the first figure (_pyplot)

        ax.xaxis.set_major_formatter(EngFormatter(sep=""))  # 1.5M, not 1500000 or an offset
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig


def throughput(run: Run) -> Figure | None:
    """SPS and queue depth against wall clock."""
    if not run.records:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.4))
    ax.plot(*_broken(run, run.records, run.elapsed, lambda r: r["sps"]), ".-", color="C0", label="SPS")
    ax.set_xlabel("wall clock (s)")
    ax.set_ylabel("SPS (agent steps trained / s)", color="C0")
    twin = ax.twinx()
    twin.plot(*_broken(run, run.records, run.elapsed, lambda r: r.get("queue_depth", 0)), ".-", color="C3",
              label="queue depth")
    twin.set_ylabel("queue depth (stream entries)", color="C3")
    ax.set_title("throughput")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    return fig


def lag_distribution(records: list[dict]) -> tuple[np.ndarray, np.ndarray, int | None]:
    """Unrolls per policy lag over `records`, as two arrays indexed by lag (same length): `exact`, from
    `policy_lag_counts` bins that hold one lag each, and `placed`, the unrolls of a record's last bin where
    that bin holds "LAG_BINS - 1 or more" (the record's `policy_lag_max` is above it), each record's put at
    the mean lag of those unrolls, which its `policy_lag` gives exactly: (mean * unrolls - the lags of the
    other bins) / their count. Also returns the lag where the recorded counts stop (None where no record's
    did). Records without counts are left out."""
    from impala_league.distributed.learner.metrics import LAG_BINS

    exact: dict[int, float] = {}
    placed: dict[int, float] = {}
    cut = None
    for r in records:
        c = r.get("policy_lag_counts") or []
        last = len(c) - 1
        top = r.get("policy_lag_max")
        beyond = last >= 0 and c[last] > 0 and (top > last if top is not None else len(c) >= LAG_BINS)
        for lag, n in enumerate(c[:last] if beyond else c):
            exact[lag] = exact.get(lag, 0) + n
        if not beyond:
            continue
        cut = last if cut is None else min(cut, last)
        mean = r.get("policy_lag")
        at = last
        if isinstance(mean, (int, float)) and np.isfinite(mean):
            at = (mean * sum(c) - sum(lag * n for lag, n in enumerate(c[:last]))) / c[last]
            at = int(round(min(max(at, last), top if top is not None else max(at, last))))
        placed[at] = placed.get(at, 0) + c[last]
    size = max([*exact, *placed], default=-1) + 1
    out = np.zeros(size), np.zeros(size)
    for arr, d in zip(out, (exact, placed)):
        for lag, n in d.items():
            arr[lag] = n
    return out[0], out[1], cut


def lag_histogram(run: Run) -> Figure | None:
    """Unrolls (A3C: gradients) per policy lag over the run (`lag_distribution`), the x axis fitted to the
    lags that occurred; runs from before `policy_lag_counts` show the distribution of the per-record mean
    lag instead."""
    exact, placed, cut = lag_distribution(run.records)
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 3.2))
    if exact.sum() + placed.sum() > 0:
        lags = np.arange(len(exact))
        ax.bar(lags, exact, color="C2", label="unrolls per lag")
        if cut is not None:
            ax.bar(lags, placed, bottom=exact, color="C1", hatch="//",
                   label=f"lag {cut} or more (where the recorded counts stop): a record's unrolls at their mean lag")
            ax.legend(fontsize=7)
        used = np.flatnonzero(exact + placed)
        ax.set_xlim(used[0] - 1, used[-1] + 1)
        ax.set_ylabel("unrolls")
        ax.set_xlabel("policy lag (learner updates)")
    elif run.records:
        ax.hist([r["policy_lag"] for r in run.records if r.get("policy_lag") is not None], bins=20, color="C2")
        ax.set_ylabel("metrics records")
        ax.set_xlabel("mean policy lag of a record")
    else:
        plt.close(fig)
        return None
    ax.set_title("policy lag")
    fig.tight_layout()
    return fig


def _elo_lines(ratings: list[dict]) -> list[str]:
    """The members the Elo figure draws, sorted: every learner and bot, then the snapshots (ids ending in
    `-<update>`) that appeared last, MAX_ELO_LINES in all; a league of thousands stays readable."""
    seen: dict[str, None] = {}
    for r in ratings:
        seen.update(dict.fromkeys(r.get("elo", {})))
    snapshots = [m for m in seen if m.rpartition("-")[2].isdigit()]
    others = [m for m in seen if not m.rpartition("-")[2].isdigit()]
    spare = max(0, MAX_ELO_LINES - len(others))
    return sorted(others + (snapshots[-spare:] if spare else []))


def league_figures(run: Run) -> list[Figure]:
    """Elo over time (league/ratings.jsonl) and the main agent's payoff (league/state.json, `payoff_figure`),
    where present."""
    out = []
    plt = _pyplot()
    ratings = read_jsonl(run.path / "league" / "ratings.jsonl")
    if ratings:
        fig, ax = plt.subplots(figsize=(7, 3.6))
        members = _elo_lines(ratings)
        for m in members:
            rows = [r for r in ratings if m in r.get("elo", {})]
            ax.plot([max(0.0, r["time"] - run.start) for r in rows], [r["elo"][m] for r in rows], label=m)
        ax.set_xlabel("wall clock (s)")
        ax.set_ylabel("Elo")
        ax.set_title("league Elo over time")
        ax.grid(alpha=0.3)
        if len(members) <= MAX_ELO_LINES:
            ax.legend(fontsize=7)
        fig.tight_layout()
        out.append(fig)
    state_file = run.path / "league" / "state.json"
    if state_file.is_file():
        fig = payoff_figure(json.loads(state_file.read_text()))
        if fig is not None:
            out.append(fig)
    return out


def payoff_figure(state: dict) -> Figure | None:
    """The main agent's score, (wins + draws / 2) / games, against each opponent it played in
    league/state.json's `payoff` rows ([player, opponent, wins, draws, losses]): one bar each, with the
    score and the games written beside it; bots and learners first, then snapshots by step, the newest of
    them where there are more than MAX_PAYOFF_PLAYERS opponents. None where the main agent played none.
    (A heat map of every pair was mostly empty: the league's games are the main agent's.)"""
    played = {b: (w, d, l) for a, b, w, d, l in state.get("payoff", []) if a == MAIN and w + d + l > 0}
    if not played:
        return None
    members = state.get("members", {})
    # A snapshot by its member record, or (a state.json without members) by its id ending in -<update>.
    suffix = lambda p: p.rpartition("-")[2]  # noqa: E731
    snapshots = sorted((p for p in played if members.get(p, {}).get("kind", "snapshot" if suffix(p).isdigit()
                                                                     else "") == "snapshot"),
                       key=lambda p: members.get(p, {}).get("step", int(suffix(p)) if suffix(p).isdigit() else 0))
    others = sorted(set(played) - set(snapshots))
    spare = max(1, MAX_PAYOFF_PLAYERS - len(others))
    opponents = others + snapshots[-spare:]
    scores = [(played[p][0] + 0.5 * played[p][1]) / sum(played[p]) for p in opponents]
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, max(2.4, 1.2 + 0.28 * len(opponents))))
    rows = np.arange(len(opponents))
    ax.barh(rows, scores, color=["C0" if p in others else "C7" for p in opponents])
    for row, p, score in zip(rows, opponents, scores):
        ax.text(min(score, 0.78) + 0.01, row, f"{score:.2f} ({sum(played[p]):,} games)", va="center", fontsize=7)
    ax.set_yticks(rows, opponents, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlim(0, 1)
    ax.axvline(0.5, color="#999", lw=0.8)
    ax.set_xlabel("score of the main agent (wins + draws / 2) / games")
    kept = len(opponents) - len(others)
    shown = "" if len(opponents) == len(played) else f" (the newest {kept} snapshots of {len(snapshots)})"
    ax.set_title(f"payoff: the main agent against each opponent{shown}", fontsize=10)
    fig.tight_layout()
    return fig


def _section(anchor: str, title: str, body: list[str | None]) -> str:
    parts = [b for b in body if b]
    if not parts:
        parts = ["<p class=empty>nothing recorded</p>"]
    return f'<section id="{anchor}"><h2>{html.escape(title)}</h2>{"".join(parts)}</section>'


def _has(run: Run, key: str) -> bool:
    return any(key in r for r in run.records)


def _seat_keys(run: Run) -> tuple[str, ...]:
    """The per-seat league score keys (`league_score_seat_<s>`) the run's records have, by seat."""
    keys = {k for r in run.records for k in r if k.startswith("league_score_seat_")}
    return tuple(sorted(keys, key=lambda k: int(k.rsplit("_", 1)[1])))


def run_figures(run: Run) -> dict[str, list]:
    """The figures about one run by section: architecture, learning, throughput, lag, vtrace, and
    league where a league ran. Each list holds matplotlib Figures (or None where nothing was recorded)."""
    sections = {
        "architecture": [architecture(run)],
        # Atari's published curves count emulator frames (and minutes); runs with a frame skip log them.
        "learning": [_lines(run, CURVE_KEYS[:2], "agent_steps_trained", "score"),
                     _lines(run, CURVE_KEYS[:2], "emulator_frames", "score against emulator frames"),
                     _lines(run, CURVE_KEYS[:2], "time", "score against time")
                     if _has(run, "emulator_frames") else None,
                     _lines(run, CURVE_KEYS[2:4], "agent_steps_trained", "self-play outcomes", "fraction of games"),
                     _lines(run, CURVE_KEYS[4:], "agent_steps_trained", "episode length", "steps"),
                     _lines(run, _seat_keys(run), "agent_steps_trained",
                            "league score per learner seat (seat 0 moves first)")],
        "throughput": [throughput(run)],
        "lag": [lag_histogram(run)],
        "vtrace": [_lines(run, VTRACE_KEYS, "agent_steps_trained", "importance ratios rho = pi / mu")],
    }
    if run.config.league.enabled:
        sections["league"] = league_figures(run)
    return sections


TITLES = {"architecture": "architecture", "learning": "learning curves", "throughput": "throughput",
          "lag": "policy lag", "vtrace": "V-trace diagnostics", "league": "league"}


def run_sections(run: Run, k: int) -> list[str]:
    """The HTML sections about one run (anchors run{k}-<section>)."""
    cfg = run.config
    correction = "none (A3C's own n-step returns)" if cfg.learner.algo == "a3c" else cfg.learner.correction
    facts = (f"<p>{html.escape(str(run.path))}: {cfg.learner.algo}, correction {correction}, "
             f"{cfg.actor.num_actors} actors x {cfg.actor.num_envs} envs, weight delay {cfg.actor.weight_delay}, "
             f"{len(run.records)} metrics records, "
             f"{run.records[-1]['agent_steps_trained'] if run.records else 0:,} agent steps "
             "trained.</p>")
    out = []
    for name, figs in run_figures(run).items():
        body = ([facts] if name == "architecture" else []) + [_png(f) for f in figs]
        out.append(_section(f"run{k}-{name}", f"{run.name}: {TITLES[name]}", body))
    if run.evaluation is not None:
        out.append(_section(f"run{k}-evaluation", f"{run.name}: final evaluation",
                            [evaluation_table(run.evaluation), _png(over_training_figure(run.evaluation))]))
    return out


def evaluation_table(record: dict) -> str:
    """evaluation.json as HTML: the checkpoint's step, agent steps trained and the games' seed, then per opponent and
    seat the win/draw/loss rates and, in board games, the immediate wins taken and forced blocks made
    (one-agent envs: the episodes' returns)."""
    games = plural(record.get("games"), "episode") if "episodes" in record else \
        plural(record.get("games"), "game") + " per seat"
    head = (f"<p>checkpoint {html.escape(str(record.get('checkpoint')))} at update {record.get('step')}, "
            f"{record.get('agent_steps_trained') or 0:,} agent steps; greedy, seed {record.get('seed')}, {games}</p>")
    if "episodes" in record:
        modes = [("greedy", record["episodes"])] + ([("sampled", record["episodes_sampled"])]
                                                    if record.get("episodes_sampled") else [])
        protocol = record.get("protocol")
        note = "" if not protocol else (f"<p>{html.escape(protocol['name'])} protocol: sticky actions "
                                        f"{protocol['sticky_actions']}, up to {protocol['noop_max']} no-op starts, "
                                        f"frame skip {protocol['frame_skip']} (docs/atari.md)</p>")
        rows = "".join(f"<tr><td>{mode}</td><td>{e['mean_return']:.1f}</td><td>{e['std_return']:.1f}</td>"
                       f"<td>{e['min_return']:.1f}</td><td>{e['max_return']:.1f}</td></tr>" for mode, e in modes)
        return head + note + ("<table><tr><th>play</th><th>mean return</th><th>std</th><th>min</th><th>max</th></tr>"
                              f"{rows}</table>")
    rows = "".join(f"<tr><td>{html.escape(opponent)}</td><td>{html.escape(seat)}</td><td>{r['win_rate']:.1%}</td>"
                   f"<td>{r['draw_rate']:.1%}</td><td>{r['loss_rate']:.1%}</td>"
                   f"<td>{_mean_return(r)}</td>"
                   f"<td>{_chances(r.get('tactics'), 'wins_taken', 'win_chances')}</td>"
                   f"<td>{_chances(r.get('tactics'), 'blocks_made', 'block_chances')}</td></tr>"
                   for opponent, seats in record.get("opponents", {}).items() for seat, r in seats.items())
    return head + ("<table><tr><th>opponent</th><th>seat</th><th>won</th><th>drew</th><th>lost</th><th>mean return</th>"
                   f"<th>immediate wins taken</th><th>forced blocks made</th></tr>{rows}</table>") + judges_table(record) \
        + built_in_table(record)


def judges_table(record: dict) -> str:
    """evaluation.json's `judges` as HTML, apart from the training opponents: per judge and seat the
    win/draw/loss counts, the score (wins + draws / 2) / games with its 95% interval, and the games; ''
    where the record has none."""
    judges = record.get("judges") or {}
    if not judges:
        return ""
    rows = "".join(f"<tr><td>{html.escape(judge)}</td><td>{html.escape(seat)}</td><td>{r['wins']}</td>"
                   f"<td>{r['draws']}</td><td>{r['losses']}</td><td>{_score(r)}</td><td>{r['games']}</td></tr>"
                   for judge, seats in judges.items() for seat, r in seats.items())
    return ("<p>held out: judges the run never trained against (evaluation.judges), greedy, seed "
            f"{record.get('seed')}</p><table><tr><th>judge</th><th>seat</th><th>won</th><th>drew</th><th>lost</th>"
            f"<th>score [95% interval]</th><th>games</th></tr>{rows}</table>")


def built_in_table(record: dict) -> str:
    """evaluation.json's `built_in_player` as HTML (two-player Atari, evaluation/atari_judge.py): the final
    policy and the earlier ones of `over_training` as first_0 of the one-player game against its built-in
    player, one row each: update, agent steps trained, games, mean return (its points minus the built-in player's), min,
    max, won/drew/lost; '' where the record has none."""
    final = record.get("built_in_player")
    if not final:
        return ""
    # The earlier policies of over_training, then the final one (over_training's last entry, when it has one).
    entries = [e for e in record.get("over_training", [])
               if "built_in_player" in e and e.get("step") != record.get("step")]
    entries.append({"step": record.get("step"), "agent_steps_trained": record.get("agent_steps_trained"),
                    "built_in_player": final})
    rows = "".join(f"<tr><td>{e['step']}</td><td>{e.get('agent_steps_trained') or 0:,}</td><td>{r['games']}</td>"
                   f"<td>{r['mean_return']:+.1f}</td><td>{r['min_return']:+.0f}</td><td>{r['max_return']:+.0f}</td>"
                   f"<td>{r['wins']} / {r['draws']} / {r['losses']}</td></tr>"
                   for e in entries for r in [e["built_in_player"]])
    protocol = f", {html.escape(final['protocol']['name'])} protocol" if final.get("protocol") else ""
    sampled = record.get("built_in_player_sampled")
    sampled = f"; sampled, the final policy: mean return {sampled['mean_return']:+.1f}" if sampled else ""
    return (f"<p>held out: {html.escape(final['env'])} ({html.escape(final['env_id'])}, gymnasium's wrappers{protocol}) "
            f"as {html.escape(final['seat'])} against the game's built-in player, greedy, seed {final['seed']}{sampled} "
            "(evaluation.built_in_games); the last row is the final policy</p><table><tr><th>update</th>"
            "<th>agent steps</th><th>games</th><th>mean return</th><th>min</th><th>max</th>"
            "<th>won / drew / lost</th></tr>"
            f"{rows}</table>")


def _score(result: dict) -> str:
    """'0.740 [0.646, 0.816]' of one seat's `MatchResult.as_dict()`."""
    low, high = result["score_ci95"]
    return f"{result['score']:.3f} [{low:.3f}, {high:.3f}]"


def _mean_return(result: dict) -> str:
    return f"{result['mean_return']:+.1f}" if "mean_return" in result else ""  # older evaluation.json: none


def _chances(tactics: dict | None, done: str, chances: str) -> str:
    """'30/40 (75%)' of one seat's tactics counts (evaluation/tactics.py); '-' without them."""
    if not tactics:
        return "-"
    n, k = tactics[done], tactics[chances]
    return f"{n}/{k}" + (f" ({n / k:.0%})" if k else "")


OVER_TRAINING_RATES = (("win_rate", "win rate"), ("wins_taken_rate", "immediate wins taken"),
                       ("blocks_made_rate", "forced blocks made"))


def _seat_rate(result: dict, key: str) -> float | None:
    """`win_rate`, `mean_return` or a tactics rate of one seat's `MatchResult.as_dict()`; None where it has none."""
    return result.get(key) if key in ("win_rate", "mean_return") else (result.get("tactics") or {}).get(key)


def over_training_figure(record: dict | None) -> Figure | None:
    """evaluation.json's `over_training` (earlier policies of the run, then the final one, against the
    bots and the held-out judge): one row per opponent, one column per rate (win rate, immediate wins
    taken, forced blocks made; in games without one-move tactics: win rate and mean return), against
    agent steps trained, one line per seat. A judge's row (below the bots') shows in its first column
    the score (wins + draws / 2) / games with its 95% interval instead of the win rate. None where the
    record has no such entries."""
    entries = sorted((e for e in (record or {}).get("over_training") or [] if e.get("agent_steps_trained") is not None),
                     key=lambda e: e["agent_steps_trained"])
    if not entries:
        return None
    rows = [(o, "opponents") for o in dict.fromkeys(o for e in entries for o in e["opponents"])]
    rows += [(j, "judges") for j in dict.fromkeys(j for e in entries for j in e.get("judges", {}))]
    tactics = any(r.get("tactics") for e in entries for seats in e["opponents"].values() for r in seats.values())
    rates = OVER_TRAINING_RATES if tactics else (("win_rate", "win rate"), ("mean_return", "mean return per game"))
    with_positions = len(rates) == 3 and any("positions" in e for e in entries)
    plt = _pyplot()
    n_rows = len(rows) + int(with_positions)
    fig, axes = plt.subplots(n_rows, len(rates), figsize=(10, 0.8 + 2.6 * n_rows), squeeze=False, sharex=True)
    for row, (opponent, kind) in enumerate(rows):
        played = [(e["agent_steps_trained"], e[kind][opponent]) for e in entries if opponent in e.get(kind, {})]
        seats = list(dict.fromkeys(s for _, by_seat in played for s in by_seat))
        for col, (key, label) in enumerate(rates):
            ax = axes[row][col]
            held_out_score = kind == "judges" and key == "win_rate"
            for seat in seats:
                results = [(x, by_seat[seat]) for x, by_seat in played if seat in by_seat]
                if held_out_score:
                    xs, ys = [x for x, _ in results], [r["score"] for _, r in results]
                    errors = [[r["score"] - r["score_ci95"][0] for _, r in results],
                              [r["score_ci95"][1] - r["score"] for _, r in results]]
                    ax.errorbar(xs, ys, yerr=errors, fmt=".-", capsize=3, label=seat)
                    continue
                points = [(x, _seat_rate(r, key)) for x, r in results]
                points = [(x, y) for x, y in points if y is not None]  # no chance of that kind in those games
                if points:
                    ax.plot(*zip(*points), ".-", label=seat)
            if key != "mean_return":
                ax.set_ylim(-0.03, 1.03)
            title = f"vs {opponent} (held out): score, 95% interval" if held_out_score else \
                f"vs {opponent}{' (held out)' if kind == 'judges' else ''}: {label}"
            ax.set_title(title, fontsize=9)
            ax.grid(alpha=0.3)
            if row == n_rows - 1:
                ax.set_xlabel("agent steps trained")
    if with_positions:
        positions_row(axes[-1], [e for e in entries if "positions" in e])
    axes[0][0].legend(fontsize=7)
    fig.suptitle("over training: the greedy policy against the bots and the held-out judges (the last point: the "
                 "final evaluation)", fontsize=10)
    fig.tight_layout()
    return fig


def positions_row(axes, entries: list[dict]) -> None:
    """The over-training figure's row of the solver's positions (evaluation/positions.py) on three axes:
    the blunder rate and the optimal-move rate over the positions not already lost, each with its 95%
    interval, and the blunder rate by phase; `entries` sorted by agent steps, each with `positions`."""
    xs = [e["agent_steps_trained"] for e in entries]
    for ax, key, label in ((axes[0], "blunder", "blunder rate"), (axes[1], "optimal", "optimal moves")):
        rates = [e["positions"]["all"] for e in entries]
        ys = [r[key] for r in rates]
        errors = [[y - r[f"{key}_ci95"][0] for y, r in zip(ys, rates)], [r[f"{key}_ci95"][1] - y for y, r in zip(ys, rates)]]
        ax.errorbar(xs, ys, yerr=errors, fmt=".-", capsize=3, color="k")
        ax.set_title(f"solver's positions (held out): {label}, 95% interval", fontsize=9)
    for phase in dict.fromkeys(p for e in entries for p in e["positions"]["phases"]):
        points = [(x, e["positions"]["phases"][phase]["blunder"]) for x, e in zip(xs, entries)
                  if e["positions"]["phases"].get(phase, {}).get("positions")]
        if points:
            axes[2].plot(*zip(*points), ".-", label=phase)
    axes[2].set_title("solver's positions: blunder rate by phase", fontsize=9)
    axes[2].legend(fontsize=7)
    for ax in axes:
        ax.set_ylim(-0.03, 1.03)
        ax.grid(alpha=0.3)


def log_figures(run: Run, tracker) -> None:
    """Log the report's figures to `tracker` (a tracking.Tracker or one of its sinks) under
    `report/<section>/<n>`, and the league's payoff as a table (`report/payoff`) where a league ran."""
    figures = {}
    for name, figs in run_figures(run).items():
        for n, fig in enumerate(f for f in figs if f is not None):
            figures[f"report/{name}/{n}"] = fig
    try:
        tracker.log_figures(figures)
    finally:
        for fig in figures.values():
            _pyplot().close(fig)
    state_file = run.path / "league" / "state.json"
    if state_file.is_file():
        rows = json.loads(state_file.read_text()).get("payoff", [])
        tracker.log_table("report/payoff", ["player", "opponent", "wins", "draws", "losses"], rows)


def log_to_wandb(run: Run, wandb_run) -> None:
    """`log_figures` to one wandb run (from `wandb.init`)."""
    from impala_league.tracking import WandbSink

    log_figures(run, WandbSink(wandb_run))


def log_report(run_dir: str | Path, tracker) -> None:
    """The figures of `run.py report` for the run in `run_dir`, to `tracker`: what the learner logs at
    the end of a run (run.py passes this function to it)."""
    log_figures(load_run(run_dir), tracker)


def compare_section(folder: Path, k: int) -> str:
    """The tables of compare.json as HTML (the variants; every score over seeds) and its PNGs, embedded."""
    summary = upgraded(json.loads((folder / "compare.json").read_text()))
    from impala_league.analysis.compare import COLUMNS, INTERVAL_NOTE, SEEDS_HEADER, SEEDS_NOTE, cell, seeds_rows

    head = "".join(f"<th>{html.escape(t)}</th>" for _, t, _ in COLUMNS)
    rows = []
    for name, v in summary["variants"].items():
        cells = "".join(f"<td>{html.escape(cell(v, key, fmt))}</td>" for key, _, fmt in COLUMNS)
        rows.append(f"<tr><td>{html.escape(name)}</td><td>{len(v['runs'])}</td>{cells}</tr>")
    table = (f"<p>study {html.escape(str(summary.get('study')))}, score <code>{html.escape(str(summary['metric']))}"
             f"</code>, equal wall clock {summary['equal_wall_clock_s']:.0f} s, equal agent steps "
             f"{summary['equal_agent_steps']:,}. {html.escape(INTERVAL_NOTE)}</p>"
             f"<table><tr><th>variant</th><th>seeds</th>{head}</tr>{''.join(rows)}</table>")
    seeds = seeds_rows(summary)
    if seeds:
        seeds_head = "".join(f"<th>{html.escape(t)}</th>" for t in SEEDS_HEADER)
        body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in seeds)
        table += (f"<p>Every score over seeds:</p><table><tr>{seeds_head}</tr>{body}</table>"
                  f"<p>{html.escape(SEEDS_NOTE)}</p>")
    images = [f'<img alt="plot" src="data:image/png;base64,{base64.b64encode((folder / p).read_bytes()).decode()}">'
              for p in summary.get("plots", []) if (folder / p).is_file()]
    return _section(f"compare{k}", f"comparison: {folder.name}", [table, *images])


STYLE = """body{font-family:sans-serif;max-width:1000px;margin:auto;padding:1em;color:#222}
section{border-top:1px solid #ccc;padding:.5em 0}img{max-width:100%;display:block;margin:.5em 0}
table{border-collapse:collapse}td,th{border:1px solid #bbb;padding:2px 6px;text-align:right}"""


def build_report(paths: list[str | Path]) -> str:
    """The HTML page about `paths`: run directories and/or compare outputs (whose runs are shown
    too). Raises ConfigError for a path that is neither."""
    sections, k, compares = [], 0, 0
    for raw in paths:
        path = Path(raw)
        if (path / "compare.json").is_file():
            sections.append(compare_section(path, compares))
            compares += 1
            runs = sorted(p.parent for p in path.glob("*/config.yaml"))
        elif (path / "config.yaml").is_file():
            runs = [path]
        else:
            raise ConfigError(f"{path} is neither a run directory (config.yaml) nor a compare output (compare.json)")
        for run_dir in runs:
            sections += run_sections(load_run(run_dir), k)
            k += 1
    title = "training report: " + ", ".join(Path(p).name for p in paths)
    return (f"<!DOCTYPE html><html><head><meta charset=utf-8><title>{html.escape(title)}</title>"
            f"<style>{STYLE}</style></head><body><h1>{html.escape(title)}</h1>"
            f"<p>generated {time.strftime('%Y-%m-%d %H:%M:%S')}</p>{''.join(sections)}</body></html>\n")
