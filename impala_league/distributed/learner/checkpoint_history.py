"""Earlier policies of a run without a league: copies of the main learner's checkpoint, few and evenly spaced.

With a league, the main agent's snapshots (`league/snapshots/`) show how it played over training;
without one, the main learner keeps these copies for the end-of-run evaluation to play
(`evaluation/over_training.py`). It calls `CheckpointHistory.update` after each checkpoint it writes
to `checkpoints/latest.safetensors` (every `learner.checkpoint_every_s`), and every `stride`-th one is
copied, network only, to `checkpoints/history/<update step>.safetensors`.
Once more than `2 * keep` copies lie there, every other one is deleted (the first and the newest
stay) and the stride doubles, so the copies stay evenly spaced over the run and there are at most
`2 * keep` of them (connect four's conv net: 0.8 MB each). A resumed run goes on from the copies
there with stride 1, so its later copies may lie closer together than its earlier ones.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from safetensors import SafetensorError

from impala_league.agents.checkpoint import CheckpointError, read_checkpoint, save_model_only

log = logging.getLogger("history")

HISTORY_DIR = "history"
"""Folder of the copies, beside the checkpoint they copy."""
KEEP = 8
"""Thinning keeps between KEEP + 1 and 2 * KEEP copies (fewer until the run has written that many checkpoints)."""


def _stamp(path: Path) -> tuple[int, int, int] | None:
    """(mtime ns, inode, size) of `path`, None if it is missing: the checkpoint is replaced by a rename,
    so a new one changes its inode."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return st.st_mtime_ns, st.st_ino, st.st_size


class CheckpointHistory:
    """Copies of the checkpoint at `checkpoint`, kept in `checkpoint.parent / HISTORY_DIR` (see the module
    docstring). The checkpoint there when it is made (a resumed run's) is not copied again."""

    def __init__(self, checkpoint: str | Path, keep: int = KEEP):
        if keep < 1:
            raise ValueError(f"keep must be >= 1, got {keep}")
        self.checkpoint = Path(checkpoint)
        self.dir = self.checkpoint.parent / HISTORY_DIR
        self.keep = keep
        self.stride = 1
        self.since_copy = 0  # new checkpoints seen since the last copy
        self.seen = _stamp(self.checkpoint)
        self.copies = sorted(self.dir.glob("*.safetensors"))  # names are zero-padded steps: oldest first

    def update(self) -> Path | None:
        """Copy the checkpoint if it is new and its turn has come; returns the copy (else None). A copy that
        fails is logged and skipped: the history never stops a run."""
        stamp = _stamp(self.checkpoint)
        if stamp is None or stamp == self.seen:
            return None
        self.seen = stamp
        self.since_copy += 1
        if self.since_copy < self.stride:
            return None
        self.since_copy = 0
        try:
            tensors, metadata = read_checkpoint(self.checkpoint)
            path = self.dir / f"{int(json.loads(metadata['meta'])['step']):010d}.safetensors"
            save_model_only(path, tensors, metadata)
        except (CheckpointError, SafetensorError, OSError, KeyError, ValueError) as e:
            log.warning("no copy of %s in %s: %s", self.checkpoint, self.dir, e)
            return None
        if path not in self.copies:  # the same update step checkpointed again overwrites its copy
            self.copies.append(path)
        if len(self.copies) > 2 * self.keep:
            for old in self.copies[1::2]:
                old.unlink(missing_ok=True)
            self.copies = self.copies[::2]
            self.stride *= 2
        return path


def history_files(checkpoint_dir: str | Path) -> list[Path]:
    """The copies under `checkpoint_dir` (a run's `checkpoints/`), oldest first."""
    return sorted((Path(checkpoint_dir) / HISTORY_DIR).glob("*.safetensors"))
