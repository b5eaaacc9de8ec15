"""The env an AgentConfig plays, checked against the network it describes, without importing torch:
`run.py train` checks its config with this before it starts any process.
"""

from __future__ import annotations

from impala_league.config import Config, ConfigError
from impala_league.envs.registry import EnvSpec, env_spec


PIXEL_TORSOS = ("shallow", "resnet")  # agents/torsos.py
MIN_FRAME = 20  # pixels a side: the shallow torso's 8x8 stride-4 conv must leave 4 for its 4x4 conv


def is_frames(spec: EnvSpec) -> bool:
    """The env's observation is a stack of image frames [C, H, W] (Atari's), the pixel torsos' input."""
    return spec.obs_image and len(spec.obs_shape) == 3 and min(spec.obs_shape[1:]) >= MIN_FRAME


def check_frames(obs_shape: tuple[int, ...], torso: str) -> tuple[int, int, int]:
    """(C, H, W) of frames of `obs_shape`, or a ConfigError naming what pixel torso `torso` needs."""
    if len(obs_shape) != 3 or min(obs_shape[1:]) < MIN_FRAME:
        raise ConfigError(f"agent.torso={torso} reads frames [C, H, W] of at least {MIN_FRAME}x{MIN_FRAME} "
                          f"pixels (e.g. atari:<Game>'s 4 x 84 x 84); this env's observation has shape "
                          f"{tuple(obs_shape)}: use agent.torso=conv for boards or mlp for vectors")
    c, h, w = obs_shape
    return int(c), int(h), int(w)


def checked_spec(cfg: Config) -> EnvSpec:
    """The EnvSpec of `cfg.env`, checked against the network `cfg.agent` describes.

    Raises ConfigError naming what to change: an unknown env or kwargs it does not take, a StarCraft II
    screen and minimap of different sizes (FullyConv stacks them), valid-padded conv layers that
    shrink the board to nothing, a pixel torso on what is not frames, or an mlp or conv torso on frames.
    """
    try:
        spec = env_spec(cfg.env.name, cfg.env.kwargs, cfg.env.seats)
    except ValueError as e:
        raise ConfigError(f"env.name '{cfg.env.name}': {e}") from None
    if spec.kind == "sc2" and cfg.env.kwargs.get("screen_size", 32) != cfg.env.kwargs.get("minimap_size", 32):
        raise ConfigError("agent.torso=fullyconv needs env.kwargs.minimap_size equal to env.kwargs.screen_size "
                          "(default 32)")
    if cfg.agent.torso in PIXEL_TORSOS:
        check_frames(spec.obs_shape, cfg.agent.torso)
    elif cfg.agent.torso in ("mlp", "conv") and is_frames(spec):
        raise ConfigError(f"agent.torso={cfg.agent.torso} cannot read {cfg.env.name}'s frames {spec.obs_shape}: "
                          "use agent.torso=shallow (CPU) or resnet (GPU)")
    if cfg.agent.torso == "conv" and cfg.agent.padding == "valid":
        h, w = spec.obs_shape[:2]
        shrink = cfg.agent.conv_layers * (cfg.agent.kernel_size - 1)
        if shrink >= min(h, w):
            raise ConfigError(f"agent: {cfg.agent.conv_layers} valid-padded conv layers of kernel "
                              f"{cfg.agent.kernel_size} do not fit the {h}x{w} board of {cfg.env.name}; "
                              "use a smaller agent.kernel_size or agent.conv_layers, or agent.padding=same")
    return spec
