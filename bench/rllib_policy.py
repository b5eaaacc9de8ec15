"""RLlib's connect-four policy out of its checkpoint and into our judges, through a plain file.

Run as a script in RLlib's venv (bench/.venv-rllib, made by bench/bench_strength_vs_rllib.py), it reads the
newest checkpoint that RLlib's self-play example left under a Tune storage folder, loads its "main" RLModule
with RLlib's own loader (`RLModule.from_checkpoint` on learner_group/learner/rl_module/main), and writes
the policy's acting path (encoder, then the pi head: RLlib's default PPO module is an MLP) as

* `policy.safetensors`: `layers.{i}.weight` float32 [out, in] and `layers.{i}.bias` [out] of each linear
  layer in order, and `check.observations` float32 [N, 126] with `check.logits` float32 [N, 7]: positions
  of random games and RLlib's own `forward_inference` logits of them;
* `policy.json`: {"format": FORMAT, "env", "layers": [{"in", "out", "activation"}...] (activation: a
  torch.nn class name, "Tanh", "ReLU", ...; null after the last layer), "observation" and "actions" (what
  the input and the outputs are), "params" (the module's trainable parameters, value branch included),
  "checkpoint", "ray", and "progress": the trial's result at that checkpoint (iteration, training seconds,
  steps sampled and trained)}.

Nothing is pickled across the two venvs: RLlib reads its own checkpoint in its own venv, and ours reads
only safetensors and JSON. Imported in our venv, `MLPPlayer.load` rebuilds the MLP from those files,
checks that it reproduces RLlib's check logits, and plays as a judged player
(impala_league/evaluation/foreign.py): our observation becomes OpenSpiel's observation tensor, the one
RLlib's OpenSpielEnv trained it on, and its move is the argmax of the logits over the legal columns.

    bench/.venv-rllib/bin/python bench/rllib_policy.py --storage DIR --out DIR
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

import numpy as np
import torch
from safetensors.numpy import load_file, save_file

FORMAT = "mlp-v1"
"""The export's format: an MLP of linear layers, each but the last followed by its activation."""
ENV = "connect_four"
OBSERVATION = ("OpenSpiel connect_four state.observation_tensor(): float32 [3 * 6 * 7] in C order of planes "
               "(player 0's pieces, player 1's, empty cells), rows (bottom first), columns (left first)")
ACTIONS = "logits of the 7 columns, 0 = left (OpenSpiel's connect_four actions)"
ACTIVATIONS = {"Tanh": torch.tanh, "ReLU": torch.relu, "SiLU": torch.nn.functional.silu,
               "ELU": torch.nn.functional.elu}
"""The activations an export may name (torch.nn class names), and the function each is."""
CHECK_POSITIONS = 256
"""Positions whose logits RLlib computes at export and the loader must reproduce."""
PROGRESS_KEYS = {
    "iteration": "training_iteration",
    "time_total_s": "time_total_s",
    "env_steps_sampled": "env_runners/num_env_steps_sampled_lifetime",
    "agent_steps_sampled": "env_runners/num_agent_steps_sampled_lifetime",
    "main_steps_sampled": "env_runners/num_module_steps_sampled_lifetime/main",
    "main_steps_trained": "learners/main/num_module_steps_trained_lifetime",
    "env_steps_trained": "learners/__all_modules__/num_env_steps_trained_lifetime",
    "league_size": "league_size",
    "win_rate": "env_runners/win_rate",
}
"""progress's names and the keys of RLlib's result dict ('/' goes one level down) they are read from."""


def write_mlp(out: Path, layers: list[tuple[np.ndarray, np.ndarray, str | None]], check_observations: np.ndarray,
              check_logits: np.ndarray, meta: dict) -> None:
    """Write `layers` [(weight [out, in], bias [out], activation name or None)] with the check positions
    and logits to `out`/policy.safetensors and `out`/policy.json (with `meta`)."""
    out.mkdir(parents=True, exist_ok=True)
    tensors = {"check.observations": np.ascontiguousarray(check_observations, dtype=np.float32),
               "check.logits": np.ascontiguousarray(check_logits, dtype=np.float32)}
    for i, (weight, bias, _) in enumerate(layers):
        tensors[f"layers.{i}.weight"] = np.ascontiguousarray(weight, dtype=np.float32)
        tensors[f"layers.{i}.bias"] = np.ascontiguousarray(bias, dtype=np.float32)
    save_file(tensors, str(out / "policy.safetensors"))
    described = [{"in": int(w.shape[1]), "out": int(w.shape[0]), "activation": a} for w, _, a in layers]
    (out / "policy.json").write_text(json.dumps({"format": FORMAT, "env": ENV, "observation": OBSERVATION,
                                                 "actions": ACTIONS, "layers": described, **meta}, indent=1) + "\n")


def mlp_logits(layers: list[tuple[torch.Tensor, torch.Tensor, str | None]], x: torch.Tensor) -> torch.Tensor:
    """The MLP's output for inputs `x` float32 [N, in]: each layer x W^T + b, then its activation."""
    for weight, bias, activation in layers:
        x = torch.nn.functional.linear(x, weight, bias)
        if activation is not None:
            x = ACTIVATIONS[activation](x)
    return x


class MLPPlayer:
    """An exported policy as a player of our connect four (the `act_batch` interface of
    impala_league/evaluation/foreign.py): greedy, the argmax of its logits over the legal columns."""

    def __init__(self, layers: list[tuple[torch.Tensor, torch.Tensor, str | None]], meta: dict):
        self.layers = layers
        self.meta = meta
        self.name = "rllib"

    @classmethod
    def load(cls, folder: Path, atol: float = 1e-4) -> "MLPPlayer":
        """The player of `folder`/policy.{safetensors,json}. Raises ValueError for another format, layers
        whose shapes do not chain, an unknown activation, or check logits it does not reproduce within
        `atol`."""
        meta = json.loads((folder / "policy.json").read_text())
        if meta.get("format") != FORMAT or meta.get("env") != ENV:
            raise ValueError(f"{folder}/policy.json: format {meta.get('format')!r} of {meta.get('env')!r}, "
                             f"expected {FORMAT!r} of {ENV!r}")
        tensors = load_file(str(folder / "policy.safetensors"))
        layers, width = [], 3 * 6 * 7
        for i, layer in enumerate(meta["layers"]):
            weight = torch.from_numpy(tensors[f"layers.{i}.weight"])
            bias = torch.from_numpy(tensors[f"layers.{i}.bias"])
            if weight.shape != (layer["out"], width) or bias.shape != (layer["out"],):
                raise ValueError(f"{folder}: layer {i} is {tuple(weight.shape)} + {tuple(bias.shape)}, expected "
                                 f"({layer['out']}, {width})")
            if layer["activation"] is not None and layer["activation"] not in ACTIVATIONS:
                raise ValueError(f"{folder}: layer {i}'s activation {layer['activation']!r} is none of "
                                 f"{sorted(ACTIVATIONS)}")
            layers.append((weight, bias, layer["activation"]))
            width = layer["out"]
        if width != 7:
            raise ValueError(f"{folder}: the last layer gives {width} outputs, not connect four's 7 columns")
        player = cls(layers, meta)
        got = player.logits(tensors["check.observations"])
        worst = float(np.abs(got - tensors["check.logits"]).max())
        if worst > atol:
            raise ValueError(f"{folder}: the rebuilt MLP's logits differ from RLlib's by up to {worst:.3g} "
                             f"(more than {atol:g}) on the check positions")
        return player

    def logits(self, tensors: np.ndarray) -> np.ndarray:
        """float32 [N, 7] logits of OpenSpiel observation tensors float32 [N, 126]."""
        with torch.no_grad():
            return mlp_logits(self.layers, torch.as_tensor(np.asarray(tensors, dtype=np.float32))).numpy()

    def act_batch(self, observations: np.ndarray, action_masks: np.ndarray) -> np.ndarray:
        """int64 [N]: the legal column of highest logit in each of our observations int8 [N, 6, 7, 2]."""
        from impala_league.evaluation.foreign import spiel_observation_tensors

        logits = self.logits(spiel_observation_tensors(ENV, observations))
        return np.where(np.asarray(action_masks, dtype=bool), logits, -np.inf).argmax(1).astype(np.int64)


def latest_checkpoint(storage: Path) -> Path:
    """The checkpoint_NNNNNN folder of highest NNNNNN under `storage` that holds the "main" module.
    Raises SystemExit naming `storage` when there is none."""
    found = [p for p in storage.rglob("checkpoint_*") if (p / "learner_group/learner/rl_module/main").is_dir()]
    if not found:
        raise SystemExit(f"no checkpoint with learner_group/learner/rl_module/main under {storage}")
    return max(found, key=lambda p: int(re.sub(r"\D", "", p.name) or 0))


def progress(result: dict) -> dict:
    """PROGRESS_KEYS read from one RLlib result dict (None where a key is missing)."""
    def get(key: str):
        value = result
        for part in key.split("/"):
            if not isinstance(value, dict) or part not in value:
                return None
            value = value[part]
        return value

    return {name: get(key) for name, key in PROGRESS_KEYS.items()}


def random_positions(count: int, seed: int = 0) -> np.ndarray:
    """float32 [count, 126]: OpenSpiel observation tensors of positions of random games not over."""
    import pyspiel

    game, rng, out = pyspiel.load_game(ENV), np.random.default_rng(seed), []
    while len(out) < count:
        state = game.new_initial_state()
        for _ in range(int(rng.integers(36))):
            state.apply_action(int(rng.choice(state.legal_actions())))
            if state.is_terminal():
                break
        if not state.is_terminal():
            out.append(np.asarray(state.observation_tensor(), dtype=np.float32))
    return np.stack(out)


def module_layers(module) -> list[tuple[np.ndarray, np.ndarray, str | None]]:
    """The acting path of RLlib's default PPO torch module: its (actor) encoder's MLP, then the pi head's."""
    encoder = module.encoder
    actor = getattr(encoder, "actor_encoder", None) or encoder.encoder  # vf_share_layers False / True
    layers: list[list] = []
    for part in [*actor.net.mlp, *module.pi.net.mlp]:
        if isinstance(part, torch.nn.Linear):
            layers.append([part.weight.detach().numpy(), part.bias.detach().numpy(), None])
        elif type(part).__name__ in ACTIVATIONS and layers and layers[-1][2] is None:
            layers[-1][2] = type(part).__name__
        else:
            raise SystemExit(f"unexpected part of RLlib's MLP: {part!r}")
    return [tuple(layer) for layer in layers]


def export(storage: Path, out: Path) -> dict:
    """Write the newest checkpoint's "main" policy under `storage` to `out` (the module docstring); its meta."""
    import ray
    from ray.rllib.core.rl_module.rl_module import RLModule

    checkpoint = latest_checkpoint(storage)
    module = RLModule.from_checkpoint(checkpoint / "learner_group" / "learner" / "rl_module" / "main")
    module.eval()
    layers = module_layers(module)
    observations = random_positions(CHECK_POSITIONS)
    with torch.no_grad():
        logits = module.forward_inference({"obs": torch.from_numpy(observations)})["action_dist_inputs"].numpy()
        mine = mlp_logits([(torch.from_numpy(w), torch.from_numpy(b), a) for w, b, a in layers],
                          torch.from_numpy(observations)).numpy()
    if not np.allclose(mine, logits, atol=1e-5):
        raise SystemExit(f"the layers read from {checkpoint} do not give RLlib's logits "
                         f"(up to {np.abs(mine - logits).max():.3g} apart)")
    results = [json.loads(line) for line in (checkpoint.parent / "result.json").read_text().splitlines() if line]
    at = checkpoint_result(checkpoint, results)
    meta = {"checkpoint": str(checkpoint), "ray": ray.__version__,
            "params": sum(p.numel() for p in module.parameters() if p.requires_grad), "progress": progress(at)}
    write_mlp(out, layers, observations, logits, meta)
    return meta


def checkpoint_result(checkpoint: Path, results: list[dict]) -> dict:
    """The trial's result (a line of its result.json) that `checkpoint` was saved with: the example
    checkpoints every iteration (--checkpoint-freq 1), and Tune numbers its checkpoints from 0, so
    checkpoint_00000N holds the N+1st result's iteration. Raises SystemExit when the result is missing or
    its iteration is not N + 1."""
    index = int(re.sub(r"\D", "", checkpoint.name))
    if index >= len(results) or results[index].get("training_iteration") != index + 1:
        raise SystemExit(f"{checkpoint}: its result is not the {index + 1}th of {checkpoint.parent}/result.json "
                         f"({len(results)} results); was the example run with --checkpoint-freq 1?")
    return results[index]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--storage", type=Path, required=True, help="the Tune storage folder RLlib's run wrote")
    parser.add_argument("--out", type=Path, required=True, help="folder of policy.safetensors and policy.json")
    args = parser.parse_args()
    print(json.dumps(export(args.storage, args.out)))


if __name__ == "__main__":
    main()
