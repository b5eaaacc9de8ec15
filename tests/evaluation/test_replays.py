"""Tests for evaluation/replays.py and `run.py evaluate --record` / `run.py replay`."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

import run
from impala_league.evaluation.replays import ReplayError, load_replay, simulate


@pytest.fixture(scope="module")
def recorded(tmp_path_factory) -> Path:
    """Replays of a real connect-four round-robin (minimax:2, random) and tic-tac-toe games."""
    directory = tmp_path_factory.mktemp("replays")
    assert run.main(["evaluate", "--players", "minimax:2", "random", "--env", "connect_four", "--games", "3",
                     "--record", str(directory / "c4"), "--json", str(directory / "c4.json")]) == 0
    assert run.main(["evaluate", "--players", "minimax:9", "tactical", "--env", "tictactoe", "--games", "2",
                     "--record", str(directory / "ttt")]) == 0
    return directory


def test_every_game_is_recorded_and_re_simulates_to_its_outcome(recorded):
    files = sorted((recorded / "c4").glob("*.json"))
    assert [f.name for f in files] == [f"minimax_2-vs-random-000{k}.json" for k in range(3)] + \
        [f"random-vs-minimax_2-000{k}.json" for k in range(3)]
    result = json.loads((recorded / "c4.json").read_text())
    minimax_first = result["matches"][0]
    assert minimax_first["first"] == "minimax:2"
    replays = [load_replay(f) for f in files[:3]]
    assert sum(r.winner == 0 for r in replays) == minimax_first["first_wins"]
    for f, replay in zip(files, [*replays, *(load_replay(f) for f in files[3:])]):
        assert replay.env == "connect_four" and replay.env_version == "connect_four_v3"
        assert replay.seats == ["player_0", "player_1"] and replay.length == len(replay.actions)
        positions = simulate(replay, f)
        assert len(positions) == replay.length + 1
        assert replay.winner is None or replay.rewards[replay.winner] == 1.0
    assert replays[0].seed == minimax_first["seed"] and replays[2].seed == minimax_first["seed"] + 2


def tampered(source: Path, target: Path, **changes) -> Path:
    data = json.loads(source.read_text())
    data.update(changes)
    target.write_text(json.dumps(data))
    return target


def test_tampered_replays_are_rejected_naming_the_file(recorded, tmp_path):
    source = recorded / "c4" / "minimax_2-vs-random-0000.json"
    data = json.loads(source.read_text())
    actions, winner = data["actions"], data["winner"]
    assert winner is not None  # minimax:2 wins these
    # Another first move: the game no longer ends as recorded (or a later move becomes illegal).
    changed = [(actions[0] + 1) % 7, *actions[1:]]
    cases = {
        "action.json": dict(actions=changed),
        "outcome.json": dict(winner=1 - winner, rewards=data["rewards"][::-1]),
        "winner.json": dict(winner=None),
        "rewards.json": dict(rewards=[0.0, 0.0]),
        "short.json": dict(actions=actions[:-1], length=len(actions) - 1),
        "long.json": dict(actions=actions + [0], length=len(actions) + 1),
        "illegal.json": dict(actions=[7, *actions[1:]]),
        "version.json": dict(env_version="connect_four_v2"),
        "length.json": dict(length=len(actions) + 5),
    }
    for name, change in cases.items():
        path = tampered(source, tmp_path / name, **change)
        with pytest.raises(ReplayError, match=name.replace(".", r"\.")) as info:
            simulate(load_replay(path), path)
        print(name, "->", info.value)
    with pytest.raises(ReplayError, match=r"illegal\.json: action 1 \(7, by player_0\) is illegal"):
        path = tmp_path / "illegal.json"
        simulate(load_replay(path), path)
    with pytest.raises(ReplayError, match=r"recorded with connect_four_v2, but this build plays connect_four as "
                                          r"connect_four_v3"):
        path = tmp_path / "version.json"
        simulate(load_replay(path), path)


def test_unreadable_replays_are_rejected_naming_the_file(recorded, tmp_path):
    source = recorded / "c4" / "minimax_2-vs-random-0000.json"
    (tmp_path / "garbage.json").write_text("{not json")
    with pytest.raises(ReplayError, match=r"garbage\.json: not a JSON replay"):
        load_replay(tmp_path / "garbage.json")
    with pytest.raises(ReplayError, match=r"format\.json: replay format 3; this build reads formats 1, 2"):
        load_replay(tampered(source, tmp_path / "format.json", format=3))
    with pytest.raises(ReplayError, match=r"types\.json: 'actions' must be a list of integers"):
        load_replay(tampered(source, tmp_path / "types.json", actions=["3"]))
    with pytest.raises(ReplayError, match=r"missing\.json: cannot read the replay"):
        load_replay(tmp_path / "missing.json")


def test_replay_command_shows_every_move_and_the_verified_outcome(recorded, capsys):
    path = recorded / "ttt" / "minimax_9-vs-tactical-0000.json"
    replay = load_replay(path)
    assert run.main(["replay", str(path)]) == 0
    out = capsys.readouterr().out
    # PettingZoo's cell numbering of tic-tac-toe (column by column), as its renderer draws it.
    assert out.startswith("start: minimax:9 (X, player_1) vs tactical (O, player_2)\n0 3 6\n1 4 7\n2 5 8\n")
    assert out.count("\nmove ") == replay.length
    assert "re-simulated and verified" in out
    assert run.main(["replay", str(path), "--final"]) == 0
    final = capsys.readouterr().out
    assert final.startswith(f"move {replay.length}/{replay.length}: ")
    board = "".join(final.splitlines()[1:4])
    assert board.count("X") == (replay.length + 1) // 2 and board.count("O") == replay.length // 2


def test_replay_command_rejects_a_tampered_file_with_exit_2(recorded, tmp_path, capsys):
    source = recorded / "c4" / "random-vs-minimax_2-0001.json"
    data = json.loads(source.read_text())
    path = tampered(source, tmp_path / "bad.json", winner=None if data["winner"] is not None else 0)
    assert run.main(["replay", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path}: re-simulated outcome") and err.count("\n") == 1


def test_tictactoe_text_board_is_drawn_as_the_gif_draws_it():
    """Each first move lands, in the text board, where the env's own rendering (the GIF) draws it."""
    from impala_league.envs.registry import make_raw_env
    from impala_league.evaluation.replays import ascii_board

    for action in range(9):
        env = make_raw_env("tictactoe", "rgb_array")
        env.reset(seed=0)
        before = np.asarray(env.render()).astype(int)
        env.step(action)
        after = np.asarray(env.render())
        ys, xs = np.nonzero(np.abs(after.astype(int) - before).sum(-1))
        row, col = int(3 * ys.mean() // after.shape[0]), int(3 * xs.mean() // after.shape[1])
        text = ascii_board("tictactoe", env.observe("player_1")["observation"]).splitlines()
        assert text[row].split()[col] == "X", (action, text)
        assert sum(line.count("X") for line in text) == 1
        env.close()
        # The empty board's number at that place is the action itself.
        empty = ascii_board("tictactoe", np.zeros((3, 3, 2), np.int8)).splitlines()
        assert empty[row].split()[col] == str(action)


def test_gif_has_one_frame_per_move_plus_the_start(recorded, tmp_path, capsys):
    for path in (recorded / "c4" / "minimax_2-vs-random-0001.json", recorded / "ttt" / "tactical-vs-minimax_9-0000.json"):
        gif = tmp_path / f"{path.stem}.gif"
        assert run.main(["replay", str(path), "--final", "--gif", str(gif)]) == 0
        with Image.open(gif) as image:
            assert image.format == "GIF" and image.n_frames == load_replay(path).length + 1
        assert f"({load_replay(path).length + 1} frames)" in capsys.readouterr().out


def test_old_evaluate_form_records_replays_too(tmp_path, capsys):
    from tests.evaluation.test_tournament import write_checkpoint

    checkpoint = write_checkpoint(tmp_path / "run" / "checkpoints" / "latest.safetensors")
    assert run.main(["evaluate", "--checkpoint", str(checkpoint), "--opponent", "random", "--games", "2",
                     "--record", str(tmp_path / "rec")]) == 0
    names = sorted(p.name for p in (tmp_path / "rec").iterdir())
    assert names == ["random-vs-run_main-0000.json", "random-vs-run_main-0001.json",
                     "run_main-vs-random-0000.json", "run_main-vs-random-0001.json"]
    for name in names:
        replay = load_replay(tmp_path / "rec" / name)
        assert "run/main" in replay.players and replay.env == "tictactoe"
        simulate(replay, tmp_path / "rec" / name)


def test_an_unwritable_record_directory_exits_2(tmp_path, capsys):
    blocker = tmp_path / "file"
    blocker.write_text("")
    assert run.main(["evaluate", "--players", "random", "tactical", "--env", "tictactoe", "--games", "1",
                     "--record", str(blocker / "replays")]) == 2
    assert capsys.readouterr().err.startswith("error: --record: cannot create the directory")


def test_save_match_never_overwrites_and_numbers_a_taken_name(recorded, tmp_path):
    from impala_league.evaluation.evaluate import GameRecord
    from impala_league.evaluation.replays import save_match

    source = load_replay(recorded / "ttt" / "minimax_9-vs-tactical-0000.json")
    game = GameRecord(source.seed, tuple(source.actions), tuple(source.rewards), source.winner, source.length)
    first = save_match(tmp_path, "tictactoe", ("k9/main", "random"), [game])
    before = first[0].read_text()
    again = save_match(tmp_path, "tictactoe", ("k9_main", "random"), [game, game])
    third = save_match(tmp_path, "tictactoe", ("k9:main", "random"), [game])
    assert [p.name for p in first + again + third] == [
        "k9_main-vs-random-0000.json", "k9_main-vs-random-0000-2.json", "k9_main-vs-random-0001.json",
        "k9_main-vs-random-0000-3.json"]
    assert first[0].read_text() == before and load_replay(first[0]).players == ["k9/main", "random"]
    assert load_replay(third[0]).players == ["k9:main", "random"]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(p.name for p in first + again + third)


def test_players_and_rewards_must_be_one_per_seat(recorded, tmp_path, capsys):
    source = recorded / "c4" / "minimax_2-vs-random-0000.json"
    data = json.loads(source.read_text())
    cases = {
        "one_player.json": (dict(players=["a"]), r"'players' has 1 entries; connect_four has 2 seats"),
        "three_players.json": (dict(players=["a", "b", "c"]), r"'players' has 3 entries"),
        "no_rewards.json": (dict(rewards=[]), r"'rewards' has 0 entries"),
        "three_rewards.json": (dict(rewards=[*data["rewards"], 0.0]), r"'rewards' has 3 entries"),
        "one_draw_reward.json": (dict(rewards=[0.0], winner=None), r"'rewards' has 1 entries"),
    }
    for name, (change, message) in cases.items():
        path = tampered(source, tmp_path / name, **change)
        with pytest.raises(ReplayError, match=name.replace(".", r"\.") + ": " + message):
            simulate(load_replay(path), path)
        assert run.main(["replay", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.startswith(f"error: {path}: ") and err.count("\n") == 1, err
    with pytest.raises(ReplayError, match=r"names\.json: 'players' must be a list of strings"):
        load_replay(tampered(source, tmp_path / "names.json", players=[1, 2]))


def test_a_bad_gif_path_is_an_error_not_a_traceback(recorded, tmp_path, capsys):
    from impala_league.evaluation.replays import check_gif_path

    path = recorded / "ttt" / "minimax_9-vs-tactical-0000.json"
    (tmp_path / "dir.gif").mkdir()
    cases = {str(tmp_path / "x.txt"): "the file name must end in .gif", str(tmp_path): "it is a directory",
             str(tmp_path / "dir.gif"): "it is a directory", str(tmp_path / "nowhere" / "x.gif"): "no directory"}
    for gif, message in cases.items():
        with pytest.raises(ReplayError, match=f"cannot write the GIF .*: {message}"):
            check_gif_path(gif)
        assert run.main(["replay", str(path), "--final", "--gif", gif]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"error: cannot write the GIF {gif}: {message}") and err.count("\n") == 1, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir.gif"]
    assert check_gif_path(tmp_path / "Game.GIF") == tmp_path / "Game.GIF"
