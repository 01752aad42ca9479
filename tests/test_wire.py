"""hddm_flower.wire: bounded reading of what a peer sends (fuzzed) and the record names both Flower sides share."""

import json
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hddm_flower import wire
from hddm_flower.wire import WireError, as_float, as_int, as_str, loads

FAST = settings(max_examples=600, deadline=None, suppress_health_check=[HealthCheck.too_slow])

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=30,
)


@FAST
@given(st.text(max_size=200))
def test_any_text_is_parsed_or_refused_in_one_line(text):
    try:
        value = loads(text, "metadata", max_bytes=150)
    except WireError as e:
        assert str(e).startswith("metadata") and "\n" not in str(e) and len(str(e)) < 300
    else:
        assert len(text.encode("utf-8", "surrogatepass")) <= 150
        assert value == json.loads(text)


@settings(max_examples=300, deadline=None)
@given(json_values)
def test_json_within_the_bounds_round_trips(value):
    text = json.dumps(value)
    try:
        out = loads(text, "x", max_bytes=10**6)
    except WireError as e:  # only integers too large for the bound, or nesting past it
        assert "too large" in str(e) or "nested" in str(e)
    else:
        assert out == value


@pytest.mark.parametrize(
    "text, why",
    [
        ("[" * 100_000 + "]" * 100_000, "not valid JSON"),  # the parser's own recursion limit
        ("[" * 10 + "]" * 10, "nested more than 8"),
        ('{"a": NaN}', "NaN"),
        ('{"a": -Infinity}', "-Infinity"),
        ("1e999", "overflows"),
        ("9" * 5000, "too large"),  # Python would spend time (and raise past 4300 digits)
        ('"x"' + " " * 10, None),
    ],
)
def test_hostile_json_is_refused(text, why):
    if why is None:
        assert loads(text, "m", max_bytes=100) == "x"
        return
    with pytest.raises(WireError, match=why):
        loads(text, "m", max_bytes=10**7)


def test_sizes_and_types_are_checked_before_parsing():
    assert loads("18446744073709551615", "node_id", max_bytes=100) == 2**64 - 1  # Flower's node ids are uint64
    with pytest.raises(WireError, match="more than 1000 values"):
        loads("[" + ",".join(["0"] * 2000) + "]", "m", max_bytes=10**6, max_elements=1000)
    with pytest.raises(WireError, match="exceed the limit of 10"):
        loads('"' + "x" * 20 + '"', "meta", max_bytes=10)
    with pytest.raises(WireError, match="expected a JSON string, got bytes"):
        loads(b"{}", "meta", max_bytes=10)
    with pytest.raises(WireError, match="expected a JSON string, got int"):
        loads(3, "meta", max_bytes=10)


@settings(max_examples=400, deadline=None)
@given(json_values | st.floats() | st.integers(min_value=-(2**80), max_value=2**80))
def test_scalars_are_taken_only_with_their_type_and_range(value):
    for fn, args in ((as_int, (0, 100)), (as_float, (0.0, 100.0)), (as_str, ())):
        try:
            out = fn(value, "field", *args)
        except WireError as e:
            assert str(e).startswith("field: ") and "\n" not in str(e) and len(str(e)) < 200
            continue
        if fn is as_int:
            assert type(out) is int and 0 <= out <= 100 and not isinstance(value, (bool, str)) and out == value
        elif fn is as_float:
            assert type(out) is float and math.isfinite(out) and 0 <= out <= 100 and not isinstance(value, bool)
        else:
            assert out is value and len(out) <= 256


def test_silent_conversions_are_refused():
    """What int()/float() would quietly accept: a bool, a numeric string, a fractional float, infinity."""
    for value in (True, "3", 3.5, float("inf"), float("nan"), [3], None):
        with pytest.raises(WireError):
            as_int(value, "expert_id", 0, 10)
    assert as_int(3.0, "expert_id", 0, 10) == 3 and as_int(7, "x") == 7
    with pytest.raises(WireError, match="outside 0..10"):
        as_int(10**30, "expert_id", 0, 10)
    with pytest.raises(WireError, match="not one of"):
        as_str("edm", "objective", choices=("fm", "ddpm"))


def test_both_flower_sides_use_the_wire_module():
    """The record names are spelled once: the client and the strategy import them, neither spells them."""
    from pathlib import Path

    root = Path(__file__).parent.parent
    for path in ("clients/client_app.py", "strategies/one_shot.py"):
        text = (root / path).read_text()
        assert "from hddm_flower import wire" in text
        for literal in ('"safetensors"', '"node-info"', '"model-config"'):
            assert literal not in text, f"{path} spells {literal}"
    assert wire.STYPE == "safetensors"
