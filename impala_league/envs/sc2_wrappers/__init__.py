"""StarCraft II through pysc2: compatibility shim, observation encoder, FunctionCall codec, env adapter.

Importing this package imports pysc2 (through `compat.import_pysc2`, which switches this process's
protobuf to its pure-Python implementation); nothing outside SC2 code paths imports it.
"""

from impala_league.envs.sc2_wrappers.compat import import_pysc2

import_pysc2()
