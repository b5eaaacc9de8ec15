"""Make pysc2 4.0 import on Python 3.11 with current protobuf, in SC2 processes only.

Two things stop pysc2 4.0 (the current PyPI release) from importing here:
- s2clientprotocol's generated `*_pb2.py` files predate protobuf 3.20 and are refused by protobuf's
  C (upb) implementation; protobuf's pure-Python implementation still accepts them. It is chosen by
  the PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION environment variable, read once at protobuf's first
  import, so `import_pysc2()` must run before anything in the process imports protobuf (wandb does).
  The variable is set only while protobuf reads it: child processes start with the default.
- `pysc2.lib.colors` calls `random.shuffle(palette, lambda: 0.5)` (when `pysc2.lib.features` builds its
  palettes at import); Python 3.11 removed that second argument. That module alone gets a `random`
  whose `shuffle` takes it, with Python 3.10's algorithm, so the palettes are the ones pysc2 was
  written against; the `random` module itself is left alone.

Also, `pysc2.lib.video_writer` (video recording of the human renderer, which we never use) is loaded
only on first use: importing it pulls in sk-video and scipy.signal, several seconds per process.

Nothing outside `envs/sc2_wrappers/` imports this module, so other processes keep protobuf's fast
implementation and never import pysc2.
"""

from __future__ import annotations

import importlib.util
import math
import os
import random
import sys
from types import SimpleNamespace
from pathlib import Path

PROTOBUF_ENV = "PROTOCOL_BUFFERS_PYTHON_IMPLEMENTATION"
SC2PATH_ENV = "SC2PATH"
DEFAULT_SC2PATH = "~/StarCraftII"  # pysc2's Linux default

GAME_MISSING_HELP = (
    "StarCraft II is not installed where pysc2 looks: {where}. Install the Linux game package "
    "(see docs/starcraft.md), unzip it and the maps into one folder, and set "
    "SC2PATH to that folder (e.g. `export SC2PATH=$HOME/StarCraftII`)."
)


class SC2NotInstalledError(RuntimeError):
    """The StarCraft II game binary is not where pysc2 looks; the message says how to fix it."""


def _shuffle_py310(x: list, random_fn=None) -> None:
    """`random.shuffle` as in Python 3.10, including its optional `random` argument (removed in 3.11)."""
    if random_fn is None:
        return random.shuffle(x)
    for i in reversed(range(1, len(x))):
        j = math.floor(random_fn() * (i + 1))
        x[i], x[j] = x[j], x[i]


def _use_python_protobuf() -> None:
    """Make protobuf pick its pure-Python implementation in this process only: the variable is set
    while protobuf reads it (once, at import) and then put back, so child processes do not inherit it."""
    if "google.protobuf" not in sys.modules:
        previous = os.environ.get(PROTOBUF_ENV)
        os.environ[PROTOBUF_ENV] = "python"
        try:
            from google.protobuf.internal import api_implementation  # noqa: F401  (reads the variable)
        finally:
            if previous is None:
                del os.environ[PROTOBUF_ENV]
            else:
                os.environ[PROTOBUF_ENV] = previous
    from google.protobuf.internal import api_implementation

    if api_implementation.Type() != "python":
        raise RuntimeError(
            f"protobuf was imported with its '{api_implementation.Type()}' implementation before pysc2; "
            "pysc2's generated code needs the pure-Python one. Import envs.sc2_wrappers (or call "
            "import_pysc2()) before anything that imports protobuf, such as wandb.")


def _load_on_first_use(module_name: str) -> None:
    """Bind `module_name` now and execute it when one of its attributes is first used."""
    spec = importlib.util.find_spec(module_name)
    spec.loader = importlib.util.LazyLoader(spec.loader)
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    spec.loader.exec_module(module)
    parent, _, name = module_name.rpartition(".")
    # Bound on the package too: `from package import name` then never touches (and so loads) it.
    setattr(sys.modules[parent], name, module)


def import_pysc2():
    """Import pysc2 (and the modules the wrappers use) and return the `pysc2` package.

    Idempotent. Marks absl's flags as parsed with their defaults (pysc2 reads `FLAGS.sc2_version`
    etc., and our processes do not parse absl flags).

    Raises:
      RuntimeError: protobuf was already imported with its C implementation in this process.
    """
    if "pysc2.lib.colors" not in sys.modules:
        _use_python_protobuf()
        _load_on_first_use("pysc2.lib.video_writer")
        from pysc2.lib import colors

        colors.random = SimpleNamespace(shuffle=_shuffle_py310)
    import pysc2
    from absl import flags
    from pysc2.env import sc2_env  # noqa: F401  (defines the flags below)

    if not flags.FLAGS.is_parsed():
        flags.FLAGS.mark_as_parsed()
    return pysc2


def game_path() -> Path:
    """The folder pysc2 runs the game from on Linux: $SC2PATH, else ~/StarCraftII."""
    return Path(os.environ.get(SC2PATH_ENV) or DEFAULT_SC2PATH).expanduser()


def require_game() -> Path:
    """Check that the StarCraft II binary is installed, before any process tries to start it.

    Returns the game folder. Raises SC2NotInstalledError (saying where it looked and how to fix it)
    when the folder, its `Versions/Base*/SC2_x64` binary, or its `Maps` folder is missing.
    """
    root = game_path()
    where = f"{SC2PATH_ENV}={os.environ[SC2PATH_ENV]}" if os.environ.get(SC2PATH_ENV) else f"{root} (SC2PATH unset)"
    if not root.is_dir():
        raise SC2NotInstalledError(GAME_MISSING_HELP.format(where=f"no folder {where}"))
    if not any((v / "SC2_x64").is_file() for v in (root / "Versions").glob("Base*")):
        raise SC2NotInstalledError(GAME_MISSING_HELP.format(where=f"no Versions/Base*/SC2_x64 in {where}"))
    if not (root / "Maps").is_dir():
        raise SC2NotInstalledError(GAME_MISSING_HELP.format(where=f"no Maps folder in {where}"))
    return root
