"""`run.py compare`: several training configurations, one after another, on the same machine, for the
same wall-clock budget and seeds; then a table (markdown + JSON) and learning-curve plots.

Studies (IMPALA paper: Table 1 throughput against A3C, Table 2 off-policy corrections):
  algos        IMPALA against A3C with the config's actor counts (learner.algo=impala | a3c)
  corrections  learner.correction = vtrace | is1 | epsilon | none, at a policy lag of `lag`
               published versions (actor.weight_delay); with `replay_fraction` each correction also
               with experience replay (`<correction>-replay`, learner.replay_fraction), Table 2's
               second half
  actors       actor.num_actors = 1, 2, 4, ...
These studies train without a league (A3C has none, and the corrections are compared on equal terms);
the league study (`--study league`, analysis/league_study.py) trains each of its arms with its league.
Each variant x seed is a normal `run.py train` run in `<out>/<variant>-seed<seed>`. Each score is
reported over seeds as the mean with a 95% confidence interval (Student t, `mean_and_interval`) and,
as Agarwal et al. (2021) recommend, as the interquartile mean with a 95% bootstrap percentile interval
(`iqm`, `bootstrap_interval`: rliable's `aggregate_iqm` and `get_interval_estimates`, computed here
with numpy); a score from one seed says "one run" and has no interval. docs/seeds.md has the details.
"""

from __future__ import annotations

import json
import logging
import math
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from impala_league import REPO
from impala_league.analysis.runs import Run, load_run, score_key
from impala_league.config import CORRECTIONS

log = logging.getLogger("compare")

STUDIES = ("algos", "corrections", "actors")
SMOOTH = 3  # a score is the mean of the last SMOOTH metrics records up to the point it is read at
UNLIMITED_AGENT_STEPS = 10**15
FINAL_EVAL = "final_eval.json"  # the wall-clock budget, not the config's total_agent_steps, ends compared runs
REPLAY_SUFFIX = "-replay"  # `vtrace-replay`: a run name, so no '+' (run.name allows letters, digits, . _ -)
CONFIDENCE = 0.95
IQM_TRIM = 0.25  # the interquartile mean drops int(0.25 n) of the n values from each end (scipy's trim_mean)
BOOTSTRAP_RESAMPLES = 2000  # resamples of the seeds per bootstrap interval (rliable's default is 50,000)
BOOTSTRAP_SEED = 0  # every interval starts a generator of its own from this seed: same scores, same interval
# Per-seed scores: the summary holds their mean, its interval's half-width and the values themselves.
SCORES = ("final_score", "score_at_equal_wall_clock", "score_at_equal_agent_steps", "final_eval_score")


def actor_counts(cores: int) -> list[int]:
    """1, 2, 4, ... up to `cores` (and `cores` itself): the actor counts of the actors study."""
    counts = [1]
    while counts[-1] * 2 <= cores:
        counts.append(counts[-1] * 2)
    return counts + ([cores] if counts[-1] != cores else [])


def plan(study: str, lag: int, only: list[str] | None = None, actors: list[int] = (1, 2, 4),
         replay_fraction: float | None = None) -> dict[str, list[str]]:
    """Variant name -> config overrides (`section.key=value`) for `study`, limited to the variants in
    `only` (in the study's order) where given; `actors`: the actor counts of the actors study (variants
    `actors<N>`); `replay_fraction`: corrections study only, each correction is followed by
    `<correction>-replay`, the same with `learner.replay_fraction=replay_fraction` (the share of each
    batch drawn from replayed unrolls). Raises ValueError for an unknown study or variant, or a
    replay fraction for another study."""
    if replay_fraction is not None and study != "corrections":
        raise ValueError(f"--replay belongs to the corrections study (IMPALA's Table 2), not to {study!r}")
    if study == "actors":
        variants = {f"actors{n}": ["learner.algo=impala", "league.enabled=false", f"actor.num_actors={n}"]
                    for n in actors}
    elif study == "algos":
        variants = {"impala": ["learner.algo=impala", "league.enabled=false"],
                    "a3c": ["learner.algo=a3c", "league.enabled=false"]}
    elif study == "corrections":
        variants = {}
        for c in CORRECTIONS:  # with replay right after without: the table shows them side by side
            variants[c] = ["learner.algo=impala", "league.enabled=false", f"learner.correction={c}",
                           f"actor.weight_delay={lag}"]
            if replay_fraction is not None:
                variants[c + REPLAY_SUFFIX] = [*variants[c], f"learner.replay_fraction={replay_fraction}"]
    else:
        raise ValueError(f"unknown study {study!r}; choose one of {', '.join(STUDIES)}")
    unknown = sorted(set(only or ()) - set(variants))
    if unknown:
        raise ValueError(f"--variants {' '.join(unknown)}: the {study} study has {', '.join(variants)}")
    return {name: o for name, o in variants.items() if not only or name in only}


def train_command(config: str, run_dir: Path, overrides: list[str], seed: int, minutes: float,
                  agent_steps: int | None, redis_url: str | None) -> list[str]:
    """The `run.py train` command of one compared run (no final evaluation, wandb as configured)."""
    sets = [f"run.dir={run_dir.parent}", f"run.name={run_dir.name}", f"run.seed={seed}",
            f"run.max_minutes={minutes}", f"run.total_agent_steps={agent_steps or UNLIMITED_AGENT_STEPS}", *overrides]
    cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", str(config), "--eval-games", "0"]
    for item in sets:
        cmd += ["--set", item]
    return cmd + (["--redis-url", redis_url] if redis_url else [])


def score_at(run: Run, key: str, *, seconds: float | None = None, agent_steps: float | None = None) -> float | None:
    """Mean of `key` over the last SMOOTH records at or before `seconds` of wall clock (or `agent_steps`
    agent steps trained); None when no record has it by then. Without a limit: at the end of the run."""
    rows = [r for r in run.records if key in r
            and (seconds is None or run.elapsed(r) <= seconds + 1e-9)
            and (agent_steps is None or r["agent_steps_trained"] <= agent_steps)]
    return float(np.mean([r[key] for r in rows[-SMOOTH:]])) if rows else None


def run_summary(run: Run, key: str | None, equal_seconds: float, equal_agent_steps: float) -> dict:
    """One run's row: mean SPS over its records, agent steps trained and seconds at its end, and scores."""
    recs = run.records
    return {
        "run": run.name,
        "seed": run.config.run.seed,
        "sps": float(np.mean([r["sps"] for r in recs])) if recs else None,
        "agent_steps_trained": int(recs[-1]["agent_steps_trained"]) if recs else 0,
        "wall_s": run.elapsed(recs[-1]) if recs else 0.0,
        "policy_lag": float(np.nanmean([r["policy_lag"] if r.get("policy_lag") is not None else np.nan for r in recs]))
        if recs else None,
        "final_score": score_at(run, key) if key else None,
        "score_at_equal_wall_clock": score_at(run, key, seconds=equal_seconds) if key else None,
        "score_at_equal_agent_steps": score_at(run, key, agent_steps=equal_agent_steps) if key else None,
        "final_eval_score": _final_eval_score(run.path),
    }


def _final_eval_score(run_dir: Path) -> float | None:
    """The score of `final_eval.json` (see `final_evaluation`), if the run has one."""
    path = run_dir / FINAL_EVAL
    return float(json.loads(path.read_text())["score"]) if path.is_file() else None


def final_evaluation(run_dir: Path, opponent: str, games: int) -> float | None:
    """Greedy final checkpoint of a multi-seat game against the bot `opponent`, `games` per seat;
    writes `final_eval.json` and returns the score (wins + draws / 2 over all games). None for a
    single-seat env or a run without a checkpoint."""
    from impala_league.agents.policy import load_policy
    from impala_league.evaluation.evaluate import evaluate

    checkpoint = run_dir / "checkpoints" / "latest.safetensors"
    if not checkpoint.is_file():
        return None
    policy = load_policy(checkpoint)
    if len(policy.spec.seats) < 2:
        return None
    result = evaluate(policy, opponent, games)
    score = float(np.mean([r["win_rate"] + 0.5 * r["draw_rate"] for r in result["seats"].values()]))
    (run_dir / FINAL_EVAL).write_text(json.dumps({"opponent": opponent, "games_per_seat": games, "score": score,
                                                  "seats": result["seats"]}, indent=2) + "\n")
    return score


def _mean(values: list) -> float | None:
    present = [v for v in values if v is not None]
    return float(np.mean(present)) if present else None


def _check_finite(values, caller: str) -> None:
    """Raise ValueError where a value is NaN or infinite: a statistic over seeds would be meaningless."""
    bad = [i for i, v in enumerate(values) if not math.isfinite(v)]
    if bad:
        raise ValueError(f"{caller}: value {bad[0]} ({values[bad[0]]}) is not finite; leave that seed out "
                         "(`finite_seeds`)")


def finite_seeds(per_seed: list[float | None], seeds: list | None = None) -> tuple[list[float], list]:
    """The values of `per_seed` (one per seed, None where a seed had none) that every statistic over seeds
    uses: the finite ones; and the seeds left out, whose value is NaN or infinite (named by `seeds`, in the
    order of `per_seed`; by position without it)."""
    names = list(range(len(per_seed))) if seeds is None else list(seeds)
    used = [v for v in per_seed if v is not None and math.isfinite(v)]
    return used, [names[i] for i, v in enumerate(per_seed) if v is not None and not math.isfinite(v)]


def mean_and_interval(values: list[float | None]) -> tuple[float | None, float | None]:
    """Mean over the seeds of the values present (None: that seed had no score) and the half-width of
    its CONFIDENCE interval, Student t with n - 1 degrees of freedom: t(0.975, n - 1) * s / sqrt(n),
    s the sample standard deviation. The half-width is None below two values (no spread to measure).
    Raises ValueError for a value that is not finite (`finite_seeds` leaves such seeds out)."""
    present = [v for v in values if v is not None]
    _check_finite(present, "mean_and_interval")
    if not present:
        return None, None
    mean = float(np.mean(present))
    if len(present) < 2:
        return mean, None
    from scipy import stats  # here, not at the top: it takes a second to import, and only summaries need it

    t = stats.t.ppf(0.5 + CONFIDENCE / 2, len(present) - 1)
    return mean, float(t * np.std(present, ddof=1) / np.sqrt(len(present)))


def iqm(values) -> np.ndarray:
    """Interquartile mean (IQM, Agarwal et al. 2021; rliable's `metrics.aggregate_iqm`, which is scipy's
    `trim_mean(values, 0.25)`) over the last axis of `values` (float [..., n], e.g. [resamples, seeds]):
    sort, drop int(IQM_TRIM * n) values from each end, average the rest. [1, 2, 3, 4, 100] -> the mean
    of 2, 3, 4 = 3. Below four values nothing is dropped: the IQM is the mean. Returns float [...].
    It partitions rather than sorts, as scipy does, so that the sum runs in scipy's order: the same
    float to the last bit."""
    values = np.asarray(values, dtype=float)
    n = values.shape[-1]
    cut = int(IQM_TRIM * n)
    return np.partition(values, (cut, n - cut - 1), axis=-1)[..., cut:n - cut].mean(axis=-1)


def bootstrap_interval(values: list[float], statistic=iqm, resamples: int = BOOTSTRAP_RESAMPLES,
                       confidence: float = CONFIDENCE, rng=None) -> tuple[float, float] | None:
    """The `confidence` percentile bootstrap interval of `statistic` over runs, (low, high).

    values: the score of each run (seed), float [n]. statistic: float [resamples, n] -> float
    [resamples] (default `iqm`). `resamples` times, draw n runs with replacement; apply `statistic`
    to each resample; return the (1 - confidence) / 2 and (1 + confidence) / 2 percentiles of the
    results (numpy's linear interpolation). This is rliable's `library.get_interval_estimates(...,
    method="percentile")` on an [n runs, 1 task] matrix: its stratified bootstrap resamples runs
    within each task, and a variant of a comparison is one task (the config's game), so it is a
    plain bootstrap over seeds. rng: a numpy generator (anything with `choice`); default
    `np.random.default_rng(BOOTSTRAP_SEED)`, new for every call. `np.random.RandomState(s)` draws
    the indices rliable draws after `np.random.seed(s)`. None below two values (one run: nothing
    to resample). Raises ValueError for a value that is not finite (`finite_seeds` leaves them out)."""
    x = np.asarray(values, dtype=float)
    _check_finite(x.tolist(), "bootstrap_interval")
    if x.size < 2:
        return None
    rng = np.random.default_rng(BOOTSTRAP_SEED) if rng is None else rng
    results = statistic(x[rng.choice(x.size, size=(resamples, x.size))])
    low, high = np.percentile(results, [50 * (1 - confidence), 50 * (1 + confidence)])
    return float(low), float(high)


def score_statistics(per_seed: list[float | None], seeds: list | None = None) -> dict:
    """A score over seeds (`per_seed`: one value per seed, None where that seed had none; `seeds`: their
    names, see `finite_seeds`): `mean` and `ci95` (the Student-t half-width, see `mean_and_interval`),
    `seeds` (how many had a finite value: those counted), `iqm` and `iqm_ci95` ([low, high], see
    `bootstrap_interval`; None below two seeds), `left_out` (the seeds whose value is NaN or infinite)."""
    present, left_out = finite_seeds(per_seed, seeds)
    mean, half = mean_and_interval(present)
    interval = bootstrap_interval(present)
    return {"mean": mean, "ci95": half, "seeds": len(present), "iqm": float(iqm(present)) if present else None,
            "iqm_ci95": list(interval) if interval else None, "left_out": left_out}


def add_score(variant: dict, key: str, per_seed: list[float | None]) -> None:
    """Put a score over seeds into a variant's row of a summary: `key` (the mean over the seeds with a
    value), `<key>_ci95`, `<key>_seeds`, `<key>_iqm`, `<key>_iqm_ci95`, `<key>_left_out` (see
    `score_statistics`; the seeds named as in the row's `seeds`) and `<key>_per_seed` (`per_seed` as
    given, None where a seed had no value)."""
    stats = score_statistics(per_seed, variant.get("seeds"))
    variant[key] = stats.pop("mean")
    variant.update({f"{key}_{k}": value for k, value in stats.items()})
    variant[f"{key}_per_seed"] = per_seed


def aggregate_curve(curves: list[tuple[list[float], list[float]]], points: int = 100
                    ) -> tuple[np.ndarray, np.ndarray] | None:
    """The IQM over seeds of learning curves that were recorded at different x: each curve (xs
    increasing, ys) is interpolated linearly onto `points` evenly spaced x from the largest first x
    to the smallest last x (where every seed has a value), then `iqm` is taken over the seeds at
    each x. Returns (x float [points], IQM float [points]); None for no curve or no common range."""
    curves = [(xs, ys) for xs, ys in curves if len(xs)]
    if not curves:
        return None
    low, high = max(xs[0] for xs, _ in curves), min(xs[-1] for xs, _ in curves)
    if high < low:
        return None
    grid = np.linspace(low, high, points)
    return grid, iqm(np.stack([np.interp(grid, xs, ys) for xs, ys in curves], axis=-1))


def summarize(runs: dict[str, list[Run]], metric: str = "auto") -> dict:
    """The comparison of `runs` (variant -> its runs, one per seed).

    Equal wall clock = the shortest run's last record (seconds from its start); equal agent steps = the
    fewest agent steps any run reached. Variant rows are means over seeds; `sps_ratio` divides each
    variant's SPS by the first variant's. Each score of SCORES (its mean over seeds) also has
    `<score>_ci95` (the half-width of its 95% Student-t interval, see `mean_and_interval`),
    `<score>_seeds` (the seeds with a value), `<score>_iqm` and `<score>_iqm_ci95` (the interquartile
    mean and its 95% bootstrap interval [low, high], see `score_statistics`) and `<score>_per_seed`
    (in the order of `seeds`). `statistics` says how the intervals were computed.
    """
    every = [r for rs in runs.values() for r in rs]
    key = score_key([rec for r in every for rec in r.records], metric)
    with_records = [r for r in every if r.records]
    equal_seconds = min((r.elapsed(r.records[-1]) for r in with_records), default=0.0)
    equal_agent_steps = min((r.records[-1]["agent_steps_trained"] for r in with_records), default=0)
    variants = {}
    for name, rs in runs.items():
        rows = [run_summary(r, key, equal_seconds, equal_agent_steps) for r in rs]
        variants[name] = {field: _mean([row[field] for row in rows]) for field in
                          ("sps", "agent_steps_trained", "wall_s", "policy_lag")}
        variants[name]["seeds"] = [row["seed"] for row in rows]
        for field in SCORES:
            add_score(variants[name], field, [row[field] for row in rows])
        variants[name]["runs"] = rows
    first = next(iter(variants.values()), {}).get("sps")
    for v in variants.values():
        v["sps_ratio"] = v["sps"] / first if v["sps"] is not None and first else None
    return {"metric": key, "equal_wall_clock_s": equal_seconds, "equal_agent_steps": equal_agent_steps,
            "variants": variants,
            "statistics": {"confidence": CONFIDENCE, "mean_interval": "Student t, n - 1 degrees of freedom",
                           "iqm_trim": IQM_TRIM, "iqm_interval": "percentile bootstrap over seeds",
                           "bootstrap_resamples": BOOTSTRAP_RESAMPLES, "bootstrap_seed": BOOTSTRAP_SEED}}


# (key, title, format); format None: a score of SCORES, shown as `mean ± half-width` (see `cell`).
COLUMNS = [("sps", "SPS", "{:.0f}"), ("sps_ratio", "SPS ratio", "{:.2f}"),
           ("agent_steps_trained", "agent steps trained", "{:,.0f}"),
           ("policy_lag", "policy lag", "{:.1f}"), ("final_score", "final score", None),
           ("score_at_equal_wall_clock", "score at equal wall clock", None),
           ("score_at_equal_agent_steps", "score at equal agent steps", None),
           ("final_eval_score", "final score vs bot", None)]
INTERVAL_NOTE = (f"Scores are means over seeds ± the half-width of the {CONFIDENCE:.0%} confidence interval of "
                 "the mean (Student t with n - 1 degrees of freedom, n = the seeds with a score); `(one run)`: a "
                 "score from one seed, no interval; `(n of N seeds)`: some seeds had no score.")
# The table of every score over seeds (`seeds_rows`): its header, and what its columns are.
SEEDS_HEADER = ("variant", "score", "seeds", "mean ± t 95%", "IQM", "IQM 95% bootstrap interval", "per seed")
SEEDS_NOTE = (f"IQM: the interquartile mean over seeds (about the middle half: int(n/4) of the n values dropped from "
              f"each end; below four seeds, the mean). Its interval: {CONFIDENCE:.0%} percentile bootstrap over "
              f"seeds ({BOOTSTRAP_RESAMPLES:,} resamples of the seeds with replacement, generator seeded "
              f"{BOOTSTRAP_SEED}; rliable's stratified bootstrap with one task). Per seed: in the order of the "
              "study's seeds, `-` where a seed had no score. One seed is one run: no interval.")


def _decimals(*numbers: float | None) -> int:
    """Decimals for numbers of the size of the largest of `numbers`: none from 100 up, one from 10,
    else three (returns of 117 and win rates of 0.512 both read well)."""
    size = max((abs(x) for x in numbers if x is not None), default=0.0)
    return 0 if size >= 100 else 1 if size >= 10 else 3


def score_text(mean: float, half: float | None, digits: int | None = None) -> str:
    """`mean ± half`, both with `digits` decimals (default: those the larger of the two calls for, see
    `_decimals`); `mean (one run)` without an interval (one seed had a score)."""
    digits = _decimals(mean, half) if digits is None else digits
    return f"{mean:.{digits}f} " + ("(one run)" if half is None else f"± {half:.{digits}f}")


def seeds_text(per_seed: list[float | None], digits: int | None = None) -> str:
    """A value over seeds as one table cell: `score_text` of the values present (`mean_and_interval`),
    then each seed's value, `-` where a seed had none: [1.0, 0.98, None] -> `0.990 ± 0.127 (1.000, 0.980, -)`.
    One seed reads `0.500 (one run)`; `none` when no seed has a value. A NaN or infinite value is shown
    but left out of the mean (`finite_seeds`). digits: as in `score_text`."""
    present = finite_seeds(per_seed)[0]
    if not present:
        return "none"
    mean, half = mean_and_interval(present)
    if len(per_seed) == 1:
        return score_text(mean, None, digits)
    digits = _decimals(mean, half) if digits is None else digits
    return score_text(mean, half, digits) + " (" + ", ".join("-" if v is None else f"{v:.{digits}f}"
                                                            for v in per_seed) + ")"


def cell(variant: dict, key: str, fmt: str | None) -> str:
    """The text of column `key` (format `fmt`, see COLUMNS) in a variant's row of a summary; '-' when
    it has no value; a score from fewer seeds than the row's runs says how many."""
    value = variant.get(key)
    if value is None:
        return "-"
    if fmt is not None:
        return fmt.format(value)
    if f"{key}_ci95" not in variant:  # a compare.json written before the intervals: the mean alone
        return f"{value:.3f}"
    seeds, runs = variant.get(f"{key}_seeds"), len(variant.get("runs", ()))
    return score_text(value, variant[f"{key}_ci95"]) + (f" ({seeds} of {runs} seeds)" if seeds and 1 < seeds < runs
                                                        else "")


def seeds_rows(summary: dict) -> list[list[str]]:
    """The cells of the table of every score over seeds (columns SEEDS_HEADER): one row per variant
    and score of SCORES, then of the study's own scores (`summary["extra_scores"]`, key -> title: the
    league study's judges and Elo), that some seed has; the seeds counted are those with a value. A
    score from one seed says "one run" and has no interval. None of a compare.json written before the IQM."""
    titles = {**{key: title for key, title, _ in COLUMNS}, **summary.get("extra_scores", {})}
    rows = []
    for name, v in summary["variants"].items():
        for key in [*SCORES, *summary.get("extra_scores", {})]:
            if v.get(f"{key}_iqm") is None:
                continue
            mean, half, centre, interval = v[key], v[f"{key}_ci95"], v[f"{key}_iqm"], v[f"{key}_iqm_ci95"]
            digits = _decimals(mean, half, centre, *(interval or ()))
            number = f"{{:.{digits}f}}".format
            left_out = v.get(f"{key}_left_out") or []
            counted = str(v[f"{key}_seeds"]) + (f" (seed{'s' if len(left_out) > 1 else ''} "
                                                f"{', '.join(map(str, left_out))} left out: not finite)"
                                                if left_out else "")
            rows.append([name, titles[key], counted,
                         number(mean) + (" (one run)" if half is None else f" ± {number(half)}"), number(centre),
                         "one run: none" if interval is None else f"[{number(interval[0])}, {number(interval[1])}]",
                         ", ".join("-" if x is None else number(x) for x in v[f"{key}_per_seed"])])
    return rows


def markdown_table(summary: dict) -> str:
    """The variants as a markdown table, with a line saying what the score, the interval and the equal
    points are; with replay variants also the final scores in Table 2's layout (see `replay_table`);
    then every score over seeds (mean ± t, IQM and its bootstrap interval, per seed; `seeds_rows`)."""
    head = "| variant | seeds | " + " | ".join(title for _, title, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]
    for name, v in summary["variants"].items():
        cells = [cell(v, k, fmt) for k, _, fmt in COLUMNS]
        lines.append(f"| {name} | {len(v['runs'])} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append(f"Score: `{summary['metric'] or 'none recorded'}` from metrics.jsonl, mean of the last {SMOOTH} "
                 f"records up to the point; equal wall clock = {summary['equal_wall_clock_s']:.0f} s, equal agent "
                 f"steps = {summary['equal_agent_steps']:,}. {INTERVAL_NOTE}"
                 + (f" Final score vs bot: the last checkpoint, greedy, against {summary['eval_opponent']}, wins "
                    "+ draws / 2 in both seats." if summary.get("eval_opponent") else ""))
    pairs = replay_table(summary)
    lines += ([""] + pairs) if pairs else []
    seeds = seeds_rows(summary)
    if seeds:
        lines += ["", "| " + " | ".join(SEEDS_HEADER) + " |", "|" + "---|" * len(SEEDS_HEADER)]
        lines += ["| " + " | ".join(row) + " |" for row in seeds] + ["", SEEDS_NOTE]
    return "\n".join(lines) + "\n"


def replay_table(summary: dict) -> list[str]:
    """The final score of each correction without and with replay, one row per correction (the layout
    of the paper's Table 2), as markdown lines; none when the summary has no `<variant>-replay`."""
    rows = [(name, v, summary["variants"].get(name + REPLAY_SUFFIX)) for name, v in summary["variants"].items()
            if not name.endswith(REPLAY_SUFFIX)]
    if not any(replayed for _, _, replayed in rows):
        return []
    fraction = summary.get("replay_fraction")
    lines = ["| correction | final score, no replay | final score, with replay"
             + (f" ({fraction:.0%} of each batch replayed)" if fraction is not None else "") + " |",
             "|---|---|---|"]
    for name, v, replayed in rows:
        lines.append(f"| {name} | {cell(v, 'final_score', None)} | "
                     f"{'-' if replayed is None else cell(replayed, 'final_score', None)} |")
    return lines


def plot_curves(runs: dict[str, list[Run]], key: str | None, out: Path) -> list[Path]:
    """Learning curves (`key` against wall-clock seconds and against agent steps trained), one line per run,
    one colour per variant; PNG files in `out`. Returns their paths (none without a metric)."""
    if key is None:
        return []
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    paths = []
    for axis, label, fname in (("time", "wall clock (s)", "curves_wall_clock.png"),
                               ("agent_steps_trained", "agent steps trained", "curves_agent_steps.png")):
        fig, ax = plt.subplots(figsize=(7, 4))
        for k, (name, rs) in enumerate(runs.items()):
            for j, run in enumerate(rs):
                recs = [r for r in run.records if key in r]
                xs = [run.elapsed(r) if axis == "time" else r["agent_steps_trained"] for r in recs]
                ax.plot(xs, [r[key] for r in recs], ".-", color=f"C{k}", alpha=0.9, label=name if j == 0 else None)
        ax.set_xlabel(label)
        ax.set_ylabel(key)
        ax.set_title(f"{key} against {label}")
        ax.grid(alpha=0.3)
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / fname, dpi=100)
        plt.close(fig)
        paths.append(out / fname)
    return paths


SEEDS_PLOT = "curves_seeds.png"


def plot_seed_curves(runs: dict[str, list[Run]], key: str | None, out: Path) -> Path | None:
    """SEEDS_PLOT in `out`: one panel per variant, `key` against agent steps trained, a thin line per
    seed and in bold their IQM over seeds (`aggregate_curve`) where the seeds overlap; a variant with
    one seed is titled "one run". None without a metric or a record of it."""
    curves = {name: [([r["agent_steps_trained"] for r in run.records if key in r],
                      [r[key] for r in run.records if key in r]) for run in rs]
              for name, rs in runs.items()} if key else {}
    if not any(xs for seeds in curves.values() for xs, _ in seeds):
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    columns = min(len(curves), 4)
    rows = -(-len(curves) // columns)
    fig, axes = plt.subplots(rows, columns, figsize=(3.5 * columns, 3 * rows), sharey=True, squeeze=False)
    for k, (ax, (name, seeds)) in enumerate(zip(axes.flat, curves.items())):
        for xs, ys in seeds:
            ax.plot(xs, ys, "-", color=f"C{k}", alpha=0.5, linewidth=0.8 if len(seeds) > 1 else 1.5)
        middle = aggregate_curve(seeds) if len(seeds) > 1 else None
        if middle is not None:
            ax.plot(*middle, "-", color=f"C{k}", linewidth=2.5, label=f"IQM of {len(seeds)} seeds")
            ax.legend(fontsize="small")
        ax.set_title(f"{name}: " + ("one run" if len(seeds) == 1 else f"{len(seeds)} seeds"))
        ax.set_xlabel("agent steps trained")
        ax.grid(alpha=0.3)
    for ax in axes.flat[len(curves):]:
        ax.set_visible(False)
    for ax in axes[:, 0]:
        ax.set_ylabel(key)
    fig.suptitle(f"{key}: every seed (thin) and their IQM (bold)")
    fig.tight_layout()
    fig.savefig(out / SEEDS_PLOT, dpi=100)
    plt.close(fig)
    return out / SEEDS_PLOT


def plot_sps_against_actors(summary: dict, out: Path) -> Path | None:
    """sps_vs_actors.png: learner-consumed SPS (mean over seeds) against the actor count of each
    variant (`summary["actors"]`: variant -> count), beside linear scaling from the fewest actors."""
    points = sorted((summary["actors"][name], v["sps"]) for name, v in summary["variants"].items()
                    if v["sps"] is not None and name in summary.get("actors", {}))
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    xs, ys = zip(*points)
    fig, ax = plt.subplots(figsize=(7, 4))
    ax.plot(xs, ys, "o-", label="learner-consumed SPS")
    ax.plot(xs, [ys[0] * x / xs[0] for x in xs], "--", color="grey", label=f"linear from {xs[0]} actor(s)")
    ax.set_xscale("log", base=2)
    ax.set_xticks(xs, [str(x) for x in xs])
    ax.set_xlabel("actor processes")
    ax.set_ylabel("agent steps trained per second")
    ax.set_title("SPS against actors")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "sps_vs_actors.png", dpi=100)
    plt.close(fig)
    return out / "sps_vs_actors.png"


def write_outputs(runs: dict[str, list[Run]], out: Path, metric: str = "auto", meta: dict | None = None) -> dict:
    """compare.json, compare.md and the curve PNGs in `out` (the score against wall clock and agent steps trained,
    every seed's curve per variant; with `meta["actors"]`, variant -> actor count, also the
    SPS-against-actors plot); returns the summary."""
    summary = summarize(runs, metric)
    summary.update(meta or {})
    scaling = plot_sps_against_actors(summary, out) if summary.get("actors") else None
    seeds = plot_seed_curves(runs, summary["metric"], out)
    summary["plots"] = [p.name for p in [*([scaling] if scaling else []), *plot_curves(runs, summary["metric"], out),
                                         *([seeds] if seeds else [])]]
    (out / "compare.json").write_text(json.dumps(summary, indent=2) + "\n")
    (out / "compare.md").write_text(markdown_table(summary), encoding="utf-8")  # the ± of the scores
    return summary


def train_variants(config: str, variants: dict[str, list[str]], out: Path, seeds: list[int], minutes: float,
                   agent_steps: int | None, extra: list[str], redis_url: str | None,
                   after=None) -> dict[str, list[Run]]:
    """Train every variant (name -> overrides, applied after `extra`) x seed one after another, each a
    `run.py train` run of `minutes` of wall clock (or `agent_steps` agent steps) in `out/<variant>-seed<seed>`
    with its log beside it; `after(run_dir)`, where given, runs once a run has finished. Returns
    variant -> its runs that finished, in seed order (variants without one left out). A run that fails
    is reported and left out; all failing is a RuntimeError."""
    out.mkdir(parents=True, exist_ok=True)
    runs: dict[str, list[Run]] = {name: [] for name in variants}
    for seed in seeds:
        for name, overrides in variants.items():
            run_dir = out / f"{name}-seed{seed}"
            cmd = train_command(config, run_dir, [*extra, *overrides], seed, minutes, agent_steps, redis_url)
            log.info("%s, seed %d: %s", name, seed, " ".join(cmd[1:]))
            start = time.time()
            with (out / f"{run_dir.name}.log").open("w") as output:
                code = subprocess.run(cmd, stdout=output, stderr=subprocess.STDOUT, cwd=REPO).returncode
            if code != 0 or not (run_dir / "config.yaml").is_file():
                log.error("%s, seed %d failed (exit code %d); see %s", name, seed, code, out / f"{run_dir.name}.log")
                continue
            (run_dir / "started").write_text(f"{start}\n")
            if after is not None:
                after(run_dir)
            runs[name].append(load_run(run_dir))
    runs = {name: rs for name, rs in runs.items() if rs}
    if not runs:
        raise RuntimeError(f"every run of the study failed; see the logs in {out}")
    return runs


def run_study(config: str, study: str, variants: dict[str, list[str]], out: Path, seeds: list[int],
              minutes: float, agent_steps: int | None, lag: int, extra: list[str], redis_url: str | None,
              metric: str = "auto", eval_opponent: str | None = "tactical", eval_games: int = 100,
              replay_fraction: float | None = None) -> dict:
    """Train every variant of `study` (name -> overrides, see `plan`; `replay_fraction` as given to it,
    for the table) x seed one after another (`train_variants`: each `minutes` of wall clock, or
    `agent_steps`), then evaluate each final checkpoint of a multi-seat game against `eval_opponent`
    (`eval_games` per seat; 0 = no evaluation) and write the outputs. A run that fails is reported and
    left out; all failing is a RuntimeError."""
    after = (lambda run_dir: final_evaluation(run_dir, eval_opponent, eval_games)) if eval_games else None
    runs = train_variants(config, variants, out, seeds, minutes, agent_steps, extra, redis_url, after)
    return write_outputs(runs, out, metric, {"study": study, "config": str(config), "seeds": seeds,
                                              "minutes": minutes, "lag": lag if study == "corrections" else None,
                                              "replay_fraction": replay_fraction,
                                              "eval_opponent": eval_opponent if eval_games else None,
                                              **({"actors": {name: int(name.removeprefix("actors")) for name in runs}}
                                                 if study == "actors" else {})})
