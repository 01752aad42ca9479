"""Property-based tests of the config loader: whatever YAML document, dict or override string it gets, it returns
a valid Config or raises a ConfigError of one bounded line — never another exception, never a hang."""

import dataclasses
import math
import os
import tempfile
import typing
from pathlib import Path

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from hddm_flower.config.io import config_from_dict, load_config, parse_overrides
from hddm_flower.config.rules import MAX_MESSAGE, ConfigError
from hddm_flower.config.schema import Config

FUZZ = settings(
    max_examples=int(os.environ.get("HDDM_FUZZ_EXAMPLES", "500")),
    deadline=2000,  # ms per input: a loader that hangs (an alias bomb expanded) fails here
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    derandomize=True,  # the same inputs on every run of the suite; HDDM_FUZZ_EXAMPLES=20000 explores further
)

SECTIONS = {f.name: f.type for f in dataclasses.fields(Config)}
HINTS = typing.get_type_hints(Config)
KEYS = {name: [g.name for g in dataclasses.fields(tp)] for name, tp in HINTS.items() if dataclasses.is_dataclass(tp)}
ALL_KEYS = sorted({k for keys in KEYS.values() for k in keys} | set(KEYS) | {"num_experts", "optim", "base"})

numbers = st.one_of(
    st.integers(-3, 12),
    st.integers(),
    st.floats(allow_nan=True, allow_infinity=True),
    st.sampled_from([0, 1, 2, 8, 9, 0.0, 0.5, 1.0, 1.5, -1, 1e-3, 2**31, 2**63, 10**40, float("nan"), float("inf")]),
)
words = st.one_of(
    st.sampled_from(
        [
            "fm",
            "ddpm",
            "auto",
            "top_k",
            "top2",
            "top9",
            "top2+vscale",
            "threshold",
            "cosine",
            "gmm",
            "pixels",
            "random",
            "bf16",
            "float16",
            "fused",
            "central",
            "",
            " ",
            "twemoji",
            "webdataset",
        ]
    ),
    st.text(max_size=12),
)
scalars = st.one_of(st.none(), st.booleans(), numbers, words)
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=5),
        st.dictionaries(st.one_of(st.sampled_from(ALL_KEYS), st.integers(-2, 9), words), inner, max_size=5),
    ),
    max_leaves=6,
)


@st.composite
def config_like(draw) -> dict:
    """Mostly the schema's own sections and keys with plausible and absurd values, sometimes something else."""
    doc = {}
    for section in draw(st.lists(st.sampled_from(sorted(SECTIONS)), max_size=3, unique=True)):
        if section in KEYS and draw(st.booleans()):
            keys = draw(st.lists(st.sampled_from(KEYS[section] + ["lr", "optimizer", "warmup_steps"]), max_size=3))
            doc[section] = {k: draw(values) for k in keys}
            if section in ("expert", "router") and draw(st.booleans()):
                doc[section]["optim"] = {
                    k: draw(scalars)
                    for k in draw(
                        st.lists(
                            st.sampled_from(
                                ["lr", "weight_decay", "warmup_steps", "grad_clip", "implementation", "beta"]
                            ),
                            max_size=3,
                        )
                    )
                }
        else:
            doc[section] = draw(values)
    if draw(st.integers(0, 9)) == 0:
        doc[draw(words)] = draw(values)
    return doc


def _check(fn, *args):
    """``fn(*args)`` is a valid Config or a one-line ConfigError of bounded length."""
    try:
        cfg = fn(*args)
    except ConfigError as e:
        text = str(e)
        assert text and "\n" not in text and len(text) <= MAX_MESSAGE, text[:500]
        return None
    assert isinstance(cfg, Config)
    assert cfg.validate() is cfg  # what it returns passes its own checks …
    assert config_from_dict(cfg.to_dict()) == cfg  # … and survives the round trip a run directory makes
    for f in (cfg.expert.optim.lr, cfg.sampling.threshold, cfg.sampling.t_eps, cfg.expert.caption_dropout):
        assert math.isfinite(f)
    assert 1 <= cfg.sampling.top_k <= cfg.num_experts
    return cfg


@pytest.fixture(scope="module")
def scratch():
    with tempfile.TemporaryDirectory() as d:
        yield Path(d)


@FUZZ
@given(doc=config_like())
def test_generated_documents(scratch, doc):
    """The same generated document as plain data (a train message) and as a YAML file (with a base file)."""
    _check(config_from_dict, doc, "fuzz")
    path = scratch / "fuzz.yaml"
    path.write_text(yaml.safe_dump(doc, allow_unicode=True))
    _check(load_config, path)


YAML_BITS = st.sampled_from(
    [
        "{",
        "}",
        "[",
        "]",
        ":",
        ": ",
        ",",
        "- ",
        "&a ",
        "*a",
        "!!str ",
        "!!binary ",
        "!!python/object ",
        "? ",
        "|",
        ">",
        "'",
        '"',
        "#",
        "\n",
        "\n  ",
        "\t",
        "%YAML 1.1\n",
        "---\n",
        "...\n",
        "<<: ",
        "\\",
        "\x00",
        "\xe9",
        "~",
        "expert",
        "steps",
        "optim",
        "lr",
        "sampling",
        "top_k",
        "base",
        "num_experts",
        "0",
        "1e400",
        ".nan",
        "-.inf",
    ]
)


@FUZZ
@given(pieces=st.lists(st.one_of(YAML_BITS, st.text(max_size=4)), max_size=30), raw=st.binary(max_size=8))
def test_generated_text(scratch, pieces, raw):
    """Arbitrary text and bytes: syntax errors, tags, anchors, control characters, broken UTF-8."""
    path = scratch / "text.yaml"
    path.write_bytes("".join(pieces).encode("utf-8", "surrogatepass") + raw)
    _check(load_config, path)


@FUZZ
@given(
    items=st.lists(
        st.tuples(
            st.one_of(
                st.sampled_from(
                    [
                        "expert.steps",
                        "expert.lr",
                        "router.optim.lr",
                        "sampling.top_k",
                        "expert",
                        "sampling.prompts",
                        "num_experts",
                        "a.b.c",
                        "expert.steps.x",
                        ".",
                        "x..y",
                    ]
                ),
                st.text(max_size=8),
            ),
            st.one_of(
                st.sampled_from(
                    [
                        "3",
                        "0",
                        "-1",
                        "[",
                        "]",
                        "{a: 1}",
                        "[a, 'b c']",
                        ".inf",
                        "*x",
                        "&x 1",
                        "'",
                        '"',
                        "null",
                        "1e999",
                        "true",
                    ]
                ),
                st.text(max_size=8),
            ),
        ),
        max_size=4,
    )
)
def test_generated_overrides(scratch, items):
    """`--set` strings: parsed (or refused) as one line, then applied to the default config through the same checks."""
    path = scratch / "base.yaml"
    if not path.exists():
        path.write_text("expert: {steps: 5}\n")
    text = " ".join(f"{k}={v}" for k, v in items)
    try:
        overrides = parse_overrides(text)
    except ConfigError as e:
        assert "\n" not in str(e) and len(str(e)) <= MAX_MESSAGE
        return
    _check(load_config, path, overrides)
