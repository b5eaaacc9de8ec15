"""Atari emulator paths side by side: agent steps per second on one core, the same preprocessing.

An actor is one process per core, so each path runs single-threaded here (ale-py's and envpool's
vector envs with one thread, OpenCV with one thread), N games, random actions, in one process one
after the other:

* `gymnasium`: one gymnasium env per game (`ALE/<Game>-v5` under `AtariPreprocessing` and
  `FrameStackObservation`, envs/atari.py), the reference;
* `ale_vector`: ale-py's C++ `AtariVectorEnv` holding all N games (envs/atari_vector.py);
* `envpool`: envpool's Atari vector env, when it imports (it is not in requirements.txt:
  `pip install envpool==1.2.5`, which pulls about 300 MB of envpool's asset packages; 1.2.5 was seen to
  import and step with numpy 2.4. Without it, or when it fails to import, the table says why and goes on).

Each at two levels: `emulator`, the env's own `step` on a batch of actions (the gymnasium envs one by
one, resetting a finished one); `actor`, what an actor pays per step of its envs: our adapters
(`envs.registry.make_envs`: `act` then `advance` on every env, the settlements and episode results)
and the `np.stack` of the N observations that the actor's forward pass takes. envpool has no adapter
here: emulator level only. The table gives agent steps (one action of one game, 4 emulator frames)
per wall second and per CPU second of this process (CPU / wall shows a path that uses more than one
core, e.g. a thread that spins while it waits), and each path's ratio to gymnasium's at that level.
On a busy machine the per-CPU-second numbers are the ones to compare. Building and resetting the
envs is left out of the times.

    python bench/bench_atari_env.py [--game Pong] [--envs 16] [--steps 1000] [--paths gymnasium,ale_vector,envpool]

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
from impala_league.envs.registry import env_spec, make_envs  # noqa: E402

PATHS = ("gymnasium", "ale_vector", "envpool")
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
            np.stack([obs for step in steps for obs in step.observations])
            for env, step, action in zip(envs, steps, row):  # a vector slot sits out the step after its cut
                env.act([int(action)] * len(step.agents))
            steps = [env.advance() for env in envs]
    return _timed(run)


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--game", default="Pong")
    parser.add_argument("--envs", type=int, default=16, help="games per path (an actor's actor.num_envs)")
    parser.add_argument("--steps", type=int, default=1000, help="agent steps per game per measurement")
    parser.add_argument("--paths", default=",".join(PATHS))
    parser.add_argument("--seed", type=int, default=0)
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
    actions = np.random.default_rng(args.seed).integers(spec.num_actions, size=(args.steps, args.envs))
    print(f"atari:{args.game}: {args.envs} games x {args.steps} agent steps per measurement, random actions; "
          f"obs {spec.obs_shape} {spec.obs_dtype}; pid {os.getpid()}, {os.cpu_count()} CPUs, load "
          f"{os.getloadavg()[0]:.1f}")
    runs = {("gymnasium", "emulator"): lambda: gymnasium_emulator(args.game, {}, actions, args.seed),
            ("gymnasium", "actor"): lambda: actor_level(args.game, {}, actions, args.seed),
            ("ale_vector", "emulator"): lambda: ale_vector_emulator(args.game, {}, actions, args.seed),
            ("ale_vector", "actor"): lambda: actor_level(args.game, {"emulator": "ale_vector"}, actions, args.seed),
            ("envpool", "emulator"): lambda: envpool_emulator(args.game, {}, actions, args.seed)}
    skipped = {}
    if "envpool" in paths:
        problem = envpool_problem()
        if problem:
            skipped["envpool"] = problem
    rows = {}
    for (path, level), run in runs.items():
        if path not in paths or path in skipped:
            continue
        wall, cpu = run()
        rows[(path, level)] = (wall, cpu)
    total = args.steps * args.envs
    print(f"\n{'path':<11} {'level':<9} {'steps/s':>9} {'steps/CPU-s':>12} {'CPU/wall':>9} "
          f"{'vs gymnasium (wall)':>20} {'(CPU)':>7}")
    for (path, level), (wall, cpu) in rows.items():
        base = rows.get(("gymnasium", level))
        ratio_wall = f"{base[0] / wall:.2f}x" if base else "-"
        ratio_cpu = f"{base[1] / cpu:.2f}x" if base and cpu > 0 else "-"
        print(f"{path:<11} {level:<9} {total / wall:>9,.0f} {total / max(cpu, 1e-9):>12,.0f} {cpu / wall:>9.2f} "
              f"{ratio_wall:>20} {ratio_cpu:>7}")
    for path, why in skipped.items():
        print(f"{path:<11} skipped: {why}")


if __name__ == "__main__":
    main()
