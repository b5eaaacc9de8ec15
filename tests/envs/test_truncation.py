"""Time limits are not the end of the game: a truncated step bootstraps from V(final observation).

From the env adapters (Parallel, AEC, gymnasium) through the unroll buffer, the wire format and the
batch to the learner's targets, checked against float64 hand computations; and real short runs of
`mpe:simple_tag` and `gym:CartPole-v1` whose unrolls carry truncations inside them.
"""

from __future__ import annotations

import gymnasium
import numpy as np
import pytest
import torch
from gymnasium import spaces
from pettingzoo.utils.conversions import parallel_to_aec
from pettingzoo.utils.env import ParallelEnv

from impala_league import REPO
from impala_league.agents.core import forward_batch
from impala_league.agents.heads import DiscreteHead
from impala_league.config import LearnerConfig
from impala_league.distributed.actor import UnrollBuffer
from impala_league.distributed.wire.codec import DecodeError, UnrollSpec, decode_unroll, decode_unrolls, encode_unroll
from impala_league.batch import Batch
from impala_league.envs.aec import AECAdapter
from impala_league.envs.parallel import ParallelAdapter
from impala_league.envs.registry import EnvSpec, make_env
from impala_league.envs.spaces import observation_encoder
from impala_league.losses.actor_critic import off_policy_targets

AGENTS = ["hunter_0", "prey_0"]
A = 3
SPEC = EnvSpec("watched", (2,), np.dtype(np.float32), A, ("hunter", "prey"), agents=tuple(AGENTS),
               agent_seats=(0, 1), kind="parallel")
ENCODE = observation_encoder(spaces.Box(0, 1000, (2,), np.float32)).encode


class Watched(ParallelEnv):
    """Two agents, reward 0, nobody ever terminated; the episode is cut after `max_cycles` steps with
    truncation=True, termination=False for every agent. Observation: [t, episode number]."""

    metadata = {"name": "watched"}

    def __init__(self, max_cycles: int = 25):
        self.possible_agents = list(AGENTS)
        self.agents: list[str] = []
        self.max_cycles = max_cycles
        self.t, self.episode = 0, -1

    def observation_space(self, agent):
        return spaces.Box(0, 1000, (2,), np.float32)

    def action_space(self, agent):
        return spaces.Discrete(A)

    def _obs(self, agents):
        return {a: np.array([self.t, self.episode], np.float32) for a in agents}

    def reset(self, seed=None, options=None):
        self.agents, self.t = list(AGENTS), 0
        self.episode += 1
        return self._obs(self.agents), {a: {} for a in self.agents}

    def step(self, actions):
        acting = list(self.agents)
        self.t += 1
        truncated = {a: self.t >= self.max_cycles for a in acting}
        self.agents = [] if self.t >= self.max_cycles else acting
        return (self._obs(acting), {a: 0.0 for a in acting}, {a: False for a in acting}, truncated,
                {a: {} for a in acting})


class ValueTable(torch.nn.Module):
    """Uniform policy; V = 3 at the state of cycle 25 (t = 24), 5 at the final observation (t = 25),
    1000 in every state of the next episode (a leak of it into the cut episode would show), else 0."""

    def forward(self, obs, action_mask):
        t, episode = obs[:, 0], obs[:, 1]
        v = torch.where(episode >= 1, 1000.0, torch.where(t == 24, 3.0, torch.where(t == 25, 5.0, 0.0)))
        return torch.zeros(len(obs), action_mask.shape[1]), v


def play(adapter, spec: EnvSpec, T: int, agent: int = 0) -> dict[str, np.ndarray]:
    """Play uniform actions until `agent`'s first unroll of T steps is complete; return it."""
    buffers = [UnrollBuffer(UnrollSpec(spec, T)) for _ in spec.agents]
    step = adapter.advance()
    while True:
        for s in step.settlements:
            buffers[s.agent].settle(s.reward, s.done, s.truncated, s.final_observation)
        for a, obs, mask in zip(step.agents, step.observations, step.action_masks):
            unroll = buffers[a].observe(obs, mask)
            if unroll is not None and a == agent:
                return unroll
            buffers[a].record_action(0, np.zeros(A, np.float32))
        adapter.act([0] * len(step.agents))
        step = adapter.advance()


def targets(unroll: dict[str, np.ndarray], spec: EnvSpec, model: torch.nn.Module, gamma: float):
    """The learner's (vs, pg_advantages) [T] for one unroll, through the wire format and the batch."""
    T = len(unroll["reward"])
    _, decoded = decode_unroll(encode_unroll(unroll, unroll_id="u", policy_version=0, actor_id=0, env=spec.name),
                               UnrollSpec(spec, T))
    batch = Batch.stack([decoded], torch.device("cpu"))
    with torch.no_grad():
        logits, values, final_values = forward_batch(model, batch)
        out = off_policy_targets(logits, values, batch, LearnerConfig(discount=gamma), DiscreteHead(), final_values)
    return out.vs[:, 0].double().numpy(), out.pg_advantages[:, 0].double().numpy()


def hand_vtrace(rewards, values, bootstrap, done, truncated, final_values, gamma, rhos=None,
                rho_bar=1.0, c_bar=1.0, pg_rho_bar=1.0):
    """V-trace (IMPALA eq. 1) in float64 by its definition, one step at a time backwards, with the
    time-limit rule: a truncated step's successor value is V(final observation) and its trace stops;
    a terminated step's successor value is 0."""
    T = len(rewards)
    rhos = np.ones(T) if rhos is None else rhos
    vs, adv = np.zeros(T), np.zeros(T)
    vs_next, v_next = bootstrap, bootstrap
    for t in reversed(range(T)):
        if truncated[t]:
            succ, vs_succ, trace = final_values[t], final_values[t], 0.0
        elif done[t]:
            succ, vs_succ, trace = 0.0, 0.0, 0.0
        else:
            succ, vs_succ, trace = v_next, vs_next, 1.0
        delta = min(rho_bar, rhos[t]) * (rewards[t] + gamma * succ - values[t])
        vs[t] = values[t] + delta + trace * gamma * min(c_bar, rhos[t]) * (vs_succ - succ)
        adv[t] = min(pg_rho_bar, rhos[t]) * (rewards[t] + gamma * vs_succ - values[t])
        vs_next, v_next = vs[t], values[t]
    return vs, adv


def test_time_limit_at_cycle_25_bootstraps_from_the_final_observation_inside_an_unroll():
    # The input: max_cycles=25; at cycle 25 (step index 24) every agent has truncation=True,
    # termination=False, reward 0; V(s_25)=3, V(final observation)=5, gamma 0.99, on-policy. The
    # unroll is 30 steps long, so the next episode's 5 steps (V=1000) follow the cut inside it.
    adapter = ParallelAdapter(Watched, 0, [ENCODE] * 2, SPEC.agent_seats, A, name="watched")
    unroll = play(adapter, SPEC, T=30)
    assert unroll["done"].tolist() == [0] * 24 + [1] + [0] * 5
    assert unroll["truncated"].tolist() == [0] * 24 + [1] + [0] * 5
    np.testing.assert_array_equal(unroll["final_obs"], [[25, 0]])  # before the reset, not the next episode's
    np.testing.assert_array_equal(unroll["obs"][25], [0, 1])  # obs[t+1] is the next episode's first
    vs, adv = targets(unroll, SPEC, ValueTable(), gamma=0.99)
    assert vs[24] == pytest.approx(4.95) and adv[24] == pytest.approx(1.95)  # 0 + 0.99 * 5; 4.95 - 3
    # Treated as terminal (the old behaviour), the target would be 0 and the advantage -3.
    cut = dict(unroll, truncated=np.zeros(30, np.uint8))
    del cut["final_obs"]
    vs_old, adv_old = targets(cut, SPEC, ValueTable(), gamma=0.99)
    assert vs_old[24] == 0.0 and adv_old[24] == -3.0
    # Every step against the float64 definition.
    values = np.array([3.0 if t == 24 else 0.0 for t in range(25)] + [1000.0] * 5)
    final_values = np.where(unroll["truncated"] == 1, 5.0, 0.0)
    hand_vs, hand_adv = hand_vtrace(np.zeros(30), values, 1000.0, unroll["done"], unroll["truncated"],
                                    final_values, 0.99)
    np.testing.assert_allclose(vs, hand_vs, rtol=1e-6)
    np.testing.assert_allclose(adv, hand_adv, rtol=1e-6, atol=1e-4)
    assert hand_vs[23] == pytest.approx(0.99 * 4.95)


def test_truncation_at_the_last_step_of_an_unroll_ignores_the_bootstrap_observation():
    # T=25: the cut is the unroll's last step; obs[T] is the next episode's first observation (V=1000).
    adapter = ParallelAdapter(Watched, 0, [ENCODE] * 2, SPEC.agent_seats, A, name="watched")
    unroll = play(adapter, SPEC, T=25)
    assert unroll["truncated"][-1] == 1 and unroll["obs"][-1].tolist() == [0, 1]
    vs, adv = targets(unroll, SPEC, ValueTable(), gamma=0.99)
    assert vs[24] == pytest.approx(4.95) and adv[24] == pytest.approx(1.95)


def test_turn_based_truncation_keeps_the_final_observation():
    # The same game as turn-based (PettingZoo's parallel_to_aec), cut after 3 cycles.
    spec = EnvSpec("watched", (2,), np.dtype(np.float32), A, tuple(AGENTS))
    adapter = AECAdapter(lambda: parallel_to_aec(Watched(max_cycles=3)), 0, [ENCODE] * 2, A, name="watched")
    unroll = play(adapter, spec, T=4)
    assert unroll["done"].tolist() == [0, 0, 1, 0] and unroll["truncated"].tolist() == [0, 0, 1, 0]
    np.testing.assert_array_equal(unroll["final_obs"], [[3, 0]])


def test_gymnasium_time_limit_is_truncated_with_the_observation_step_returned():
    # CartPole with a 5-step TimeLimit, actions 0,1,0,1,...: short of falling, every episode is cut.
    adapter = make_env("gym:CartPole-v1", 7, {"max_episode_steps": 5})
    reference = gymnasium.make("CartPole-v1", max_episode_steps=5)
    obs, _ = reference.reset(seed=7)
    step = adapter.advance()
    for t in range(5):
        np.testing.assert_array_equal(step.observations[0], obs)
        adapter.act([t % 2])
        obs, reward, terminated, truncated, _ = reference.step(t % 2)
        step = adapter.advance()
    assert truncated and not terminated
    (settled,) = step.settlements
    assert settled.done and settled.truncated
    np.testing.assert_array_equal(settled.final_observation, obs)
    assert not np.array_equal(step.observations[0], obs)  # play went on in a new episode
    assert [e.length for e in step.episodes] == [5]  # statistics count the episode as ended


def test_a_terminated_and_truncated_step_is_terminal():
    buffer = UnrollBuffer(UnrollSpec(SPEC, 2))
    buffer.observe(np.zeros(2, np.float32), np.ones(A, np.uint8))
    buffer.record_action(0, np.zeros(A, np.float32))
    with pytest.raises(ValueError, match="final observation"):
        buffer.settle(0.0, True, truncated=True)
    buffer.settle(1.0, True)
    assert buffer.arrays["done"][0] == 1 and buffer.arrays["truncated"][0] == 0


def _encoded(unroll):
    return encode_unroll(unroll, unroll_id="u", policy_version=0, actor_id=0, env="watched")


def test_decoder_refuses_truncations_that_do_not_match_their_final_observations():
    adapter = ParallelAdapter(Watched, 0, [ENCODE] * 2, SPEC.agent_seats, A, name="watched")
    unroll = play(adapter, SPEC, T=30)
    uspec = UnrollSpec(SPEC, 30)
    _, ok = decode_unroll(_encoded(unroll), uspec)
    np.testing.assert_array_equal(ok["final_obs"], unroll["final_obs"])
    truncated_not_done = dict(unroll, done=np.zeros(30, np.uint8))
    with pytest.raises(DecodeError, match="1 only where done is 1"):
        decode_unroll(_encoded(truncated_not_done), uspec)
    two = dict(unroll, final_obs=np.zeros((2, 2), np.float32))
    with pytest.raises(DecodeError, match=r"'final_obs' has shape \[2, 2\], expected \[1, 2\]"):
        decode_unroll(_encoded(two), uspec)
    missing = {k: v for k, v in unroll.items() if k != "final_obs"}
    with pytest.raises(DecodeError, match="1 steps are truncated but the entry has no 'final_obs'"):
        decode_unroll(_encoded(missing), uspec)


def test_a_non_finite_final_observation_rejects_only_its_own_unroll_in_a_batch():
    """Final observations are concatenated over the batch ([sum N_b, ...]): a bad row must be charged to
    the unroll it came from, not to its neighbours (which have 1 and 0 final observations)."""
    adapter = ParallelAdapter(Watched, 0, [ENCODE] * 2, SPEC.agent_seats, A, name="watched")
    unroll = play(adapter, SPEC, T=30)
    uspec = UnrollSpec(SPEC, 30)
    untruncated = dict(unroll, truncated=np.zeros(30, np.uint8))
    del untruncated["final_obs"]
    bad = dict(unroll, final_obs=np.array([[np.nan, 1.0]], np.float32))
    got = decode_unrolls([_encoded(u) for u in (unroll, untruncated, bad, unroll)], uspec)
    assert [isinstance(g, DecodeError) for g in got] == [False, False, True, False]
    assert "'final_obs' has non-finite values" in str(got[2])
    np.testing.assert_array_equal(got[3][1]["final_obs"], unroll["final_obs"])


# -- real runs ---------------------------------------------------------------------------------------
SHORT_RUNS = {
    # MPE episodes end only by max_cycles: cut every 15 steps, unrolls of 20 carry the cut inside.
    "mpe:simple_tag": ("configs/mpe_simple_tag.yaml", ["env.kwargs.max_cycles=15"]),
    # A 15-step TimeLimit on CartPole: most episodes are cut (none falls before step 8).
    "gym:CartPole-v1": ("configs/cartpole.yaml", ["env.kwargs.max_episode_steps=15"]),
}
SMALL = ["actor.unroll_length=20", "run.total_agent_steps=3000", "actor.num_envs=2", "learner.batch_size=4",
         "agent.hidden=32", "actor.epsilon=0.5"]


def collect(actor, count: int) -> list[dict[str, np.ndarray]]:
    """`count` unrolls from a real Actor's envs, buffers and batched action choice (its `run` loop,
    minus Redis)."""
    unrolls = []
    steps = [env.advance() for env in actor.envs]
    while len(unrolls) < count:
        for i, step in enumerate(steps):
            for s in step.settlements:
                actor.slots[i].buffers[s.agent].settle(s.reward, s.done, s.truncated, s.final_observation)
            for agent, obs, mask in zip(step.agents, step.observations, step.action_masks):
                unroll = actor.slots[i].buffers[agent].observe(obs, mask)
                if unroll is not None:
                    unrolls.append(unroll)
        actions = actor.choose_actions(steps)
        for i, env in enumerate(actor.envs):
            env.act(actions[i])
            steps[i] = env.advance()
    return unrolls


@pytest.mark.parametrize("env_name", list(SHORT_RUNS))
def test_a_short_run_trains_on_truncations_and_its_targets_match_a_float64_hand_computation(
        env_name, tmp_path, redis_url, run_name):
    from impala_league.config import load_config
    from impala_league.distributed.actor import Actor
    from tests.distributed.test_parallel import _train

    config, extra = SHORT_RUNS[env_name]
    overrides = [*extra, *SMALL]
    _, records = _train(tmp_path, redis_url, config, run_name, *overrides)
    assert records[-1]["agent_steps_trained"] >= 3000
    assert any(r["truncated_fraction"] > 0 for r in records)  # the learner trained on truncated steps
    # The run's final weights play 8 more unrolls; the learner's code computes their targets.
    cfg = load_config(REPO / config, [*overrides, f"run.name={run_name}", f"run.dir={tmp_path}"])
    actor = Actor(cfg, redis_url, 0)
    actor.sync_params()
    assert actor.policy.version > 0
    unrolls = collect(actor, 8)
    spec, T, gamma = actor.spec, cfg.actor.unroll_length, cfg.learner.discount
    decoded = [decode_unroll(encode_unroll(u, unroll_id=str(k), policy_version=actor.policy.version, actor_id=0,
                                           env=spec.name), UnrollSpec(spec, T))[1] for k, u in enumerate(unrolls)]
    inside = [(b, t) for b, u in enumerate(decoded) for t in np.flatnonzero(u["truncated"]) if t < T - 1]
    assert inside, "no unroll carries a truncation inside it"
    batch = Batch.stack(decoded, torch.device("cpu"))
    with torch.no_grad():
        logits, values, final_values = forward_batch(actor.policy.model, batch)
        out = off_policy_targets(logits, values, batch, cfg.learner, DiscreteHead(), final_values)
    # By hand, in float64: the network on each unroll alone (the network computes in float32), rho
    # from the softmaxes, V-trace by its definition.
    for b, u in enumerate(decoded):
        with torch.no_grad():
            lg, v = actor.policy.model(torch.tensor(u["obs"]), torch.tensor(u["action_mask"]))
            _, v_final = actor.policy.model(torch.tensor(u["final_obs"]), torch.ones(len(u["final_obs"]), spec.num_actions))
        lg, v, v_final = lg.double(), v.double(), v_final.double()
        log_pi = torch.log_softmax(lg[:-1], -1).numpy()[np.arange(T), u["action"]]
        log_mu = torch.log_softmax(torch.tensor(u["behaviour_logits"]).double(), -1).numpy()[
            np.arange(T), u["action"]]
        final_values_b = np.zeros(T)
        final_values_b[np.flatnonzero(u["truncated"])] = v_final.numpy()
        hand_vs, hand_adv = hand_vtrace(u["reward"].astype(np.float64), v[:-1].numpy(), float(v[-1]), u["done"],
                                        u["truncated"], final_values_b, gamma, rhos=np.exp(log_pi - log_mu),
                                        rho_bar=cfg.learner.clip_rho_threshold, c_bar=cfg.learner.clip_c_threshold,
                                        pg_rho_bar=cfg.learner.clip_pg_rho_threshold)
        np.testing.assert_allclose(out.vs[:, b].numpy(), hand_vs, rtol=1e-4, atol=1e-4)
        np.testing.assert_allclose(out.pg_advantages[:, b].numpy(), hand_adv, rtol=1e-4, atol=1e-4)
    # The cut steps inside unrolls bootstrapped from V(final observation) (a trained value, not 0).
    assert all(final_values[t, b] != 0 for b, t in inside)
    actor.close()


def test_starcraft_step_limit_is_truncated_and_its_final_observations_reach_the_learner():
    # pysc2 ends an episode at its step limit with discount 1 (the game's own end has discount 0);
    # the mock env always says 0, so this test hands the adapter the step limit's discount.
    import impala_league.envs.sc2_wrappers  # noqa: F401  (imports pysc2 through the shim)
    from impala_league.agents.model import make_model
    from impala_league.config import load_config
    from impala_league.envs.registry import env_spec

    name, kwargs = "sc2:MoveToBeacon", {"mock": True, "screen_size": 8, "minimap_size": 8}
    spec = env_spec(name, kwargs)
    adapter = make_env(name, 0, kwargs)
    step_env = adapter.env.step
    adapter.env.step = lambda actions: [ts._replace(discount=1.0) if ts.last() else ts for ts in step_env(actions)]
    uspec = UnrollSpec(spec, 12)
    buffer = UnrollBuffer(uspec)
    step, unroll, truncations = adapter.advance(), None, []
    while unroll is None:
        for s in step.settlements:
            buffer.settle(s.reward, s.done, s.truncated, s.final_observation)
            truncations += [s] if s.truncated else []
        unroll = buffer.observe(step.observations[0], step.action_masks[0])
        buffer.record_action(np.zeros(len(spec.action_heads), np.int64), np.zeros(len(spec.action_heads), np.float32))
        adapter.act([np.zeros(len(spec.action_heads), np.int64)])
        step = adapter.advance()
    assert truncations and set(truncations[0].final_observation) == {n for n, _, _ in spec.obs_arrays}
    n = int(unroll["truncated"].sum())
    assert n >= 1 and all(unroll[f"final_obs.{k}"].shape[0] == n for k, _, _ in spec.obs_arrays)
    _, decoded = decode_unroll(encode_unroll(unroll, unroll_id="u", policy_version=0, actor_id=0, env=name), uspec)
    cfg = load_config(None, [f"env.name={name}", "env.kwargs={mock: true, screen_size: 8, minimap_size: 8}",
                             "agent.torso=fullyconv", "league.bots=[]", "agent.hidden=16"])
    model = make_model(spec, cfg.agent)
    batch = Batch.stack([decoded], torch.device("cpu"))
    with torch.no_grad():
        _, _, final_values = forward_batch(model, batch)
        final_obs = {k: torch.tensor(decoded[f"final_obs.{k}"]) for k, _, _ in spec.obs_arrays}
        _, expected = model(final_obs, torch.ones(n, spec.num_actions))
    t = np.flatnonzero(decoded["truncated"])
    np.testing.assert_allclose(final_values[t, 0].numpy(), expected.numpy(), rtol=1e-5, atol=1e-6)


def _unroll(truncated_at: int | None, T: int = 3) -> dict[str, np.ndarray]:
    """An actor's own unroll of T steps (observation [t, 0]); the step `truncated_at` cut with the final
    observation [t, 99], or none truncated (then the unroll carries no `final_obs` at all)."""
    buffer = UnrollBuffer(UnrollSpec(SPEC, T))
    for t in range(T + 1):
        unroll = buffer.observe(np.array([t, 0], np.float32), np.ones(A, np.uint8))
        if t == T:
            return unroll
        buffer.record_action(0, np.zeros(A, np.float32))
        cut = t == truncated_at
        buffer.settle(0.0, cut, truncated=cut, final_observation=np.array([t, 99], np.float32) if cut else None)


@pytest.mark.parametrize("order", ["truncated first", "untruncated first"])
def test_a_batch_of_truncated_and_untruncated_unrolls_stacks_in_either_order(order):
    """An A3C worker's batch (actor.send_batch > 1) mixes an unroll with a cut step and one without."""
    unrolls = [_unroll(1), _unroll(None)]
    assert "final_obs" in unrolls[0] and "final_obs" not in unrolls[1]
    if order == "untruncated first":
        unrolls.reverse()
    batch = Batch.stack(unrolls, torch.device("cpu"))
    b = 0 if order == "truncated first" else 1
    assert batch.final_obs.tolist() == [[1.0, 99.0]]
    assert batch.final_t.tolist() == [1] and batch.final_b.tolist() == [b]
    assert batch.truncated[:, b].tolist() == [False, True, False] and not batch.truncated[:, 1 - b].any()
    assert batch.obs[:, 1 - b, 0].tolist() == [0.0, 1.0, 2.0, 3.0]
