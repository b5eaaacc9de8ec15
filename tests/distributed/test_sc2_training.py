"""StarCraft II through the real stack: SC2 unrolls over the wire, the learner's multi-head V-trace
update, and a short run.py train against pysc2's mock env with 2 actors, the learner and real Redis."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import numpy as np
import pytest
import torch

from impala_league import REPO
import impala_league.envs.sc2_wrappers  # noqa: F401  (imports pysc2 through the shim)
from impala_league.agents.checkpoint import read_checkpoint
from impala_league.agents.model import make_model, policy_head
from impala_league.batch import Batch
from impala_league.config import LearnerConfig, load_config
from impala_league.distributed.actor import UnrollBuffer
from impala_league.distributed.learner.update import learn_step
from impala_league.distributed.wire.codec import UnrollSpec, decode_unroll, encode_unroll
from impala_league.distributed.wire.transport import GROUP
from impala_league.envs.registry import env_spec, make_env

KWARGS = {"mock": True, "screen_size": 8, "minimap_size": 8}
NAME = "sc2:MoveToBeacon"


def _unrolls(model, head, T: int, n: int) -> list[dict[str, np.ndarray]]:
    """n unrolls of length T from the mock env, sampled from `model`, through encode/decode."""
    spec = env_spec(NAME, KWARGS)
    uspec = UnrollSpec(spec, T)
    env, buffer, out = make_env(NAME, 0, KWARGS), UnrollBuffer(uspec), []
    generator = torch.Generator().manual_seed(0)
    step = env.advance()
    while len(out) < n:
        for s in step.settlements:
            buffer.settle(s.reward + 1.0, s.done)  # +1: a reward the mock does not give, so returns vary
        unroll = buffer.observe(step.observations[0], step.action_masks[0])
        if unroll is not None:
            _, decoded = decode_unroll(encode_unroll(unroll, unroll_id=str(len(out)), policy_version=0, actor_id=0,
                                                     env=NAME), uspec)
            out.append(decoded)
        obs = {k: torch.as_tensor(v)[None] for k, v in step.observations[0].items()}
        mask = torch.as_tensor(step.action_masks[0])[None]
        with torch.no_grad():
            logits, _ = model(obs, mask)
        action, behaviour = head.sample(logits, mask, torch.zeros(1), generator)
        buffer.record_action(action[0].numpy(), behaviour[0].numpy())
        env.act([action[0].numpy()])
        step = env.advance()
    return out


def test_unrolls_carry_masks_and_heads_and_log_rhos_sum_the_used_heads():
    torch.manual_seed(0)
    cfg = load_config(None, [f"env.name={NAME}", "env.kwargs={mock: true, screen_size: 8, minimap_size: 8}",
                             "agent.torso=fullyconv", "league.bots=[]", "agent.hidden=16"])
    spec = env_spec(NAME, KWARGS)
    model, head = make_model(spec, cfg.agent), policy_head(spec)
    unrolls = _unrolls(model, head, T=5, n=3)
    u = unrolls[0]
    assert u["obs.screen"].shape == (6, 27, 8, 8) and u["action"].shape == (5, 14)
    assert u["action_mask"].shape == (6, 573) and u["behaviour_log_probs"].shape == (5, 14)
    assert u["done"].tolist() == [0, 0, 0, 0, 0] and unrolls[1]["done"].tolist() == [0, 0, 0, 0, 1]
    # Unused heads hold action 0 and log-prob 0; used ones a log-prob < 0.
    used = head.codec.used_heads(torch.from_numpy(u["action"][:, 0].copy())).numpy()
    assert (u["action"][~used] == 0).all() and (u["behaviour_log_probs"][~used] == 0).all()
    assert (u["behaviour_log_probs"][used] < 0).all()
    # Make mu differ from pi by exactly 0.1 nats on every head an action uses: log_rho = 0.1 * (heads used).
    batch = Batch.stack(unrolls, torch.device("cpu"))
    used = head.codec.used_heads(batch.action[..., 0])
    batch.behaviour_logits = batch.behaviour_logits - 0.1 * used
    learner_cfg = LearnerConfig(clip_rho_threshold=None, clip_pg_rho_threshold=None, clip_c_threshold=None)
    stats = learn_step(model, torch.optim.SGD(model.parameters(), lr=0.0), batch, learner_cfg, head)
    expected = np.exp(0.1 * used.sum(-1).double().numpy()).mean()
    assert stats["mean_rho"] == pytest.approx(expected, rel=1e-4)
    assert expected > math.exp(0.1)  # functions with arguments are among the actions
    assert all(math.isfinite(v) for v in stats.values())


def test_short_training_run_against_the_mock_env(tmp_path, redis_server, run_name):
    from impala_league.distributed.wire.transport import connect

    cmd = [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / "configs/sc2_move_to_beacon.yaml"),
           "--redis-url", redis_server.url,
           "--set", f"run.name={run_name}", "--set", f"run.dir={tmp_path}", "--set", "run.wandb_mode=disabled",
           "--set", "run.total_agent_steps=160", "--set", "run.log_every_s=1",
           "--set", "env.kwargs={mock: true, screen_size: 8, minimap_size: 8, step_mul: 8}",
           "--set", "agent.hidden=32", "--set", "actor.num_actors=1", "--set", "actor.num_envs=2",
           "--set", "actor.unroll_length=8", "--set", "learner.batch_size=4", "--set", "actor.high_water_mark=8"]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=120, cwd=REPO)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "no baseline-bot evaluation" in proc.stdout
    meta = json.loads(read_checkpoint(tmp_path / run_name / "checkpoints" / "latest.safetensors")[1]["meta"])
    assert meta["agent_steps_trained"] >= 160 and meta["step"] == meta["agent_steps_trained"] // 32  # T * B = 32 agent steps per update
    r = connect(redis_server.url)
    assert int(r.get(f"{run_name}:params:version")) == meta["step"]
    assert int(r.get(f"{run_name}:deadletter:count") or 0) == 0  # every SC2 unroll decoded
    group = next(g for g in r.xinfo_groups(f"{run_name}:traj") if g["name"].decode() == GROUP)
    assert group["pending"] == 0
    sent = sum(int(m) for m in re.findall(r"sent (\d+) unrolls", proc.stdout))
    assert sent == meta["step"] * 4 + r.xlen(f"{run_name}:traj")
    records = [json.loads(line) for line in (tmp_path / run_name / "metrics.jsonl").read_text().splitlines()]
    trained = [rec for rec in records if "loss" in rec]
    assert trained and all(math.isfinite(rec["loss"]) and rec["entropy"] > 0 for rec in trained)
