"""The agent steps trained were once called `frames` in every file a run writes (impala_league/records.py):
files written before read as files written now, through the readers themselves, and new files say
`agent_steps_trained` only."""

from __future__ import annotations

import json
import time

import pytest

from impala_league.agents.checkpoint import read_checkpoint, read_meta, save_checkpoint
from impala_league.agents.model import make_model
from impala_league.analysis.compare import summarize
from impala_league.analysis.report import compare_section
from impala_league.analysis.runs import list_run_dirs, load_run
from impala_league.analysis.summary import end_summary
from impala_league.config import to_yaml
from impala_league.distributed.learner.checkpoints import Checkpoints
from impala_league.distributed.learner.update import make_optimizer
from impala_league.envs.registry import env_spec
from impala_league.league.state import Member
from impala_league.records import new_name, upgraded
from tests.distributed.test_faults import small_config

OLD, NEW = "frames", "agent_steps_trained"


def _keys(value) -> set[str]:
    """Every dict key in a parsed JSON value, at any depth."""
    if isinstance(value, dict):
        return set(value) | {k for v in value.values() for k in _keys(v)}
    return {k for v in value for k in _keys(v)} if isinstance(value, list) else set()


def test_old_keys_get_their_new_names_at_any_depth_and_nothing_else_changes():
    old = {"step": 4, "frames": 640, "emulator_frames": 2560, "max_episode_frames": 400,
           "over_training": [{"step": 2, "frames": 320, "games": 3}],
           "equal_frames": 600, "variants": {"a": {"score_at_equal_frames": 0.5, "score_at_equal_frames_ci95": 0.1,
                                                   "score_at_equal_wall_clock": 0.4}}}
    assert upgraded(old) == {"step": 4, NEW: 640, "emulator_frames": 2560, "max_episode_frames": 400,
                             "over_training": [{"step": 2, NEW: 320, "games": 3}],
                             "equal_agent_steps": 600,
                             "variants": {"a": {"score_at_equal_agent_steps": 0.5,
                                                "score_at_equal_agent_steps_ci95": 0.1,
                                                "score_at_equal_wall_clock": 0.4}}}
    new = upgraded(old)
    assert upgraded(new) == new  # a record written now is read as it is
    assert upgraded({OLD: 1, NEW: 2}) == {NEW: 2}  # both names: the new one's value
    assert new_name("frames_per_step") == "frames_per_step" and upgraded([1, "frames"]) == [1, "frames"]


def _run_dir(tmp_path, name, key):
    """A run directory as `run.py train` leaves it, every count of agent steps trained under `key`."""
    run_dir = tmp_path / name
    (run_dir / "checkpoints").mkdir(parents=True)
    (run_dir / "config.yaml").write_text(to_yaml(small_config(name, tmp_path)))
    records = [{"time": 1000.0 + 10 * i, "elapsed_s": 10.0 * i, "step": 4 * i, key: 640 * i, "sps": 64.0,
                "policy_lag": 1.0, "episode_return": 0.1 * i} for i in range(1, 4)]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    (run_dir / "checkpoints" / "latest.json").write_text(json.dumps({"step": 12, key: 1920, "elapsed_s": 30.0}))
    seats = {"player_0": {"seat": 0, "games": 2, "wins": 1, "draws": 0, "losses": 1, "win_rate": 0.5,
                          "draw_rate": 0.0, "loss_rate": 0.5, "score": 0.5}}
    (run_dir / "evaluation.json").write_text(json.dumps({
        "checkpoint": "c", "step": 12, key: 1920, "seed": 0, "games": 2, "opponents": {"random": seats},
        "over_training": [{"checkpoint": "h", "step": 4, key: 640, "games": 2, "opponents": {"random": seats}},
                          {"checkpoint": "c", "step": 12, key: 1920, "games": 2, "opponents": {"random": seats}}]}))
    return run_dir


def test_a_run_directory_written_with_frames_reads_the_same_agent_steps_as_one_written_now(tmp_path):
    old, new = load_run(_run_dir(tmp_path, "old", OLD)), load_run(_run_dir(tmp_path, "new", NEW))
    steps = lambda run: ([r[NEW] for r in run.records], run.evaluation[NEW],
                         [e[NEW] for e in run.evaluation["over_training"]])
    assert steps(old) == steps(new) == ([640, 1280, 1920], 1920, [640, 1920])
    assert [r[NEW] for r in list_run_dirs(tmp_path)] == [1920, 1920]  # `run.py runs`, from latest.json
    assert end_summary(tmp_path / "old", "old")[0] == end_summary(tmp_path / "new", "new")[0]
    assert end_summary(tmp_path / "old", "old")[0].startswith("trained 1,920 agent steps")


def test_compare_json_written_with_frames_shows_the_same_table(tmp_path):
    """compare.json of a compare run before the rename, shown by `run.py report`: the same page as now."""
    runs = {"impala": [load_run(_run_dir(tmp_path / "runs", "impala", NEW))]}
    summary = summarize(runs)
    assert summary["equal_agent_steps"] == 1920 and summary["variants"]["impala"][NEW] == 1920
    assert "score_at_equal_agent_steps_ci95" in summary["variants"]["impala"]
    assert not any("frames" in key for key in _keys(summary))  # written now: no old key
    pages = []
    for name, text in (("new", json.dumps(summary)),
                       ("old", json.dumps(summary).replace("agent_steps_trained", "frames")
                        .replace("equal_agent_steps", "equal_frames"))):
        (tmp_path / name).mkdir()
        (tmp_path / name / "compare.json").write_text(text)
        pages.append(compare_section(tmp_path / name, 0).replace(f"comparison: {name}", ""))
    assert "frames" in (tmp_path / "old" / "compare.json").read_text()
    assert pages[0] == pages[1] and "equal agent steps 1,920" in pages[0]


def test_a_checkpoint_written_with_frames_resumes_at_the_same_agent_steps(tmp_path, run_name):
    cfg = small_config(run_name, tmp_path)
    model = make_model(env_spec("tictactoe"), cfg.agent)
    saved = Checkpoints(cfg, tmp_path / run_name, "main", "tictactoe", True, "learner")
    saved.start(time.monotonic())
    saved.unrolls_trained, saved.league_resets = 3, 0
    optimizer = make_optimizer(model, cfg.learner)
    saved.save(model, optimizer, step=3, agent_steps=24)
    metadata = read_checkpoint(saved.path)[1]
    meta = json.loads(metadata["meta"])
    assert meta[NEW] == 24 and OLD not in meta  # written now: the new key only
    assert json.loads(saved.path.with_suffix(".json").read_text())[NEW] == 24

    def restored() -> tuple[int, int]:
        return Checkpoints(cfg, tmp_path / run_name, "main", "tictactoe", True, "learner").restore(
            model, make_optimizer(model, cfg.learner))

    assert restored() == (3, 24) and read_meta(saved.path)[NEW] == 24
    old = {("frames" if k == NEW else k): v for k, v in meta.items()}
    save_checkpoint(saved.path, model, optimizer, metadata["config"], old)  # as a learner before the rename
    assert OLD in json.loads(read_checkpoint(saved.path)[1]["meta"])
    assert restored() == (3, 24) and read_meta(saved.path)[NEW] == 24


@pytest.mark.parametrize("key", [OLD, NEW])
def test_a_league_snapshot_record_with_either_name_restores_its_agent_steps(key):
    info = {"kind": "snapshot", "id": "main-0000100", "player": "main", "role": "main", "step": 100, key: 1234,
            "parent": None, "created": 1700000000.5}
    member = Member.from_json("main-0000100", info)
    assert member.agent_steps == 1234
    assert member.to_json()[NEW] == 1234 and OLD not in member.to_json()
