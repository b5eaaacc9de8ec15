"""The names of the counts in the files a run writes, and reading files written under older names.

metrics.jsonl, a checkpoint's meta (and `latest.json` beside it), a league snapshot's meta,
evaluation.json (its `over_training` entries too), league/state.json and compare.json once called the
agent steps trained `frames`; they now say `agent_steps_trained` (AGENT_STEPS; emulator frames, where
an env repeats each action, are `emulator_frames` and never were `frames`). Every reader of such a file
takes what it parsed through `upgraded`, so that a file written before reads as one written now.
Imports nothing: every layer may use it.
"""

from __future__ import annotations

from typing import Any

AGENT_STEPS = "agent_steps_trained"

# old key -> its name now. A compare score's own fields (`<score>_ci95`, `_seeds`, `_iqm`, ...) follow it.
RENAMED = {"frames": AGENT_STEPS, "equal_frames": "equal_agent_steps",
           "score_at_equal_frames": "score_at_equal_agent_steps"}


def new_name(key: str) -> str:
    """The name `key` has now: itself unless RENAMED names it (`frames` -> `agent_steps_trained`,
    `score_at_equal_frames_ci95` -> `score_at_equal_agent_steps_ci95`)."""
    for old, new in RENAMED.items():
        if key == old or (old.startswith("score_") and key.startswith(old + "_")):
            return new + key[len(old):]
    return key


def upgraded(record: Any) -> Any:
    """A parsed JSON value (a metrics record, a checkpoint's meta, evaluation.json, compare.json, ...) with
    every key at any depth under its name now (`new_name`); where a dict holds a key under both names,
    the new one's value is kept."""
    if isinstance(record, dict):
        renamed = {}
        for key, value in record.items():
            name = new_name(key) if isinstance(key, str) else key
            if name != key and name in record:
                continue  # written under both names: the new one holds the value
            renamed[name] = upgraded(value)
        return renamed
    if isinstance(record, list):
        return [upgraded(value) for value in record]
    return record
