"""Property-based tests of the two parsers that read untrusted input: the unroll decoder (anything an
actor, or anyone who can XADD, puts on the stream) and config loading (files, `--set`, checkpoint
metadata). Every malformed input must be refused with the module's own error and a reason; nothing
else may escape, and a declared size is refused before anything of that size is allocated.

Example counts are modest so the suite stays fast; on CI the examples are derandomized (repeatable).
"""

from __future__ import annotations

import math
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

import msgpack
import numpy as np
import pytest
import yaml
from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from impala_league.config import SECTIONS, Config, ConfigError, from_yaml_text, load_config, to_yaml
from impala_league.distributed.wire.codec import MAX_MESSAGE_BYTES, DecodeError, UnrollSpec, decode_unroll, encode_unroll
from impala_league.envs.registry import env_spec

FUZZ = dict(deadline=None, database=None, derandomize=bool(os.environ.get("CI")),
            suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

T = 4
SPEC = UnrollSpec(env_spec("tictactoe"), T)


def valid_unroll() -> dict[str, np.ndarray]:
    """A legal tictactoe unroll: moves on empty squares, one finished game, masked logits."""
    a = {name: np.zeros(shape, dtype) for name, (dtype, shape) in SPEC.arrays.items()}
    a["action_mask"][:] = 1
    a["action"][:] = [4, 0, 8, 2]
    for t, action in enumerate(a["action"]):
        a["action_mask"][t + 1:, action] = 0
        a["obs"][t + 1:, action // 3, action % 3, 0] = 1
    a["reward"][:] = [0.0, 0.0, 0.0, 1.0]
    a["done"][:] = [0, 0, 0, 1]
    a["behaviour_logits"][:] = np.where(a["action_mask"][:T] == 1, 0.5, -1e9)
    return a


VALID = encode_unroll(valid_unroll(), unroll_id="0-abc-1", policy_version=3, actor_id=0, env="tictactoe")
VALID_MSG = msgpack.unpackb(VALID, raw=False)


def decodes_or_refuses(data) -> bool:
    """decode_unroll either returns an unroll that meets the spec or raises DecodeError with a reason.

    Returns True if it decoded. Any other exception fails the test (it propagates).
    """
    try:
        header, arrays = decode_unroll(data, SPEC)
    except DecodeError as e:
        assert str(e), "a DecodeError must carry its reason (it goes to the dead-letter stream)"
        event("refused")
        return False
    event("decoded")
    for name, (dtype, shape) in SPEC.arrays.items():
        assert arrays[name].dtype == dtype and arrays[name].shape == shape, name
    assert np.isfinite(arrays["reward"]).all() and np.isfinite(arrays["behaviour_logits"]).all()
    assert ((arrays["action"] >= 0) & (arrays["action"] < 9)).all()
    assert arrays["action_mask"][np.arange(T), arrays["action"]].all()
    assert header["env"] == "tictactoe" and header["policy_version"] >= 0
    return True


def test_the_valid_payload_decodes():
    header, arrays = decode_unroll(VALID, SPEC)
    assert header["policy_version"] == 3 and arrays["reward"][-1] == 1.0


# -- random input -----------------------------------------------------------------------------------

scalars = (st.none() | st.booleans() | st.integers(-2**63, 2**64 - 1) | st.floats()
           | st.text(max_size=12) | st.binary(max_size=40))
msgpack_values = st.recursive(
    scalars,
    lambda children: st.lists(children, max_size=4)
    | st.dictionaries(st.text(max_size=8) | st.binary(max_size=8), children, max_size=4),
    max_leaves=20)


@settings(max_examples=300, **FUZZ)
@given(st.binary(max_size=512))
def test_random_bytes_are_refused_with_a_reason(data):
    assert not decodes_or_refuses(data)


@settings(max_examples=300, **FUZZ)
@given(msgpack_values)
def test_random_msgpack_values_are_refused_with_a_reason(value):
    assert not decodes_or_refuses(msgpack.packb(value, use_bin_type=True))


@settings(max_examples=200, **FUZZ)
@given(st.fixed_dictionaries({"header": msgpack_values, "arrays": msgpack_values}))
def test_random_maps_with_the_right_top_level_keys_are_refused(value):
    assert not decodes_or_refuses(msgpack.packb(value, use_bin_type=True))


# -- one field of a valid payload corrupted ---------------------------------------------------------

def _paths(msg) -> list[tuple]:
    """Every place of the valid message a corruption can go: header fields, arrays, their parts."""
    paths = [("header",), ("arrays",)]
    paths += [("header", k) for k in msg["header"]]
    for name in msg["arrays"]:
        paths += [("arrays", name)] + [("arrays", name, i) for i in range(3)]
    return paths


PATHS = _paths(VALID_MSG)
DTYPES = ["<f4", "<f8", "|u1", "|i1", "<i8", "<i4", ">f4", "|b1", "|O", "<U1", "|V8", "<c8", ""]


def _near(value, data):
    """A value close to `value` (the kind of mistake or attack that almost passes)."""
    if isinstance(value, bytes):
        if not value:
            return data.draw(st.binary(max_size=8))
        i = data.draw(st.integers(0, len(value) - 1))
        return data.draw(st.sampled_from([
            value[:i], value + b"\x00", value[:i] + bytes([value[i] ^ data.draw(st.integers(1, 255))]) + value[i + 1:],
            value[:i] + np.float32(data.draw(st.sampled_from([np.nan, np.inf, -np.inf, 3e38]))).tobytes()
            + value[i + 4:]]))
    if isinstance(value, list):  # a shape: change, add or drop a dimension
        dims = list(value)
        choice = data.draw(st.integers(0, 2))
        if choice == 0 and dims:
            dims[data.draw(st.integers(0, len(dims) - 1))] = data.draw(st.integers(-1, 2**64 - 1))
        elif choice == 1:
            dims.append(data.draw(st.integers(0, 4)))
        else:
            dims = dims[:-1]
        return dims
    if isinstance(value, str):
        return data.draw(st.sampled_from(DTYPES) | st.text(max_size=16))
    if isinstance(value, (int, float)):
        return data.draw(st.sampled_from([-1, 0, 2**63, -2**63, 1.5, math.nan, math.inf, True, None, str(value)]))
    return data.draw(msgpack_values)


def _replace(msg, path, new):
    import copy

    msg = copy.deepcopy(msg)
    node = msg
    for key in path[:-1]:
        node = node[key]
    node[path[-1]] = new
    return msg


@settings(max_examples=400, **FUZZ)
@given(st.data())
def test_a_valid_payload_with_one_field_corrupted_is_refused_or_still_valid(data):
    path = data.draw(st.sampled_from(PATHS))
    node = VALID_MSG
    for key in path:
        node = node[key]
    new = _near(node, data) if data.draw(st.booleans()) else data.draw(msgpack_values)
    decodes_or_refuses(msgpack.packb(_replace(VALID_MSG, path, new), use_bin_type=True))


@settings(max_examples=300, **FUZZ)
@given(st.data())
def test_a_valid_payload_with_flipped_or_cut_bytes_is_refused_or_still_valid(data):
    raw = bytearray(VALID)
    for _ in range(data.draw(st.integers(1, 4))):
        i = data.draw(st.integers(0, len(raw) - 1))
        raw[i] ^= data.draw(st.integers(1, 255))
    cut = data.draw(st.integers(0, len(raw)))
    decodes_or_refuses(bytes(raw[:cut]) if data.draw(st.booleans()) else bytes(raw))


# -- declared sizes: refused before allocating ------------------------------------------------------

@settings(max_examples=200, **FUZZ)
@given(name=st.sampled_from(sorted(SPEC.arrays)),
       shape=st.lists(st.integers(0, 2**64 - 1), min_size=1, max_size=6).filter(
           lambda s: math.prod(s) > 10**6),
       payload=st.binary(max_size=64))
def test_huge_declared_shapes_are_refused_by_shape(name, shape, payload):
    dtype = SPEC.arrays[name][0].str
    msg = _replace(VALID_MSG, ("arrays", name), [dtype, shape, payload])
    with pytest.raises(DecodeError, match=f"array '{name}' has shape"):
        decode_unroll(msgpack.packb(msg, use_bin_type=True), SPEC)


def _peak_bytes_while(fn) -> int:
    tracemalloc.start()
    try:
        fn()
    finally:
        peak = tracemalloc.get_traced_memory()[1]
        tracemalloc.stop()
    return peak


def _refused(data):
    def run():
        with pytest.raises(DecodeError):
            decode_unroll(data, SPEC)
    return run


OBS_BIN = b"\xc4" + bytes([len(VALID_MSG["arrays"]["obs"][2])])  # bin8 header of the obs bytes
HUGE_DECLARATIONS = {
    # The decoder compares the declared shape with the spec before it looks at the bytes.
    "shape 2**40 x 3 x 3 x 2 (36 TiB of int8)": msgpack.packb(
        _replace(VALID_MSG, ("arrays", "obs"), ["|i1", [2**40, 3, 3, 2], b"\x00" * 16]), use_bin_type=True),
    "shape 2**62 x 2**62": msgpack.packb(
        _replace(VALID_MSG, ("arrays", "reward"), ["<f4", [2**62, 2**62], b""]), use_bin_type=True),
    # msgpack headers that declare more than the message holds: the unpacker checks before it allocates.
    "array32 of 2**32-1 items": b"\xdd\xff\xff\xff\xff" + b"\xc0" * 8,
    "map32 of 2**32-1 pairs": b"\xdf\xff\xff\xff\xff" + b"\xc0" * 8,
    "bin32 of 4 GiB": b"\xc6\xff\xff\xff\xff" + b"\x00" * 8,
    "str32 of 4 GiB": b"\xdb\xff\xff\xff\xff" + b"a" * 8,
    "bin32 of 4 GiB in place of the obs bytes": VALID[:VALID.index(OBS_BIN)] + b"\xc6\xff\xff\xff\xff"
                                                + VALID[VALID.index(OBS_BIN) + 2:],
}


@pytest.mark.parametrize("data", HUGE_DECLARATIONS.values(), ids=HUGE_DECLARATIONS.keys())
def test_a_huge_declared_size_allocates_nothing_of_that_size(data):
    start = time.perf_counter()
    peak = _peak_bytes_while(_refused(data))
    assert peak < 1 << 20, f"decoding allocated {peak} bytes"
    assert time.perf_counter() - start < 1.0


def test_a_message_over_the_byte_limit_is_refused_before_parsing():
    data = b"\xc6" + (MAX_MESSAGE_BYTES).to_bytes(4, "big") + b"\x00" * MAX_MESSAGE_BYTES  # one bin, 64 MiB + 5
    peak = _peak_bytes_while(_refused(data))
    assert peak < 1 << 20, f"decoding allocated {peak} bytes for a message it refuses by length"


# -- config loading ---------------------------------------------------------------------------------

KEYS = [f"{s}.{f}" for s, cls in SECTIONS.items() for f in cls.__dataclass_fields__]
config_values = (st.none() | st.booleans() | st.integers(-2**70, 2**70) | st.just(10**400) | st.floats()
                 | st.text(max_size=20)
                 | st.sampled_from(["auto", "cpu", "conv", "mlp", "same", "valid", "adam", "rmsprop", "tictactoe",
                                    "connect_four", "offline", "disabled", "???", "${run.seed}", "1e400", ".nan"])
                 | st.lists(st.integers(), max_size=3)
                 | st.dictionaries(st.text(max_size=5), st.integers(), max_size=2))
config_keys = st.sampled_from(KEYS) | st.text(max_size=20)


def _nested(pairs: dict[str, object]) -> dict:
    out: dict = {}
    for key, value in pairs.items():
        section, _, name = key.partition(".")
        if name:
            out.setdefault(section, {})
            if isinstance(out[section], dict):
                out[section][name] = value
        else:
            out[section] = value
    return out


def accepted_or_refused(load) -> Config | None:
    """`load()` returns a Config that round-trips through its YAML, or raises ConfigError with a reason."""
    try:
        cfg = load()
    except ConfigError as e:
        assert str(e)
        event("refused")
        return None
    event("accepted")
    assert isinstance(cfg, Config)
    assert from_yaml_text(to_yaml(cfg)) == cfg  # what was accepted can be written and read back exactly
    return cfg


@settings(max_examples=150, **FUZZ)
@given(st.text(max_size=200))
def test_random_text_as_a_config_is_accepted_or_refused_with_a_reason(text):
    accepted_or_refused(lambda: from_yaml_text(text))


@settings(max_examples=150, **FUZZ)
@given(st.dictionaries(config_keys, config_values, max_size=6))
def test_random_yaml_configs_are_accepted_or_refused_with_a_reason(pairs):
    try:
        text = yaml.safe_dump(_nested(pairs))
    except yaml.YAMLError:
        assume(False)
    accepted_or_refused(lambda: from_yaml_text(text))


@settings(max_examples=150, **FUZZ)
@given(st.lists(st.tuples(config_keys, config_values | st.text(max_size=20)), max_size=4),
       st.sampled_from(["=", "=", " = ", "", "=="]))
def test_random_set_overrides_are_accepted_or_refused_with_a_reason(items, sep):
    overrides = [f"{key}{sep}{value}" for key, value in items]
    cfg = accepted_or_refused(lambda: load_config(None, overrides))
    if cfg is not None:
        for item in overrides:  # an accepted override names a real key
            assert item.split("=", 1)[0].strip() in KEYS


@settings(max_examples=60, **FUZZ)
@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_random_config_files_are_accepted_or_refused_with_a_reason(content):
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "fuzz.yaml"
        path.write_bytes(content)
        accepted_or_refused(lambda: load_config(path))


# -- what the fuzzing found, kept as fixed cases ----------------------------------------------------

def test_an_arrays_map_with_both_str_and_bytes_keys_is_refused():
    """Sorting the keys for the message used to raise TypeError (bytes < str)."""
    msg = _replace(VALID_MSG, ("arrays",), {"obs": 1, b"done": 2})
    with pytest.raises(DecodeError, match="arrays must be exactly"):
        decode_unroll(msgpack.packb(msg, use_bin_type=True), SPEC)


@pytest.mark.parametrize("text, message", [
    ("1", "bad config"),  # OmegaConf.create asserted on a bare number
    ("learner:\n  learning_rate: 1" + "0" * 400, "learner.learning_rate=1000.* is out of range"),  # OverflowError
    ("run:\n  name: ???", r"run.name is '\?\?\?'"),  # silently kept the default
])
def test_config_text_found_by_fuzzing_is_refused(text, message):
    with pytest.raises(ConfigError, match=message):
        from_yaml_text(text)


@pytest.mark.parametrize("override, message", [
    ("learner.learning_rate=" + "9" * 400, "learner.learning_rate=999.* is out of range"),  # OverflowError
    ("run.seed=[1", r"override 'run.seed=\[1': the value is not valid YAML"),  # yaml ParserError escaped
    ("run.name=???", r"run.name is '\?\?\?'"),
])
def test_overrides_found_by_fuzzing_are_refused(override, message):
    with pytest.raises(ConfigError, match=message):
        load_config(None, [override])
