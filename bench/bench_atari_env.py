"""Atari emulator paths side by side: agent steps per second on one core, the same preprocessing; and
two-player Atari (`atari2p:<game>`) beside single-player, agent steps per core.

An actor is one process per core, so each path runs single-threaded here (ale-py's and envpool's
vector envs with one thread, OpenCV with one thread), N games, random actions, in one process one
after the other:

* `gymnasium`: one gymnasium env per game (`ALE/<Game>-v5` under `AtariPreprocessing` and
  `FrameStackObservation`, envs/atari.py), the reference;
* `ale_vector`: ale-py's C++ `AtariVectorEnv` holding all N games (envs/atari_vector.py);
* `envpool`: envpool's Atari vector env, when it imports (it is not in requirements.txt:
  `pip install envpool==1.2.5`, which pulls about 300 MB of envpool's asset packages; 1.2.5 was seen to
  import and step with numpy 2.4. Without it, or when it fails to import, the table says why and goes on).

* `2p_adapters`: `atari2p:<game2p>` as one `ParallelAdapter` over `envs.atari2p.Preprocessed` per game
  (what `make_env` builds: PettingZoo's `step` per frame), actor level only;
* `2p_group`: the same games in one `envs.atari2p_vector.Atari2pGroup` (what an actor's `make_envs`
  builds), actor level only.

Each at two levels: `emulator`, the env's own `step` on a batch of actions (the gymnasium envs one by
one, resetting a finished one); `actor`, what an actor pays per step of its envs: our adapters
(`envs.registry.make_envs`: `act` then `advance` on every env, the settlements and episode results)
and the batch of observations that the actor's forward pass takes (`distributed.actor.stacked`: a
vector env's own array where the observations are its rows, else `np.stack`). envpool has no adapter
here: emulator level only. The table gives agent steps (one action of one player, 4 emulator frames)
per wall second and per CPU second of this process (CPU / wall shows a path that uses more than one
core, e.g. a thread that spins while it waits), and each path's ratio to gymnasium's at that level.
On a busy machine the per-CPU-second numbers are the ones to compare, best of a few `--rounds`.
Building and resetting the envs is left out of the times.

The last lines compare the two players' rate with one player's: agent steps (each player's action
is one) per CPU second and per wall second of `2p_adapters` and `2p_group` over `ale_vector`'s at
actor level, the rate of the path an actor of `atari:<Game>` uses. A two-player env step plays 4
emulator frames for 2 agent steps, so per agent step the emulation is half of one player's; what
the two-player path adds is the second player's frame stack and settlement.

    python bench/bench_atari_env.py [--game Pong] [--game2p boxing] [--envs 16] [--steps 1000]
        [--paths gymnasium,ale_vector,envpool,2p_adapters,2p_group]

Frame copies between the emulator and the Redis entry, per agent step (84x84 grayscale, stack of 4:
a frame is 7 KB, a stack 28 KB; a raw screen is 210x160, 33.6 KB in gray, 100.8 KB in RGB):

gymnasium path (ale-py's `AtariEnv` with frameskip=1 under gymnasium's wrappers):
  1. 4 x gray screen: `AtariEnv.step` returns a new 210x160 array (`obs_type="grayscale"`, envs/atari.py;
     RGB would be 3x that) for each of the 4 emulator frames; `AtariPreprocessing` throws it away;
  2. 2 x gray screen: `ale.getScreenGrayscale(buffer)` of the last two frames into the pooling buffers;
  3. max of the two in place (`np.maximum(out=)`: no new buffer);
  4. 1 x frame: `cv2.resize` (INTER_AREA) into a new 84x84 array;
  5. 2 x stack: `FrameStackObservation` stacks its deque into its buffer (`np.stack(out=)`) and returns a
     `deepcopy` of it;
  (our observation encoder checks the uint8 bounds, a read of the stack, and copies nothing).
ale_vector path (ale-py's C++ vector env, from its source, src/ale/vector/; in C++, no Python object
per frame):
  1. 2 x gray screen: the last two frames' palette to grayscale into two raw buffers;
  2. max in place, `cv::resize` into a frame buffer, 1 x frame pushed into the C++ frame stack;
  3. 2 x stack: the stack assembled into the step's result, then copied into the [N, 4, 84, 84] NumPy
     array `step` returns (a new array every step: each slot's observation is a view of its row, no
     copy); a cut game's final stack is copied once more (`final_obs`, per episode, not per step).
envpool: as ale_vector (its C++ is the same design: gray frames, max, resize, stack, one copy out).
Both paths, in the actor (distributed/actor.py) and the wire format (distributed/wire/codec.py):
  a. 1 x stack: `UnrollBuffer.observe` writes the observation into the unroll's [T+1, ...] array
     (learning streams only). This is the one copy between the emulator and the wire:
  b. the forward pass reads the acting agents' observations as one batch: with ale_vector, whose
     slots' observations are the rows of the array `step` returned, that array itself (`stacked`, no
     copy); otherwise `np.stack` makes the batch (a copy for the network, not on the way to the wire);
     a bot opponent's moves are stacked for the bot;
  c. a finished unroll keeps the buffer's arrays (no copy); the next unroll gets new ones, and step T
     is written to its step 0 (1/T of a stack per agent step);
  d. `encode_unrolls` hands each unroll's array to the zstd compressor in place, as one frame for the
     entry's `send_batch` unrolls (no stacked array is built); without compression the arrays' bytes are
     joined into the message's bytes once;
  e. `msgpack.packb` copies the (compressed) bytes into the message: with zstd about 0.005 of the
     frames' bytes. redis-py hands large arguments to the socket without joining them (not counted).
2p_group (envs/atari2p_vector.py; per env step, i.e. per 2 agent steps):
  1. 2 x gray screen: the emulator's palette to grayscale into the game's two pooling buffers
     (`getScreenGrayscale`, no other screen is read: PettingZoo's RAM read is left out);
  2. max in place, for all games in one call; 1 x frame: one `cv2.resize` into the group's frames;
  3. 2 x stack: every player's row of a new [N * players, 4 + players, 84, 84] array, the older frames
     and the players' planes copied from the last step's array, the new frame written in; a player's
     observation is a view of its row (no copy), and with every seat learning the forward pass reads
     the array itself; a truncated game's final stacks are copied once more (per episode).
2p_adapters: per frame PettingZoo reads the RAM into a new array; per step the pooled screens and
  resize as in 2p_group, then `np.stack` of the deque (1 x stack) and per player a concatenation with
  its planes (2 x stack), and the observation encoder reads each stack twice (min and max).
So per agent step: gymnasium ~ 6 gray screens + 1 frame + 2 stacks before the actor;
ale_vector ~ 2 gray screens + 1 frame + 2 stacks, in C++; then 1 stack copy in the actor (+ 1/T), and
with zstd the compressed bytes only (without compression: 2 more, the join and msgpack's).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402

from impala_league.envs import atari  # noqa: E402
from impala_league.distributed.actor import stacked  # noqa: E402
from impala_league.envs.registry import env_spec, make_env, make_envs  # noqa: E402

PATHS = ("gymnasium", "ale_vector", "envpool", "2p_adapters", "2p_group")
ENVPOOL_INSTALL = "pip install envpool==1.2.5"


def _timed(run) -> tuple[float, float]:
    """(wall seconds, CPU seconds of this process) of `run()`."""
    wall, cpu = time.perf_counter(), time.process_time()
    run()
    return time.perf_counter() - wall, time.process_time() - cpu


def gymnasium_emulator(game: str, kwargs: dict, actions: np.ndarray, seed: int) -> tuple[float, float]:
    """N gymnasium envs stepped one by one; a finished game is reset (its reset timed too, as in play)."""
    envs = [atari.make_atari(game, kwargs) for _ in range(actions.shape[1])]
    for k, env in enumerate(envs):
        env.reset(seed=seed + k)

    def run():
        for row in actions:
            for env, action in zip(envs, row):
                _, _, terminated, truncated, _ = env.step(int(action))
                if terminated or truncated:
                    env.reset()
    return _timed(run)


def ale_vector_emulator(game: str, kwargs: dict, actions: np.ndarray, seed: int) -> tuple[float, float]:
    """ale-py's vector env's `step` on each row of actions (same-step autoreset)."""
    from impala_league.envs.atari_vector import AtariVectorGroup

    group = AtariVectorGroup(game, [seed + k for k in range(actions.shape[1])], {**kwargs, "emulator": "ale_vector"})
    env = group.env

    def run():
        for row in actions:
            env.step(row)
    return _timed(run)


def actor_level(game: str, kwargs: dict, actions: np.ndarray, seed: int) -> tuple[float, float]:
    """The actor's envs (`make_envs` with `kwargs`' emulator): act on all, advance all, stack the observations."""
    envs = make_envs(f"atari:{game}", [seed + k for k in range(actions.shape[1])], kwargs)
    steps = [env.advance() for env in envs]

    def run():
        nonlocal steps
        for row in actions:
            stacked([obs for step in steps for obs in step.observations])
            for env, step, action in zip(envs, steps, row):  # a vector slot sits out the step after its cut
                env.act([int(action)] * len(step.agents))
            steps = [env.advance() for env in envs]
    return _timed(run)


def two_player_level(game: str, grouped: bool, actions: np.ndarray, seed: int) -> tuple[float, float, int]:
    """`atari2p:<game>`'s envs as an actor steps them: act on all, advance all, stack the observations;
    one adapter per game (`make_env`) or one `Atari2pGroup`. `actions`: [steps, games, players]."""
    from impala_league.envs.atari2p_vector import Atari2pGroup

    name, seeds = f"atari2p:{game}", [seed + k for k in range(actions.shape[1])]
    envs = Atari2pGroup(game, seeds, {}, env_spec(name).agent_seats, name).slots if grouped else [
        make_env(name, s) for s in seeds]
    steps = [env.advance() for env in envs]
    played = 0

    def run():
        nonlocal steps, played
        for row in actions:
            stacked([obs for step in steps for obs in step.observations])
            for env, step, action in zip(envs, steps, row):
                env.act(action[:len(step.agents)].tolist())
                played += len(step.agents)
            steps = [env.advance() for env in envs]
    return (*_timed(run), played)


def envpool_emulator(game: str, kwargs: dict, actions: np.ndarray, seed: int) -> tuple[float, float]:
    """envpool's Atari env, one thread, synchronous (batch = all N games), the same preprocessing."""
    import envpool

    s = atari.settings(kwargs)
    n = actions.shape[1]
    env = envpool.make(f"{game}-v5", env_type="gymnasium", num_envs=n, batch_size=n, num_threads=1, seed=seed,
                       episodic_life=False, reward_clip=False, use_fire_reset=False, noop_max=s["noop_max"],
                       repeat_action_probability=float(s["sticky_actions"]), stack_num=s["frame_stack"],
                       frame_skip=s["frame_skip"], img_height=s["screen_size"], img_width=s["screen_size"],
                       max_episode_steps=s["max_episode_frames"] // s["frame_skip"],
                       full_action_space=bool(s["full_action_space"]))
    env.reset()

    def run():
        for row in actions:
            env.step(row)
    return _timed(run)


def envpool_problem() -> str | None:
    """None when envpool imports, else why not (its version and numpy's, or the import error)."""
    try:
        import envpool
    except ModuleNotFoundError as e:
        if e.name == "envpool":
            return f"not installed (`{ENVPOOL_INSTALL}`)"
        return f"a package envpool needs is missing ({e}); `{ENVPOOL_INSTALL}` installs them"
    except Exception as e:  # an ImportError against numpy, a missing asset file (FileNotFoundError), ...
        return (f"installed but does not import with numpy {np.__version__} ({type(e).__name__}: "
                f"{str(e).splitlines()[0][:160]}); `{ENVPOOL_INSTALL}` installs the version and assets seen to work")
    print(f"envpool {envpool.__version__} imports with numpy {np.__version__}")
    return None


def measure(args, paths: list[str], skipped: dict[str, str]) -> dict[tuple[str, str], tuple[float, float, int]]:
    """(wall s, CPU s, agent steps) of each path and level asked for, one after the other, the least wall
    and CPU time of `args.rounds` rounds."""
    spec, spec2 = env_spec(f"atari:{args.game}"), env_spec(f"atari2p:{args.game2p}")
    rng = np.random.default_rng(args.seed)
    actions = rng.integers(spec.num_actions, size=(args.steps, args.envs))
    actions2 = rng.integers(spec2.num_actions, size=(args.steps, args.envs, len(spec2.agents)))
    one = args.steps * args.envs
    runs = {("gymnasium", "emulator"): lambda: (*gymnasium_emulator(args.game, {}, actions, args.seed), one),
            ("gymnasium", "actor"): lambda: (*actor_level(args.game, {}, actions, args.seed), one),
            ("ale_vector", "emulator"): lambda: (*ale_vector_emulator(args.game, {}, actions, args.seed), one),
            ("ale_vector", "actor"): lambda: (*actor_level(args.game, {"emulator": "ale_vector"}, actions, args.seed),
                                              one),
            ("envpool", "emulator"): lambda: (*envpool_emulator(args.game, {}, actions, args.seed), one),
            ("2p_adapters", "actor"): lambda: two_player_level(args.game2p, False, actions2, args.seed),
            ("2p_group", "actor"): lambda: two_player_level(args.game2p, True, actions2, args.seed)}
    best: dict[tuple[str, str], tuple[float, float, int]] = {}
    for _ in range(args.rounds):  # round by round, so that a busy spell of the machine hits every path
        for key, run in runs.items():
            if key[0] in paths and key[0] not in skipped:
                wall, cpu, n = run()
                old = best.get(key, (wall, cpu, n))
                best[key] = (min(wall, old[0]), min(cpu, old[1]), n)
    return best


def print_table(rows: dict[tuple[str, str], tuple[float, float, int]], game: str, game2p: str) -> None:
    """Agent steps per wall and CPU second of every path and level, with the single-player paths' ratio
    to gymnasium's and the two-player paths' to ale_vector's at actor level."""
    print(f"\n{'path':<11} {'game':<15} {'level':<9} {'steps/s':>9} {'steps/CPU-s':>12} {'CPU/wall':>9} "
          f"{'vs gymnasium (wall)':>20} {'(CPU)':>7}")
    for (path, level), (wall, cpu, n) in rows.items():
        base = rows.get(("gymnasium", level)) if not path.startswith("2p") else None
        ratio_wall = f"{base[0] / base[2] * n / wall:.2f}x" if base else "-"
        ratio_cpu = f"{base[1] / base[2] * n / cpu:.2f}x" if base and cpu > 0 else "-"
        name = f"atari2p:{game2p}" if path.startswith("2p") else f"atari:{game}"
        print(f"{path:<11} {name:<15} {level:<9} {n / wall:>9,.0f} {n / max(cpu, 1e-9):>12,.0f} {cpu / wall:>9.2f} "
              f"{ratio_wall:>20} {ratio_cpu:>7}")
    one = rows.get(("ale_vector", "actor"))
    for path in ("2p_adapters", "2p_group"):
        two = rows.get((path, "actor"))
        if one and two:
            print(f"two players / one, agent steps per CPU-s: {path} atari2p:{game2p} {two[2] / two[1]:,.0f} / "
                  f"ale_vector atari:{game} {one[2] / one[1]:,.0f} = {two[2] / two[1] / (one[2] / one[1]):.2f} "
                  f"(per wall s {two[2] / two[0] / (one[2] / one[0]):.2f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="Pong", help="the single-player game, atari:<game>")
    parser.add_argument("--game2p", default="boxing", help="the two-player game, atari2p:<game2p>")
    parser.add_argument("--envs", type=int, default=16, help="games per path (an actor's actor.num_envs)")
    parser.add_argument("--steps", type=int, default=1000, help="env steps per game per measurement")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--rounds", type=int, default=1, help="measure every path this many times, round by "
                        "round, and keep each path's fastest (for a busy machine)")
    args = parser.parse_args()
    paths = [p for p in args.paths.split(",") if p]
    unknown = sorted(set(paths) - set(PATHS))
    if unknown:
        parser.error(f"unknown paths {unknown}; valid: {', '.join(PATHS)}")
    try:
        import cv2
        cv2.setNumThreads(1)  # gymnasium's resize: one core, as in an actor
    except ImportError:
        pass
    spec = env_spec(f"atari:{args.game}")
    print(f"atari:{args.game} and atari2p:{args.game2p}: {args.envs} games x {args.steps} env steps per "
          f"measurement, the fastest of {args.rounds} round(s), random actions; obs {spec.obs_shape} "
          f"{spec.obs_dtype}; pid {os.getpid()}, {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}")
    skipped = {}
    if "envpool" in paths:
        problem = envpool_problem()
        if problem:
            skipped["envpool"] = problem
    print_table(measure(args, paths, skipped), args.game, args.game2p)
    for path, why in skipped.items():
        print(f"{path:<11} skipped: {why}")
    print(f"load {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
