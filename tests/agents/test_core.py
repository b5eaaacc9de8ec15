"""The recurrent core (agent.core=lstm) end to end: what the actor acted with, the learner replays exactly;
the learner's unroll matches a float64 step-by-step reference; evaluation carries the state.

Each test is aimed at a classic mistake of recurrent actor-learner code (docs/architecture.md, "Recurrent
core"): the state not carried across unrolls, not reset after a `done` inside an unroll, reset one step
off, the learner starting from zeros instead of the carried state, the state stored after the step
instead of before it, the bootstrap step stepped twice, a truncated episode's final value computed from
a fresh state, and evaluation that runs without the state.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from impala_league.agents.core import NO_ACTION, CoreInput, forward_batch
from impala_league.agents.model import make_model, policy_head
from impala_league.agents.policy import Policy
from impala_league.batch import Batch
from impala_league.config import load_config
from impala_league.distributed.actor import Actor
from impala_league.distributed.learner.update import learn_step, make_optimizer
from impala_league.distributed.wire.codec import DecodeError, UnrollSpec, decode_unrolls, encode_unrolls, split_unrolls
from impala_league.distributed.wire.params import ParamStore
from impala_league.envs.registry import env_spec
from impala_league.evaluation.evaluate import episode_returns

T, CORE = 5, 8
CORE_ON = ["agent.hidden=16", "agent.core=lstm", f"agent.core_size={CORE}", f"actor.unroll_length={T}",
           "run.wandb_mode=disabled"]
CUE = ["env.name=cue_recall", "env.kwargs.delay_min=2", "env.kwargs.delay_max=6", "agent.torso=mlp",
       "agent.mlp_layers=1"]
SC2_MOCK = ["env.name=sc2:MoveToBeacon", "env.kwargs={mock: true, screen_size: 8, minimap_size: 8}",
            "agent.torso=fullyconv", "league.bots=[]"]


def cue_config(*extra: str):
    return load_config(None, [*CORE_ON, *CUE, *extra])


def random_model(cfg, seed: int = 0):
    """A network whose outputs depend strongly on its core state (weights scaled up)."""
    torch.manual_seed(seed)
    model = make_model(env_spec(cfg.env.name, cfg.env.kwargs), cfg.agent)
    with torch.no_grad():
        for p in model.core.parameters():
            p.mul_(4.0)
        if hasattr(model.heads, "policy"):  # ActorCritic's LinearHeads; FullyConv's are kept
            model.heads.policy.weight.mul_(4.0)
    return model.eval()


@pytest.mark.parametrize("env", ["cue_recall", "sc2"])
def test_the_learner_replays_exactly_the_core_states_the_actor_acted_with(env, tmp_path, run_name, redis_client,
                                                                           redis_url):
    """The real actor loop plays 3 envs x 1 stream through unrolls of T=5 with episodes of 4-8 steps
    (dones inside unrolls, episodes across unroll boundaries); the unrolls go through the wire format,
    and the learner's forward pass over them must give, at every step, the logits the actor sampled
    from (epsilon 0: mu = pi). A state not carried, carried from after the step, reset at the wrong
    step, or the learner starting from zeros, each changes some step's logits."""
    cfg = load_config(None, [*CORE_ON, *(SC2_MOCK if env == "sc2" else CUE), f"run.name={run_name}",
                             f"run.dir={tmp_path}", "actor.num_envs=3", "actor.param_sync_every=1000"])
    model = random_model(cfg)
    ParamStore(redis_client, run_name).publish(model.state_dict(), 1)
    actor = Actor(cfg, redis_url, actor_id=0)
    unrolls: list[dict] = []
    actor.send = lambda batch, *_: unrolls.extend(batch) or len(unrolls) >= 18
    actor.run()
    actor.close()
    spec = UnrollSpec(actor.spec, T, CORE)
    entries = decode_unrolls([encode_unrolls([u], unroll_id=str(k), policy_version=1, actor_id=0,
                                             env=actor.spec.name) for k, u in enumerate(unrolls)], spec)
    batch = Batch.stack([split_unrolls(arrays)[0] for _, arrays in entries], torch.device("cpu"))
    assert batch.core_state.abs().amax((1, 2)).gt(0).sum() >= 6  # carried, non-zero states
    assert (batch.last_action >= 0).any()
    if env == "cue_recall":  # episodes of 4-8 steps: ends inside unrolls, and unrolls starting one
        assert batch.done.any() and (batch.last_action == NO_ACTION).any()
    with torch.no_grad():
        logits, _, _ = forward_batch(model, batch)
    if env == "sc2":  # the behaviour record is log mu_h(a_h|x) per head
        head = policy_head(actor.spec)
        logits = head.codec.head_log_probs(head.split(logits), torch.cat([batch.action, batch.action[-1:]]))
    torch.testing.assert_close(logits[:-1], batch.behaviour_logits, rtol=1e-5, atol=1e-5)


def reference(model, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Values [T+1, B] and logits [T+1, B, A] by stepping `model` one step of one unroll at a time (the
    actor's way), and V(final observation) of each truncated (t, b): the rule written plainly."""
    m = model
    Tn, B = batch.reward.shape
    values, logits, finals = torch.zeros(Tn + 1, B), [], {}
    for b in range(B):
        state, last_a, last_r = batch.core_state[b], int(batch.last_action[b]), float(batch.last_reward[b])
        rows = []
        for t in range(Tn + 1):
            core = CoreInput(state[None], torch.tensor([last_a]), torch.tensor([last_r]))
            lg, v, state_after = m.step(batch.obs[t, b][None], batch.action_mask[t, b][None], core)
            rows.append(lg[0])
            values[t, b] = v[0]
            if t == Tn:
                break
            state, last_a, last_r = state_after[0], int(batch.action[t, b]), float(batch.reward[t, b])
            if batch.truncated is not None and batch.truncated[t, b]:
                core = CoreInput(state[None], torch.tensor([last_a]), torch.tensor([last_r]))
                _, fv, _ = m.step(batch.final_obs[(batch.final_t == t) & (batch.final_b == b)],
                                  torch.ones(1, batch.action_mask.shape[-1]), core)
                finals[(t, b)] = float(fv[0])
            if batch.done[t, b]:  # the next step starts the next episode
                state, last_a, last_r = torch.zeros_like(state), NO_ACTION, 0.0
        logits.append(torch.stack(rows))
    return values, torch.stack(logits, 1), finals


def hand_batch(seed: int = 1) -> Batch:
    """T=6, B=3 of cue_recall-shaped observations: unroll 0 carries a state and ends an episode at t=1
    and t=4; unroll 1 is truncated at t=2 (its final observation kept) and continues; unroll 2 has no
    episode end and starts from a non-zero state too."""
    g = torch.Generator().manual_seed(seed)
    Tn, B, A = 6, 3, 2
    done = torch.zeros(Tn, B, dtype=torch.bool)
    done[1, 0] = done[4, 0] = done[2, 1] = True
    truncated = torch.zeros(Tn, B, dtype=torch.bool)
    truncated[2, 1] = True
    return Batch(obs=torch.rand(Tn + 1, B, 3, generator=g), action_mask=torch.ones(Tn + 1, B, A, dtype=torch.uint8),
                 action=torch.randint(0, A, (Tn, B), generator=g), reward=torch.rand(Tn, B, generator=g) * 3 - 1.5,
                 done=done, behaviour_logits=torch.zeros(Tn, B, A), truncated=truncated,
                 final_obs=torch.rand(1, 3, generator=g), final_t=torch.tensor([2]), final_b=torch.tensor([1]),
                 core_state=torch.randn(B, 2, CORE, generator=g), last_action=torch.tensor([1, NO_ACTION, 0]),
                 last_reward=torch.tensor([0.5, 0.0, -2.0]))


@torch.no_grad()
def test_the_learners_unroll_matches_a_step_by_step_reference():
    """Resets after each done (not at it, not never), the carried initial state and last action/reward,
    and a truncated step's final observation valued from its own episode's state (not zeros)."""
    cfg = cue_config()
    model = random_model(cfg, seed=3)
    batch = hand_batch()
    logits, values, final_values = forward_batch(model, batch)
    ref_values, ref_logits, finals = reference(model, batch)
    torch.testing.assert_close(values, ref_values, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(logits, ref_logits, rtol=1e-5, atol=1e-5)
    assert final_values[2, 1].item() == pytest.approx(finals[(2, 1)], abs=1e-5)
    # From a fresh state the same final observation has another value: the test would see zeros.
    _, fresh, _ = model.step(batch.final_obs, torch.ones(1, 2), CoreInput(torch.zeros(1, 2, CORE),
                                                                         torch.tensor([NO_ACTION]), torch.zeros(1)))
    assert abs(fresh.item() - finals[(2, 1)]) > 1e-3


def test_an_update_trains_the_core_and_the_torso():
    cfg = cue_config()
    model = random_model(cfg)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    stats = learn_step(model, make_optimizer(model, cfg.learner), hand_batch(), cfg.learner)
    assert stats["skipped_update"] == 0.0
    changed = {k for k, v in model.state_dict().items() if not torch.equal(v, before[k])}
    assert {"core.lstm.weight_ih_l0", "core.lstm.weight_hh_l0", "torso.fc.0.weight", "heads.policy.weight"} <= changed


def memory_policy(cfg) -> Policy:
    """A hand-set network that answers cue_recall from memory: the torso passes the observation through,
    the LSTM's cell adds tanh(5 (cue_0 - cue_1)) with its forget gate open, and the policy reads the sign
    of h at the query. It answers every query right when its state is carried, half of them when not."""
    cfg.agent.hidden, cfg.agent.core_size, cfg.agent.core_inputs = 3, 1, False
    spec = env_spec(cfg.env.name, cfg.env.kwargs)
    model = make_model(spec, cfg.agent)
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
        model.torso.fc[0].weight.copy_(torch.eye(3))
        lstm = model.core.lstm  # gates in PyTorch's order: input, forget, cell, output
        lstm.bias_ih_l0.copy_(torch.tensor([10.0, 10.0, 0.0, 10.0]))
        lstm.weight_ih_l0[2].copy_(torch.tensor([5.0, -5.0, 0.0]))
        model.heads.policy.weight.copy_(torch.tensor([[10.0], [-10.0]]))
    return Policy(model, cfg, spec)


def test_evaluation_carries_the_core_state_through_each_game():
    """episode_returns plays 16 games at once: each game's stream keeps its own state."""
    policy = memory_policy(cue_config("env.kwargs.delay_min=8", "env.kwargs.delay_max=24"))
    assert episode_returns(policy, 16, seed=5)["mean_return"] == 1.0


def test_one_policy_in_both_seats_is_told_each_reward_once():
    """The same Policy object in both seats hears each settlement once, as two policies hear it between them."""
    from impala_league.evaluation.evaluate import play_games

    cfg = load_config(None, [*CORE_ON, "env.name=tictactoe", "agent.torso=mlp", "learner.mirror_augment=none"])

    def counted() -> tuple[Policy, list]:
        policy, told = Policy(random_model(cfg), cfg, env_spec("tictactoe")), []
        settle = policy.settle
        policy.settle = lambda stream, reward, done=False: told.append(stream) or settle(stream, reward, done)
        return policy, told

    same, told_same = counted()
    play_games("tictactoe", (same, same), 3)
    (first, told_first), (second, told_second) = counted(), counted()
    play_games("tictactoe", (first, second), 3)
    assert told_same and len(told_same) == len(told_first) == len(told_second)


def test_policy_act_carries_its_state_until_reset():
    policy = memory_policy(cue_config())
    cue1, blank, query = np.array([0, 1, 0], np.float32), np.zeros(3, np.float32), np.array([0, 0, 1], np.float32)
    policy.act(cue1)
    for _ in range(10):
        policy.act(blank)
    assert policy.act(query) == 1
    assert policy.act(query, stream="other") == 0  # another stream remembers nothing of this one's cue
    policy.reset()  # a new episode: nothing remembered, so logits tie and argmax takes action 0
    assert policy.act(query) == 0
    with pytest.raises(ValueError, match="stream key per row"):
        policy.act_batch(np.stack([query]), np.ones((1, 2), np.uint8))


def test_a_bad_core_state_rejects_its_entry_alone_with_the_reason():
    spec = UnrollSpec(env_spec("cue_recall"), T, CORE)
    arrays = {name: np.zeros(shape, dtype) for name, (dtype, shape) in spec.arrays.items()}
    arrays["action_mask"][:] = 1

    def entry(**changed) -> bytes:
        return encode_unrolls([{**arrays, **changed}], unroll_id="u", policy_version=0, actor_id=0, env="cue_recall")

    nan = arrays["core_state"].copy()
    nan[0, 1, 3] = np.nan
    out = decode_unrolls([entry(), entry(core_state=nan), entry(core_state=np.zeros((1, 2, CORE + 1), np.float32)),
                          entry(last_action=np.array([2]))], spec)
    assert not isinstance(out[0], DecodeError)
    assert [str(e) for e in out[1:]] == [
        "array 'core_state' has non-finite values",
        f"array 'core_state' has shape [1, 1, 2, {CORE + 1}], expected [1, 1, 2, {CORE}]",
        "last_action out of range [-1, 2)"]
    # An actor without the core (or of another schema) is refused, not trained on.
    plain = {k: v for k, v in arrays.items() if k not in ("core_state", "last_action", "last_reward")}
    (refused,) = decode_unrolls([encode_unrolls([plain], unroll_id="u", policy_version=0, actor_id=0,
                                                env="cue_recall")], spec)
    assert isinstance(refused, DecodeError) and "core_state" in str(refused)


def test_a_recurrent_snapshot_opponent_carries_its_own_state_per_game(tmp_path, run_name, redis_client, redis_url):
    """Against a league snapshot with a core, the opponent's seat in each env keeps its own state (the
    slot's, started afresh each episode) while the learning seat's unrolls still replay exactly."""
    from impala_league.distributed.wire.codec import encode_weights
    from impala_league.league.store import LeagueStore

    cfg = load_config(None, [f"run.name={run_name}", f"run.dir={tmp_path}", "env.name=tictactoe", "agent.torso=mlp",
                             "agent.hidden=16", "agent.core=lstm", f"agent.core_size={CORE}",
                             "learner.mirror_augment=none", "actor.num_envs=4", f"actor.unroll_length={T}",
                             "league.enabled=true", "league.opponent_temperature=0", "run.wandb_mode=disabled"])
    model = random_model(cfg)
    ParamStore(redis_client, run_name).publish(model.state_dict(), 1)
    store = LeagueStore(redis_client, run_name)
    store.put_snapshot("main-0000100", encode_weights(random_model(cfg, seed=7).state_dict()))
    store.publish_opponents("main", {"main-0000100": 1.0})
    actor = Actor(cfg, redis_url, actor_id=0)
    unrolls: list[dict] = []
    seen_opponent_state = []

    def send(batch, *_):
        unrolls.extend(batch)
        seen_opponent_state.extend(float(actor.cores.get((i, 1 - slot.match.learner_seat))[0].abs().sum())
                                   for i, slot in enumerate(actor.slots) if slot.match.learner_seat >= 0)
        return len(unrolls) >= 8

    actor.send = send
    actor.run()
    actor.close()
    assert any(v > 0 for v in seen_opponent_state)
    batch = Batch.stack(unrolls, torch.device("cpu"))
    with torch.no_grad():
        logits, _, _ = forward_batch(model, batch)
    torch.testing.assert_close(logits[:-1], batch.behaviour_logits, rtol=1e-5, atol=1e-5)


def test_a_short_recurrent_run_trains_through_ingest_workers_and_replay_and_resumes(tmp_path, redis_url, run_name):
    from impala_league.agents.checkpoint import CheckpointError, check_network, read_checkpoint
    from tests.distributed.test_parallel import _train

    _, records = _train(tmp_path, redis_url, "configs/memory_cue.yaml", run_name, "run.total_agent_steps=3000",
                        "actor.num_envs=4", "learner.batch_size=4", "learner.replay_fraction=0.5",
                        "learner.ingest_workers=1", "agent.core_size=16", "agent.hidden=16", eval_games=4)
    assert records[-1]["agent_steps_trained"] >= 3000 and records[-1]["replayed_fraction"] > 0
    path = tmp_path / run_name / "checkpoints" / "latest.safetensors"
    _, metadata = read_checkpoint(path)
    check_network(metadata, cue_config("agent.core_size=16"), path)  # the same core: accepted
    with pytest.raises(CheckpointError,
                       match=r"torso mlp, core lstm \(core_size 16\); this config asks for torso mlp, core none"):
        check_network(metadata, cue_config("agent.core=none"), path)
