"""Experience replay on the learner (distributed/learner/replay.py; IMPALA, Espeholt et al. 2018, Table 2 "with
replay"): the buffer keeps to its memory and evicts the oldest first; replayed unrolls are corrected with
their own behaviour policy; replay changes nothing of what is acked, counted or lost."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch

from impala_league.agents.core import forward_batch
from impala_league.config import ConfigError, load_config, replayed_per_batch
from impala_league.distributed.learner.replay import ReplayBuffer, unroll_nbytes
from impala_league.distributed.learner.role import Learner
from impala_league.distributed.wire.codec import UnrollSpec, decode_unrolls, encode_unrolls
from impala_league.distributed.wire.transport import GROUP, TrajectoryStream
from impala_league.envs.registry import env_spec
from impala_league.league.players import MAIN, metrics_path
from impala_league.losses.actor_critic import off_policy_targets
from tests.distributed.test_delivery import run_learner_until
from tests.distributed.test_faults import REPO, T, small_config, valid_unroll
from tests.distributed.test_vtrace import reference_vtrace


def sized_unroll(n: int, fill: int) -> dict[str, np.ndarray]:
    """An 'unroll' of n + 4 bytes: arrays of 1 and 4 bytes per element."""
    return {"obs": np.full(n, fill, np.uint8), "reward": np.full(1, fill, np.float32)}


# -- the buffer ------------------------------------------------------------------------------------

def test_the_buffer_keeps_to_its_memory_and_evicts_the_oldest_first():
    replay = ReplayBuffer(capacity_bytes=1000, seed=(0,))
    sizes = [300, 196, 400, 96, 250, 500, 10, 700, 96]  # bytes: n + 4
    held_after_each_add = [[0], [0, 1], [0, 1, 2], [1, 2, 3], [1, 2, 3, 4], [3, 4, 5], [3, 4, 5, 6], [6, 7],
                           [6, 7, 8]]
    for version, (n, held) in enumerate(zip(sizes, held_after_each_add)):
        replay.add(sized_unroll(n, version), policy_version=version)
        assert [r.policy_version for r in replay.items] == held
        assert replay.nbytes == sum(sizes[v] + 4 for v in held) <= 1000
        assert replay.nbytes == sum(unroll_nbytes(r.unroll) for r in replay.items)
    with pytest.raises(ValueError, match="does not fit"):
        replay.add(sized_unroll(997, 0), policy_version=9)
    assert [r.policy_version for r in replay.items] == [6, 7, 8]


def test_the_buffer_counts_and_keeps_copies_not_views_into_a_larger_buffer():
    entry = bytearray(1 << 20)  # like a decoded stream entry: arrays are views into its bytes
    view = np.ndarray((8,), np.float32, buffer=entry, offset=64)
    view[:] = 1.5
    replay = ReplayBuffer(capacity_bytes=64, seed=(0,))
    replay.add({"reward": view}, policy_version=3)
    (held,) = replay.sample(1)
    assert replay.nbytes == 32 and held.unroll["reward"].base is None
    view[:] = -7.0  # the entry's memory is reused: the replay's copy must not change
    np.testing.assert_array_equal(held.unroll["reward"], np.full(8, 1.5, np.float32))
    assert not held.unroll["reward"].flags.writeable


def test_sampling_draws_only_held_unrolls_without_repeats_and_is_reproducible():
    def filled(seed):
        replay = ReplayBuffer(capacity_bytes=10 * 14, seed=seed)  # 10 unrolls of 14 bytes
        for version in range(25):
            replay.add(sized_unroll(10, version), policy_version=version)
        return replay

    replay = filled((0, 0, 1))
    assert len(replay) == 10
    assert [r.policy_version for r in ReplayBuffer(100, seed=(0,)).sample(3)] == []
    draws = [[r.policy_version for r in replay.sample(4)] for _ in range(200)]
    for draw in draws:
        assert len(set(draw)) == 4 and set(draw) <= set(range(15, 25))
    counts = np.bincount(np.concatenate(draws), minlength=25)[15:]
    assert counts.min() > 50  # uniform: 80 expected per unroll
    assert sorted(r.policy_version for r in replay.sample(50)) == list(range(15, 25))  # all it holds
    again = filled((0, 0, 1))
    assert [[r.policy_version for r in again.sample(4)] for _ in range(200)] == draws
    other = filled((0, 1, 1))
    assert [[r.policy_version for r in other.sample(4)] for _ in range(200)] != draws


def test_each_learner_rank_and_player_draws_from_its_own_seeded_stream(tmp_path, redis_url, run_name):
    cfg = small_config(run_name, tmp_path, "learner.batch_size=4", "learner.replay_fraction=0.5")

    def draws(rank=0, player=MAIN):
        learner = Learner(cfg, redis_url, tmp_path / run_name, player=player, rank=rank)
        for version in range(20):
            learner.ingest.replay.add(valid_unroll(float(version)), policy_version=version)
        return [r.policy_version for _ in range(20) for r in learner.ingest.replay.sample(learner.ingest.replayed)]

    first = draws()
    assert draws() == first
    assert draws(rank=1) != first
    assert draws(player="main_exploiter_0") != first


# -- V-trace on a mixed batch ----------------------------------------------------------------------

def random_unroll(rng: np.random.Generator, logit_scale: float, truncate_at: int | None = None) -> dict:
    """A tic-tac-toe unroll with random boards, actions sampled from random behaviour logits of the
    given scale, random rewards and episode ends; `truncate_at`: that step ends by a time limit."""
    u = valid_unroll()
    u["obs"] = rng.integers(0, 2, u["obs"].shape).astype(u["obs"].dtype)
    u["behaviour_logits"] = (logit_scale * rng.standard_normal(u["behaviour_logits"].shape)).astype(np.float32)
    p = np.exp(u["behaviour_logits"] - u["behaviour_logits"].max(-1, keepdims=True))
    u["action"] = np.array([rng.choice(9, p=row / row.sum()) for row in p], np.int64)
    u["reward"] = rng.standard_normal(T).astype(np.float32)
    u["done"] = (rng.random(T) < 0.3).astype(np.uint8)
    u["final_obs"] = np.zeros((0, *u["obs"].shape[1:]), u["obs"].dtype)  # as decoded: [N, ...], N truncated steps
    if truncate_at is not None:
        u["done"][truncate_at] = u["truncated"][truncate_at] = 1
        u["final_obs"] = rng.integers(0, 2, (1, *u["obs"].shape[1:])).astype(u["obs"].dtype)
    return u


def log_softmax64(logits) -> np.ndarray:
    x = np.asarray(logits, np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


def test_replayed_unrolls_are_corrected_with_their_own_behaviour_policy(tmp_path, redis_url, run_name):
    """A batch of 2 fresh unrolls (peaked mu) and 2 replayed ones (near-uniform mu, one with a truncated
    step): the learner's V-trace targets equal a float64 eq. (1) computed per unroll from its own mu."""
    cfg = small_config(run_name, tmp_path, "learner.batch_size=4", "learner.replay_fraction=0.5",
                       "learner.clip_rho_threshold=2.0", "learner.lambda_=0.9")
    learner = Learner(cfg, redis_url, tmp_path / run_name)
    rng = np.random.default_rng(7)
    old = {7: random_unroll(rng, 0.2, truncate_at=1), 9: random_unroll(rng, 0.3)}
    for version, unroll in old.items():
        learner.ingest.replay.add(unroll, policy_version=version)
    fresh = [random_unroll(rng, 3.0), random_unroll(rng, 2.0)]
    # As the learner reads them: one stream entry of the two fresh unrolls.
    [(_, entry)] = decode_unrolls([encode_unrolls(fresh, unroll_id="f-0-0", policy_version=11, actor_id=0,
                                                  env="tictactoe")], learner.ingest.unroll_spec)
    prepared = learner.ingest.prepare([entry])
    assert prepared.batch.reward.shape == (T, 4) and sorted(prepared.replayed_versions) == [7, 9]
    columns = fresh + [old[v] for v in prepared.replayed_versions]

    with torch.no_grad():
        logits, values, final_values = forward_batch(learner.model, prepared.batch)
        got = off_policy_targets(logits, values, prepared.batch, cfg.learner, learner.head, final_values)
        final_v = {b: float(learner.model(torch.from_numpy(u["final_obs"]), torch.ones(1, 9))[1][0])
                   for b, u in enumerate(columns) if u["truncated"].any()}

    L, V = cfg.learner, values.double().numpy()
    log_rhos, discounts, rewards = np.zeros((T, 4)), np.zeros((T, 4)), np.zeros((T, 4))
    for b, u in enumerate(columns):
        steps = np.arange(T)
        log_pi = log_softmax64(logits[:-1, b].numpy())[steps, u["action"]]
        log_mu = log_softmax64(u["behaviour_logits"])[steps, u["action"]]  # this unroll's own mu
        log_rhos[:, b] = log_pi - log_mu
        discounts[:, b] = L.discount * (1 - u["done"])
        rewards[:, b] = u["reward"] + L.discount * u["truncated"] * final_v.get(b, 0.0)
    want_vs, want_pg = reference_vtrace(log_rhos, discounts, rewards, V[:-1], V[-1], L.clip_rho_threshold,
                                        L.clip_pg_rho_threshold, L.clip_c_threshold, L.lambda_)
    np.testing.assert_allclose(got.log_rhos.numpy(), log_rhos, rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(got.vs.numpy(), want_vs, rtol=1e-4, atol=1e-5)
    np.testing.assert_allclose(got.pg_advantages.numpy(), want_pg, rtol=1e-4, atol=1e-5)
    # The check has teeth: under another unroll's mu a replayed column's ratios would differ.
    steps, action = np.arange(T), columns[2]["action"]
    own_mu, other_mu = (log_softmax64(u["behaviour_logits"])[steps, action] for u in (columns[2], fresh[0]))
    assert np.abs(own_mu - other_mu).max() > 0.5


# -- end to end against Redis ----------------------------------------------------------------------

@pytest.mark.parametrize("per_entry", [1, 2])
def test_a_learner_with_replay_acks_every_unroll_once_and_counts_only_fresh_frames(tmp_path, redis_client,
                                                                                  redis_url, run_name, per_entry):
    """24 unrolls, B = 4 with replay_fraction 0.5: 2 fresh and up to 2 replayed per update, so 12
    updates, with one or two unrolls per stream entry. Every entry is acked once, the counts balance,
    agent steps count the fresh steps only, and the metrics carry the replay's keys."""
    N = 24
    cfg = small_config(run_name, tmp_path, "learner.batch_size=4", "learner.replay_fraction=0.5",
                       f"run.total_agent_steps={N * T}", "learner.replay_memory_mb=0.005", f"actor.send_batch={per_entry}")
    stream = TrajectoryStream(redis_client, run_name)
    payloads = [encode_unrolls([valid_unroll(float(j % 3) - 1) for j in range(i, i + per_entry)],
                               unroll_id=f"r-0-{i}", policy_version=0, actor_id=0, env="tictactoe")
                for i in range(0, N, per_entry)]
    stream.add(payloads, producer="0-tok", produced=N)
    learner = Learner(cfg, redis_url, tmp_path / run_name)
    assert learner.ingest.batch_size == 2 and learner.ingest.replayed == 2
    capacity = learner.ingest.replay.capacity_bytes
    acked, held = [], []
    learner.acknowledge = lambda ids, headers, ack=learner.acknowledge: (acked.extend(ids), ack(ids, headers))[1]
    learner.ingest.remember = lambda *a, remember=learner.ingest.remember: (
        remember(*a), held.append(learner.ingest.replay.nbytes))[0]
    run_learner_until(learner, lambda: False)

    assert learner.step == N // 2 and learner.agent_steps == N * T
    assert len(acked) == len(set(acked)) == N // per_entry
    assert stream.accounting() == {"produced": N, "trained": N, "dead_lettered": 0, "backlog": 0,
                                   "throttled_s": 0.0, "env_steps": 0}
    assert redis_client.xpending(stream.key, GROUP)["pending"] == 0
    assert max(held) <= capacity < N * unroll_nbytes(valid_unroll())  # eviction happened, within the cap
    records = [json.loads(line) for line in metrics_path(tmp_path / run_name, MAIN).read_text().splitlines()]
    assert records and all({"replay_unrolls", "replay_mb", "replayed_fraction"} <= set(r) for r in records)
    last = records[-1]
    assert last["agent_steps_trained"] == N * T and last["unrolls_trained"] == N
    assert last["replay_unrolls"] == capacity // unroll_nbytes(valid_unroll())
    assert math.isclose(last["replay_mb"], last["replay_unrolls"] * unroll_nbytes(valid_unroll()) / 2**20)
    assert all(0.0 <= r["replayed_fraction"] <= 0.5 for r in records)
    assert last["replayed_fraction"] == 0.5  # the buffer holds k = 2 unrolls after the first update
    for r in records:
        if r["replayed_fraction"] == 0.5:
            # Every unroll has policy_version 0 and each update trained 2 fresh and 2 replayed ones,
            # so both lags are the mean of (update - 1) over the window.
            assert r["replay_policy_lag"] == pytest.approx(r["policy_lag"]) and r["replay_policy_lag"] > 0


def test_the_memory_must_hold_the_unrolls_a_batch_replays(tmp_path, redis_url, run_name):
    cfg = small_config(run_name, tmp_path, "learner.batch_size=4", "learner.replay_fraction=0.5",
                       "learner.replay_memory_mb=0.0001")
    with pytest.raises(ConfigError, match=r"learner.replay_memory_mb=0.0001 holds fewer than the 2 unrolls"):
        Learner(cfg, redis_url, tmp_path / run_name)


def test_max_unroll_nbytes_bounds_a_decoded_unroll_with_every_step_truncated():
    spec = UnrollSpec(env_spec("tictactoe"), T)
    u = valid_unroll()
    u["final_obs"] = np.zeros((T, *u["obs"].shape[1:]), u["obs"].dtype)
    assert spec.max_unroll_nbytes == unroll_nbytes(u)


# -- configuration ---------------------------------------------------------------------------------

@pytest.mark.parametrize("overrides, message", [
    (["learner.replay_fraction=1.0"], r"learner.replay_fraction must be in \[0, 1\) \(got 1.0\)"),
    (["learner.replay_fraction=-0.25"], r"learner.replay_fraction must be in \[0, 1\) \(got -0.25\)"),
    (["learner.replay_fraction=0.01"], r"replays no unroll of a batch of learner.batch_size=32"),
    (["learner.replay_fraction=0.5", "learner.batch_size=1"], r"replays no unroll .* learner.batch_size=1"),
    (["learner.replay_memory_mb=0"], r"learner.replay_memory_mb must be > 0 and finite \(got 0.0\)"),
    (["learner.replay_memory_mb=-1"], r"learner.replay_memory_mb must be > 0 and finite \(got -1.0\)"),
    (["learner.replay_memory_mb=.inf"], r"learner.replay_memory_mb must be > 0 and finite \(got inf\)"),
    (["learner.replay_fraction=0.5", "learner.algo=a3c"], r"learner.replay_fraction > 0 needs learner.algo=impala"),
])
def test_bad_replay_settings_are_refused_by_name(overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(REPO / "configs/tictactoe.yaml", overrides)


@pytest.mark.parametrize("fraction, batch_size, replayed", [(0.0, 32, 0), (0.5, 32, 16), (0.25, 6, 2),
                                                             (0.9, 2, 1), (0.99, 32, 31)])
def test_k_is_round_f_times_b_with_at_least_one_fresh_unroll(fraction, batch_size, replayed):
    cfg = load_config(REPO / "configs/tictactoe.yaml", [f"learner.replay_fraction={fraction}",
                                                        f"learner.batch_size={batch_size}"])
    assert replayed_per_batch(cfg.learner) == replayed
