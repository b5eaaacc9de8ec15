"""Actor identity and seeds: one process per actor id in a run (real Redis, a real `run.py actor`
refused), and every random stream spawned from one SeedSequence, so no two envs, actors, restarts or
runs replay each other's episodes."""

from __future__ import annotations

import os
import subprocess
import sys

import gymnasium
import numpy as np

from impala_league import REPO
from impala_league.config import load_config
from impala_league.distributed.wire import keys
from impala_league.distributed.actor import Actor, ActorSeeds

from impala_league.envs.base import EpisodeSeeds


def _episode_seeds(run_seed: int, actor_id: int, start: int, envs: int, episodes: int) -> list[int]:
    seeds = ActorSeeds.spawn(run_seed, actor_id, start, envs)
    return [EpisodeSeeds(env)(k) for env in seeds.envs for k in range(episodes)]


def test_many_actors_envs_episodes_and_restarts_get_distinct_seeds():
    """The scheme this replaced (seed + 1000 (id + 1), then * 100003 + 7919 env + episode) overlapped
    within one run: env 0's episode 7919 was env 1's first."""
    seeds = [s for actor_id in range(48) for start in (0, 1)
             for s in _episode_seeds(0, actor_id, start, envs=16, episodes=40)]
    assert len(seeds) == 48 * 2 * 16 * 40
    assert len(set(seeds)) == len(seeds)
    assert all(0 <= s < 2**63 for s in seeds)


def test_runs_whose_seeds_differ_by_a_round_number_share_no_env_seed():
    """Before, an actor's seed was run.seed + 1000 (id + 1): run.seed 1000's actor 0 was run.seed 0's actor 1."""
    base = set(s for actor_id in range(8) for s in _episode_seeds(0, actor_id, 0, envs=8, episodes=50))
    for other in (1, 10, 1000, 10_000, 1_000_000):
        seeds = set(s for actor_id in range(8) for s in _episode_seeds(other, actor_id, 0, envs=8, episodes=50))
        assert not base & seeds, f"run.seed {other} shares env seeds with run.seed 0"


def test_episode_seeds_from_an_int_are_consecutive():
    """Evaluation and replays name a game by its seed: game k of seed s is s + k."""
    assert [EpisodeSeeds(17)(k) for k in range(3)] == [17, 18, 19]


def _config(run_name, tmp_path, *extra):
    return load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "env.name=gym:CartPole-v1",
                              "agent.torso=mlp", "agent.hidden=16", "actor.num_envs=4", *extra])


def test_an_actor_seeds_its_envs_from_its_identity(tmp_path, redis_url, run_name):
    """Run seeds 0 and 1000 and actor ids 1 and 0 (identical actors before); each env really is reset
    with the seeds its SeedSequence gives."""
    a = Actor(_config(run_name, tmp_path, "run.seed=0"), redis_url, 1)
    b = Actor(_config(run_name + "-b", tmp_path, "run.seed=1000"), redis_url, 0)
    try:
        seeds_a = {env.seeds(k) for env in a.envs for k in range(100)}
        seeds_b = {env.seeds(k) for env in b.envs for k in range(100)}
        assert len(seeds_a) == len(seeds_b) == 400 and not seeds_a & seeds_b
        # Root: run.seed's sequence, child (actor id, start); its child 0 holds the envs.
        assert [(e.entropy, e.spawn_key) for e in a.seeds.envs] == [(0, (1, 0, 0, i)) for i in range(4)]
        assert [(e.entropy, e.spawn_key) for e in b.seeds.envs] == [(1000, (0, 0, 0, i)) for i in range(4)]
        assert a.seeds.actions != b.seeds.actions and a.seeds.bots != b.seeds.bots
        # The first observation of each env is CartPole's reset with the seed of its episode 0.
        for env in a.envs:
            expected, _ = gymnasium.make("CartPole-v1").reset(seed=env.seeds(0))
            np.testing.assert_array_equal(env.advance().observations[0], expected)
        assert len({tuple(env.advance().observations[0]) for env in a.envs}) == 4
    finally:
        a.close()
        b.close()


def test_an_actor_id_is_one_process_s_and_a_taken_one_is_refused(tmp_path, redis_url, redis_client, run_name):
    cfg = _config(run_name, tmp_path)
    first = Actor(cfg, redis_url, 0)
    auto = Actor(cfg, redis_url)  # no id asked for: the lowest free one
    try:
        assert (first.actor_id, first.start) == (0, 0)
        assert (auto.actor_id, auto.start) == (1, 0)
        holder = redis_client.get(keys.actor_id(run_name, 0)).decode()
        assert f"pid {os.getpid()} ({first.token})" in holder
        # A second actor asking for id 0 waits one lease TTL for it, then is refused, naming the holder
        # (its TTL set to 1 s: the wait is 2 s, not 11; the first's lease, refreshed, never lapses).
        proc = subprocess.run(
            [sys.executable, str(REPO / "run.py"), "actor", "--set", f"run.name={run_name}",
             "--set", "env.name=gym:CartPole-v1", "--set", "agent.torso=mlp", "--set", "actor.num_envs=1",
             "--set", "run.lease_ttl_s=1", "--actor-id", "0"],
            env=dict(os.environ, IMPALA_REDIS_URL=redis_url), cwd=REPO, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stderr
        assert f"actor id 0 of run '{run_name}' is taken by {holder}" in proc.stderr
        assert redis_client.get(keys.actor_id(run_name, 0)).decode() == holder  # the first keeps it
    finally:
        first.close()
    # Released: the id is free at once, and the next holder is another start with other seeds.
    again = Actor(cfg, redis_url, 0)
    try:
        assert (again.actor_id, again.start) == (0, 1)
        assert not ({env.seeds(0) for env in again.envs} & {env.seeds(0) for env in first.envs})
    finally:
        again.close()
        auto.close()
