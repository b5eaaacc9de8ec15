"""Parameter store: the learner publishes weights (safetensors bytes) with a version; actors pull them.

Keys: `{run}:params` (bytes), `{run}:params:version` (int) and `{run}:params:frames` (env steps the
learner had trained on). They are written in one MULTI/EXEC and read in one, so a reader never pairs
new weights with an old version. Actors poll only the small
version key and fetch the weights when it changed.
"""

from __future__ import annotations

import redis
import torch

from distributed.codec import decode_weights, encode_weights


class ParamStore:
    def __init__(self, client: redis.Redis, run: str):
        self.r = client
        self.key = f"{run}:params"
        self.version_key = f"{run}:params:version"
        self.frames_key = f"{run}:params:frames"

    def publish(self, state_dict: dict[str, torch.Tensor], version: int, frames: int = 0) -> None:
        data = encode_weights(state_dict)
        pipe = self.r.pipeline(transaction=True)
        pipe.set(self.key, data)
        pipe.set(self.version_key, int(version))
        pipe.set(self.frames_key, int(frames))
        pipe.execute()

    def clear(self) -> None:
        """Delete the published weights (a new run must not hand an old run's weights to its actors)."""
        self.r.delete(self.key, self.version_key, self.frames_key)

    def version(self) -> int:
        """Latest published version, or -1 when nothing was published yet."""
        v = self.r.get(self.version_key)
        return int(v) if v is not None else -1

    def fetch(self) -> tuple[int, dict[str, torch.Tensor]] | None:
        """(version, state_dict) of the latest weights, or None when nothing was published yet."""
        raw = self.fetch_raw()
        return None if raw is None else (raw[0], decode_weights(raw[1]))

    def fetch_raw(self) -> tuple[int, bytes, int] | None:
        """(version, safetensors bytes, frames) of the latest weights, or None before the first publish."""
        pipe = self.r.pipeline(transaction=True)
        pipe.get(self.version_key)
        pipe.get(self.key)
        pipe.get(self.frames_key)
        version, data, frames = pipe.execute()
        if version is None or data is None:
            return None
        return int(version), data, int(frames or 0)
