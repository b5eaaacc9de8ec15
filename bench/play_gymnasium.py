"""Play an atari:<Game> checkpoint in an evaluator we did not write: gymnasium's own `ALE/<Game>-v5`
(frameskip=1, sticky actions off) under its `AtariPreprocessing` (30 no-op starts, frame skip 4 with the
max over the last two frames, 84x84 grayscale) and `FrameStackObservation(4)`, the policy loaded with
`agents.load_policy` and asked for one action per step. Prints each episode's score and their mean.

    python bench/play_gymnasium.py runs/atari_pong/checkpoints/latest.safetensors [--episodes 10] [--sample]
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

import ale_py  # noqa: E402
import gymnasium  # noqa: E402
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation  # noqa: E402

from impala_league.agents import load_policy  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("checkpoint")
    parser.add_argument("--episodes", type=int, default=10)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--sample", action="store_true", help="sample from pi instead of its most likely action")
    args = parser.parse_args()
    policy = load_policy(args.checkpoint, seed=args.seed)
    game = policy.config.env.name.removeprefix("atari:")
    gymnasium.register_envs(ale_py)
    env = FrameStackObservation(AtariPreprocessing(
        gymnasium.make(f"ALE/{game}-v5", frameskip=1, repeat_action_probability=0.0,
                       max_num_frames_per_episode=108_000), noop_max=30, frame_skip=4, screen_size=84), 4)
    scores = []
    for episode in range(args.episodes):
        observation, _ = env.reset(seed=args.seed + episode)
        policy.reset()
        score, reward, done = 0.0, 0.0, False
        while not done:
            observation, reward, terminated, truncated, _ = env.step(
                policy.act(observation, greedy=not args.sample, reward=reward))
            score += reward
            done = terminated or truncated
        scores.append(score)
        print(f"episode {episode + 1}: {score:+.0f}", flush=True)
    print(f"ALE/{game}-v5 under gymnasium's AtariPreprocessing + FrameStackObservation(4), "
          f"{'sampled' if args.sample else 'greedy'}: mean {statistics.mean(scores):+.1f} over {len(scores)} "
          f"episodes (min {min(scores):+.0f}, max {max(scores):+.0f})")


if __name__ == "__main__":
    main()
