"""Every Redis key of a run, named in one place (docs/architecture.md, "Keys", says what each holds).

Keys start with the run's name (`run`), a learner's namespace (`ns`: the run name for the main agent,
`{run}:{player}` for an exploiter; league.players.namespace), or a trajectory shard's prefix (`prefix`:
transport.shard_namespace, the namespace itself for shard 0). An id of "*" makes a SCAN pattern.
"""

from __future__ import annotations

PARAMS_PARTS = ("version", "agent_steps", "history", "history:versions", "sha256", "history:sha256", "corrupt",
                "replica_fallbacks")


def results(run: str) -> str:
    """The stream of finished episodes (transport.ResultsStream)."""
    return f"{run}:results"


def done(run: str) -> str:
    """Set by the main learner when the run is over."""
    return f"{run}:done"


def actor_id(run: str, actor: int | str) -> str:
    """The lease on actor id `actor` (its holder: `host pid N (token)`)."""
    return f"{run}:actor:{actor}"


def actor_starts(run: str, actor: int) -> str:
    """How many processes have taken actor id `actor` (each start's seeds differ: distributed/actor.py)."""
    return f"{actor_id(run, actor)}:starts"


def lease(ns: str, role: str) -> str:
    """The lease of the one process of `role` (learner, launcher, league) over `ns` (transport.LearnerLease)."""
    return f"{ns}:{role}"


def params(ns: str, part: str = "") -> str:
    """The learner's published weights (`part` ""), or one of their PARAMS_PARTS (distributed/wire/params.py)."""
    if part and part not in PARAMS_PARTS:
        raise ValueError(f"no weights key part {part!r}; one of {', '.join(PARAMS_PARTS)}")
    return f"{ns}:params" + (f":{part}" if part else "")


def stream(prefix: str, name: str = "traj") -> str:
    """A delivery stream of a shard: trajectories (`traj`), or A3C's gradients (`grads`)."""
    return f"{prefix}:{name}"


def stream_counter(stream_key: str, counter: str) -> str:
    """A stream's delivery counter: produced, trained, throttled or env_steps."""
    return f"{stream_key}:{counter}"


def deadletter(prefix: str, count: bool = False) -> str:
    """A shard's dead letters (malformed entries, with their reasons), or their count."""
    return f"{prefix}:deadletter" + (":count" if count else "")


def league(run: str, part: str, member: str = "") -> str:
    """The league's keys: `opponents` (a learner's opponent distribution), `snap` (a snapshot's weights),
    `reset` (a learner's reset count), each for `member` ("*": a pattern); `corrupt` (a count), `resident`
    (the set of snapshots whose weights Redis holds), `wanted` (snapshots actors asked to be loaded)."""
    return f"{run}:league:{part}" + (f":{member}" if member else "")
