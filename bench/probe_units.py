"""Which of a pixel network's ReLU units still respond to the screen: play a game of the checkpoint's own
Atari env (atari:<Game>, or atari2p:<game> seen from the first seat) with uniformly random actions, feed
the frames to each checkpoint, and print per layer of the torso (agents.redo's recyclable layers: both
convs and the FC of the shallow torso) the share of units that are not 0 on every frame, and the spread of
the value over the frames. A network whose torso has died shows shares near 0 and a value std near 0.

    python bench/probe_units.py runs/atari_boxing_league/league/snapshots/main-*.safetensors [--steps 400]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from impala_league.agents import load_policy  # noqa: E402
from impala_league.agents.redo import unit_scores  # noqa: E402


def random_game_frames(env_name: str, kwargs: dict, steps: int, seed: int) -> torch.Tensor:
    """uint8 [steps, C, 84, 84]: what the first player sees over `steps` steps of random play."""
    rng = np.random.default_rng(seed)
    frames = []
    if env_name.startswith("atari2p:"):
        from impala_league.envs.atari2p import make_atari2p
        env = make_atari2p(env_name.removeprefix("atari2p:"), kwargs)
        obs, _ = env.reset(seed=seed)
        first = env.agents[0]
        while len(frames) < steps:
            frames.append(obs[first])
            obs, _, term, trunc, _ = env.step({a: int(rng.integers(env.action_space(a).n)) for a in env.agents})
            if any(term.values()) or any(trunc.values()):
                obs, _ = env.reset(seed=seed + len(frames))
    elif env_name.startswith("atari:"):
        from impala_league.envs.atari import make_atari
        env = make_atari(env_name.removeprefix("atari:"), kwargs)
        obs, _ = env.reset(seed=seed)
        while len(frames) < steps:
            frames.append(obs)
            obs, _, terminated, truncated, _ = env.step(int(rng.integers(env.action_space.n)))
            if terminated or truncated:
                obs, _ = env.reset(seed=seed + len(frames))
    else:
        raise SystemExit(f"{env_name}: this probe plays atari:<Game> and atari2p:<game> only")
    return torch.from_numpy(np.stack(frames))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoints", nargs="+")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--seed", type=int, default=3)
    args = parser.parse_args()
    torch.set_num_threads(1)
    first = load_policy(args.checkpoints[0])
    env = first.config.env
    frames = random_game_frames(env.name, dict(env.kwargs or {}), args.steps, args.seed)
    print(f"{env.name}, {len(frames)} steps of random play; share of units alive per torso layer")
    for path in args.checkpoints:
        model = load_policy(path).model
        alive = [f"{float((s > 0).float().mean()):.2f}" for s in unit_scores(model, frames)]
        with torch.no_grad():
            _, values = model(frames, torch.ones(len(frames), model.num_actions))
        print(f"{Path(path).name}: alive {' / '.join(alive)}  value std {float(values.std()):.4f}")


if __name__ == "__main__":
    main()
