"""Several learners as one (distributed/learner/data_parallel.py): K=2 ranks on gloo, each updating on its own
batch with averaged gradients, end with the weights of one learner updating on the union of the batches."""

from __future__ import annotations

import json
import multiprocessing
import socket
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from impala_league import REPO
from impala_league.agents.model import make_model, policy_head
from impala_league.batch import Batch
from impala_league.config import AgentConfig, ConfigError, LearnerConfig, from_yaml_text, validate
from impala_league.distributed.learner.data_parallel import average_gradients, broadcast_state, join
from impala_league.distributed.learner.update import learn_step, make_optimizer
from impala_league.envs.registry import env_spec

T, B, UPDATES = 5, 3, 4
AGENT = AgentConfig(torso="mlp", hidden=32)
# A small clip, so that clipping happens at every update (each stats["grad_norm"] is above it), and a
# large Adam step: the ranks' and the union's weights part quickly if anything differs.
LEARNER = LearnerConfig(learning_rate=1e-2, grad_norm_clip=0.05)


def synthetic_batch(seed: int, spec) -> Batch:
    """B valid tic-tac-toe unrolls: random boards, legal actions under random masks, behaviour logits
    masked like an actor's, rewards and episode ends, one step cut by a time limit (with its final obs)."""
    g = torch.Generator().manual_seed(seed)
    A = spec.num_actions
    mask = (torch.rand(T + 1, B, A, generator=g) < 0.6).to(torch.uint8)
    mask[..., 0] = 1
    logits = torch.randn(T, B, A, generator=g).masked_fill(mask[:-1] == 0, -1e9)
    action = torch.multinomial(logits.softmax(-1).flatten(0, 1), 1, generator=g).view(T, B)
    done = torch.rand(T, B, generator=g) < 0.2
    truncated = torch.zeros(T, B, dtype=torch.bool)
    truncated[2, 1] = done[2, 1] = True
    obs = torch.randint(0, 2, (T + 1, B, *spec.obs_shape), generator=g, dtype=torch.int8)
    return Batch(obs=obs, action_mask=mask, action=action, reward=torch.randn(T, B, generator=g), done=done,
                 behaviour_logits=logits, truncated=truncated,
                 final_obs=torch.randint(0, 2, (1, *spec.obs_shape), generator=g, dtype=torch.int8),
                 final_t=torch.tensor([2]), final_b=torch.tensor([1]))


def union(a: Batch, b: Batch) -> Batch:
    """Two batches concatenated along B (final observations re-indexed to b's columns)."""
    return Batch(obs=torch.cat([a.obs, b.obs], 1), action_mask=torch.cat([a.action_mask, b.action_mask], 1),
                 action=torch.cat([a.action, b.action], 1), reward=torch.cat([a.reward, b.reward], 1),
                 done=torch.cat([a.done, b.done], 1), behaviour_logits=torch.cat([a.behaviour_logits,
                                                                                  b.behaviour_logits], 1),
                 truncated=torch.cat([a.truncated, b.truncated], 1), final_obs=torch.cat([a.final_obs, b.final_obs]),
                 final_t=torch.cat([a.final_t, b.final_t]), final_b=torch.cat([a.final_b, b.final_b + B]))


def _rank(rank: int, url: str, out: str) -> None:
    """One of two learner ranks: a model seeded by rank (rank 0 also one update alone, so it has Adam
    moments), rank 0's state broadcast, UPDATES updates on batch (update, rank) with averaged gradients,
    and the agreement on stopping."""
    torch.set_num_threads(1)
    spec = env_spec("tictactoe")
    group = join(rank, 2, url, torch.device("cpu"), timeout_s=30)
    torch.manual_seed(rank)
    model = make_model(spec, AGENT)
    optimizer = make_optimizer(model, LEARNER)
    if rank == 0:
        learn_step(model, optimizer, synthetic_batch(99, spec), LEARNER, policy_head(spec))
    meta = broadcast_state(model, optimizer, {"step": 1 if rank == 0 else 0}, group, torch.device("cpu"))
    norms = []
    for update in range(UPDATES):
        stats = learn_step(model, optimizer, synthetic_batch(100 * update + rank, spec), LEARNER, policy_head(spec),
                           reduce_gradients=lambda m: average_gradients(m, group))
        norms.append(stats["grad_norm"])
    agreed = group.agree((rank == 1, False), 0.25 if rank == 0 else 7.0, torch.device("cpu"))
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, f"{out}/rank{rank}.safetensors")
    Path(f"{out}/rank{rank}.json").write_text(json.dumps({"meta": meta, "norms": norms, "agreed": agreed}))
    group.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_ranks_hold_the_weights_of_one_learner_on_the_union_of_their_batches(tmp_path):
    ctx = multiprocessing.get_context("spawn")
    url = f"tcp://127.0.0.1:{_free_port()}"
    procs = [ctx.Process(target=_rank, args=(rank, url, str(tmp_path))) for rank in range(2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(90)
    assert [p.exitcode for p in procs] == [0, 0]

    spec = env_spec("tictactoe")
    torch.manual_seed(0)
    reference = make_model(spec, AGENT)
    optimizer = make_optimizer(reference, LEARNER)
    learn_step(reference, optimizer, synthetic_batch(99, spec), LEARNER, policy_head(spec))
    norms = []
    for update in range(UPDATES):
        both = union(synthetic_batch(100 * update, spec), synthetic_batch(100 * update + 1, spec))
        norms.append(learn_step(reference, optimizer, both, LEARNER, policy_head(spec))["grad_norm"])

    ranks = [load_file(tmp_path / f"rank{r}.safetensors") for r in range(2)]
    for name, expected in reference.state_dict().items():
        assert torch.equal(ranks[0][name], ranks[1][name]), name  # identical on both ranks, bit for bit
        torch.testing.assert_close(ranks[0][name], expected, atol=1e-6, rtol=0)
    info = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    # Clipped on the global gradient: both ranks saw the union's norm, above the clip at every update.
    for r in range(2):
        assert info[r]["norms"] == pytest.approx(norms, rel=1e-5)
    assert min(norms) > LEARNER.grad_norm_clip
    assert info[1]["meta"] == {"step": 1}  # rank 0's counters reached rank 1
    # Rank 1 alone wanted to stop: both stop; rank 0's value (the learning rate) reaches both.
    assert info[0]["agreed"] == info[1]["agreed"] == [[True, False], 0.25]


def test_one_learner_has_no_process_group():
    group = join(0, 1, None, torch.device("cpu"))
    assert not group.distributed and group.agree((True, False), 0.5, torch.device("cpu")) == ((True, False), 0.5)
    model = torch.nn.Linear(2, 1)
    model(torch.ones(1, 2)).sum().backward()
    before = model.weight.grad.clone()
    average_gradients(model, group)
    assert torch.equal(model.weight.grad, before)


def _cfg(*lines: str):
    return from_yaml_text("\n".join(lines))


@pytest.mark.parametrize("yaml, message", [
    ("learner: {num_learners: 0}", "learner.num_learners must be in [1, 64]"),
    ("learner: {num_learners: 65}", "learner.num_learners must be in [1, 64]"),
    ("learner: {num_learners: 2, algo: a3c}", "learner.num_learners > 1 needs learner.algo=impala"),
    ("learner: {num_learners: 3, batch_size: 32, prefetch_batches: 2}\nactor: {high_water_mark: 223}",
     "actor.high_water_mark must be >= 224"),
    ("learner: {num_learners: 2}\nleague: {enabled: true, main_exploiters: 1}",
     "learner.num_learners > 1 is not supported with league exploiters"),
])
def test_num_learners_is_validated(yaml, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[").replace("]", r"\]").replace("(", r"\(")):
        validate(_cfg(yaml))


def test_num_learners_with_a_league_without_exploiters_is_valid():
    validate(_cfg("learner: {num_learners: 2}\nleague: {enabled: true}"))
    validate(_cfg("learner: {num_learners: 3, batch_size: 32, prefetch_batches: 2}\nactor: {high_water_mark: 224}"))


def _train(tmp_path: Path, run_name: str, redis_url: str, *extra: str) -> list[str]:
    """run.py train with two learners on a tiny tic-tac-toe run (as tests/test_integration.py's)."""
    import sys

    return [sys.executable, str(REPO / "run.py"), "train", "--config", str(REPO / "configs/tictactoe.yaml"),
            "--redis-url", redis_url, "--eval-games", "0",
            "--set", f"run.name={run_name}", "--set", f"run.dir={tmp_path}", "--set", "run.wandb_mode=disabled",
            "--set", "run.log_every_s=1", "--set", "actor.num_actors=1", "--set", "actor.num_envs=4",
            "--set", "actor.unroll_length=8", "--set", "learner.batch_size=4", "--set", "actor.high_water_mark=16",
            "--set", "learner.num_learners=2", *extra]


def test_a_killed_rank_stops_the_run_naming_it_and_resume_trains_both_ranks_to_the_end(tmp_path, redis_server, run_name):
    import os
    import re
    import signal
    import subprocess

    from impala_league.agents.checkpoint import read_checkpoint
    from impala_league.distributed.wire.transport import GROUP, TrajectoryStream, connect

    run_dir = tmp_path / run_name
    proc = subprocess.Popen(_train(tmp_path, run_name, redis_server.url, "--set", "run.total_agent_steps=1000000"),
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=REPO)
    lines = []
    for line in proc.stdout:  # the launcher names each learner rank's pid
        lines.append(line)
        if "learner rank 1 (pid" in line:
            rank1 = int(re.search(r"learner rank 1 \(pid (\d+)\)", line).group(1))
            break
    r = connect(redis_server.url)
    deadline = time.monotonic() + 60
    while int(r.get(f"{run_name}:params:version") or 0) < 2:  # a few updates made
        assert time.monotonic() < deadline and proc.poll() is None, "".join(lines)
        time.sleep(0.05)
    os.kill(rank1, signal.SIGKILL)
    out = "".join(lines) + proc.communicate(timeout=90)[0]
    assert proc.returncode == 1, out
    assert f"learner rank 1 (pid {rank1}) was killed by SIGKILL" in out and "--resume" in out
    assert "collective failed" in out  # rank 0 did not wait for the dead rank: its collective failed
    stopped = json.loads(read_checkpoint(run_dir / "checkpoints" / "latest.safetensors")[1]["meta"])
    assert stopped["step"] > 0 and stopped["agent_steps_trained"] == stopped["step"] * 2 * 4 * 8

    total = stopped["agent_steps_trained"] + 512
    done = subprocess.run(_train(tmp_path, run_name, redis_server.url, "--resume", "--set", f"run.total_agent_steps={total}"),
                          capture_output=True, text=True, timeout=120, cwd=REPO)
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    meta = json.loads(read_checkpoint(run_dir / "checkpoints" / "latest.safetensors")[1]["meta"])
    # Global batch: 2 ranks x 4 unrolls x 8 steps per update; both ranks stopped at the same update.
    assert meta["agent_steps_trained"] >= total and meta["agent_steps_trained"] == meta["step"] * 64
    assert f"learner rank 1 done: {meta['step']:,} updates" in out
    assert f"learner rank 0 done: {meta['step']:,} updates" in out and out.count("; checkpoint ") == 1
    assert int(r.get(f"{run_name}:params:version")) == meta["step"]
    consumers = {c["name"].decode(): c["pending"] for c in r.xinfo_consumers(f"{run_name}:traj", GROUP)}
    host = socket.gethostname()
    assert {f"learner-{host}", f"learner-{host}-rank1"} <= set(consumers) and not any(consumers.values())
    counts = TrajectoryStream(r, run_name).accounting()
    # Each rank acked its own unrolls (rank 0 alone would have acked half); nothing was lost.
    assert counts["trained"] >= meta["step"] * 8 - 8  # an update lost with the killed rank is trained again
    assert counts["produced"] == counts["trained"] + counts["dead_lettered"] + counts["backlog"]
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in records] == sorted(x["step"] for x in records)  # one writer: rank 0


@pytest.mark.parametrize("extra, message", [
    (["--rank", "2", "--set", "learner.num_learners=2"], "--rank 2 is not in [0, 2)"),
    (["--dist-url", "tcp://127.0.0.1:1"], "--rank and --dist-url are for several learners"),
])
def test_run_py_learner_refuses_a_rank_outside_the_group(extra, message, capsys):
    import run

    code = run.main(["learner", "--config", str(REPO / "configs/tictactoe.yaml"), *extra])
    assert code == 2 and message in capsys.readouterr().err


def test_the_launcher_blames_the_rank_that_failed_not_the_ones_whose_collective_failed_after_it():
    import subprocess
    import sys

    from impala_league.distributed.launch.launcher import _failed_rank
    from impala_league.distributed.launch.ownership import PEER_LOST_EXIT

    def exited(code: int) -> subprocess.Popen:
        proc = subprocess.Popen([sys.executable, "-c", f"raise SystemExit({code})"])
        proc.wait()
        return proc

    casualty, culprit = exited(PEER_LOST_EXIT), exited(1)
    assert _failed_rank([casualty, culprit]) == f"learner rank 2 (pid {culprit.pid}) exited with code 1"
    assert _failed_rank([casualty, exited(0)]) is None
