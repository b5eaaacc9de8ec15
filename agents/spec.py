"""The env an AgentConfig plays, checked against the network it describes, without importing torch:
`run.py train` checks its config with this before it starts any process.
"""

from __future__ import annotations

from config import Config, ConfigError
from envs.registry import EnvSpec, env_spec


def checked_spec(cfg: Config) -> EnvSpec:
    """The EnvSpec of `cfg.env`, checked against the network `cfg.agent` describes.

    Raises ConfigError naming what to change: an unknown env or kwargs it does not take, a StarCraft II
    screen and minimap of different sizes (FullyConv stacks them), or valid-padded conv layers that
    shrink the board to nothing.
    """
    try:
        spec = env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats)
    except ValueError as e:
        raise ConfigError(f"env.name '{cfg.env.name}': {e}") from None
    if spec.kind == "sc2" and cfg.env.kwargs.get("screen_size", 32) != cfg.env.kwargs.get("minimap_size", 32):
        raise ConfigError("agent.torso=fullyconv needs env.kwargs.minimap_size equal to env.kwargs.screen_size "
                          "(default 32)")
    if cfg.agent.torso == "conv" and cfg.agent.padding == "valid":
        h, w = spec.obs_shape[:2]
        shrink = cfg.agent.conv_layers * (cfg.agent.kernel_size - 1)
        if shrink >= min(h, w):
            raise ConfigError(f"agent: {cfg.agent.conv_layers} valid-padded conv layers of kernel "
                              f"{cfg.agent.kernel_size} do not fit the {h}x{w} board of {cfg.env.name}; "
                              "use a smaller agent.kernel_size or agent.conv_layers, or agent.padding=same")
    return spec
