"""Reading configuration: YAML files (bounded in size, nesting and alias expansion; ``base:`` files merged) and
dotted overrides (``expert.steps=50``) into a validated :class:`~hddm_flower.config.schema.Config`. Loading a file imports
neither torch nor any other tensor library.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import math
import re
import types
import typing
from pathlib import Path
from typing import Any

import yaml

from .rules import MAX_VALUE, ConfigError, show_value
from .schema import Config
from .sections import FLAT_OPTIM_KEYS

MAX_FILE_BYTES = 1 << 20  # a config file larger than this is not a config file
MAX_NODES = 100_000  # YAML nodes after expanding aliases (an alias bomb expands to billions)
MAX_DEPTH = 32  # nesting of YAML collections


def _coerce(value: Any, tp: Any, key: str, source: str, default: Any = None) -> Any:
    """``value`` checked against the type ``tp``; a section (dataclass) fills its missing keys from ``default``."""
    origin = typing.get_origin(tp)
    if tp is Any:
        return value
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{source}: {key}: expected a mapping, got {type(value).__name__}")
        return _build(tp, value, source, prefix=f"{key}.", defaults=default)
    if origin in (typing.Union, types.UnionType):
        args = typing.get_args(tp)
        if value is None and type(None) in args:
            return None
        return _coerce(value, next(a for a in args if a is not type(None)), key, source)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{source}: {key}: expected a list, got {type(value).__name__}")
        (item,) = typing.get_args(tp)
        return [_coerce(v, item, f"{key}[{i}]", source) for i, v in enumerate(value)]
    if tp is float and isinstance(value, int) and not isinstance(value, bool):
        try:
            return float(value)
        except OverflowError:
            raise ConfigError(f"{source}: {key}: {show_value(value)} is too large for a number") from None
    if isinstance(value, bool) != (tp is bool) or not isinstance(value, tp):
        raise ConfigError(f"{source}: {key}: expected {tp.__name__}, got {show_value(value)}")
    if tp is float and not math.isfinite(value):
        raise ConfigError(f"{source}: {key}: expected a finite number, got {value}")
    return value


@functools.cache
def _type_hints(cls: type) -> dict[str, Any]:
    return typing.get_type_hints(cls)


def _build(cls: type, values: dict, source: str, prefix: str = "", defaults: Any = None) -> Any:
    """A ``cls`` from ``values``; keys not given keep their value in ``defaults`` (default: ``cls()``), so a nested
    section keeps the defaults its parent gives it (``router.optim`` warms up for 40 steps, ``expert.optim`` 50)."""
    defaults = cls() if defaults is None else defaults
    hints = _type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    if "optim" in names:
        values = _lift_flat_optim(values, source, prefix)
    for k in values:
        if k not in names:
            text = str(k)[:MAX_VALUE]
            close = [n for n in names if n.replace("_", "") == text.replace("_", "").replace("-", "")]
            close = close or difflib.get_close_matches(text, sorted(names), n=1, cutoff=0.7)
            hint = f" (did you mean {prefix}{close[0]}?)" if close else f"; known keys: {', '.join(sorted(names))}"
            raise ConfigError(
                f"{source}: unknown key {prefix}{show_value(k) if not isinstance(k, str) else text}{hint}"
            )
    given = {k: _coerce(v, hints[k], prefix + k, source, getattr(defaults, k)) for k, v in values.items()}
    return dataclasses.replace(defaults, **given)


def _lift_flat_optim(values: dict, source: str, prefix: str) -> dict:
    """``expert.lr`` (the flat form older files and run directories use) → ``expert.optim.lr``."""
    flat = {k: v for k, v in values.items() if k in FLAT_OPTIM_KEYS}
    block = values.get("optim")
    if not flat or not isinstance(block if block is not None else {}, dict):
        return values  # nothing to lift, or a malformed optim block the type check names
    block = dict(block or {})
    for k, v in flat.items():
        if FLAT_OPTIM_KEYS[k] in block:
            raise ConfigError(f"{source}: {prefix}{k} and {prefix}optim.{FLAT_OPTIM_KEYS[k]} both given; keep one")
        block[FLAT_OPTIM_KEYS[k]] = v
    return {**{k: v for k, v in values.items() if k not in flat}, "optim": block}


def _lift_sections(values: dict, source: str) -> dict:
    """Every section with an optim block in its nested form (``_lift_flat_optim``), so that files and overrides
    written in either form merge key by key."""
    out = dict(values)
    for name in ("expert", "router"):
        if isinstance(out.get(name), dict):
            out[name] = _lift_flat_optim(out[name], source, f"{name}.")
    return out


def _lift_override(dotted: str) -> str:
    """``expert.lr`` → ``expert.optim.lr`` (the flat spelling of an optim key)."""
    parts = dotted.split(".")
    if len(parts) == 2 and parts[0] in ("expert", "router") and parts[1] in FLAT_OPTIM_KEYS:
        return f"{parts[0]}.optim.{FLAT_OPTIM_KEYS[parts[1]]}"
    return dotted


def config_from_dict(values: dict, source: str = "<dict>") -> Config:
    """Build and validate a :class:`Config` from plain data (e.g. parsed YAML or JSON)."""
    if values is None:
        values = {}
    if not isinstance(values, dict):
        raise ConfigError(f"{source}: the top level must be a mapping")
    if isinstance(values.get("objectives"), list):  # shorthand: objectives: [ddpm, fm, …]
        values = dict(values, objectives={"per_expert": values["objectives"]})
    return _build(Config, values, source).validate(source)


def _expanded_size(node: yaml.Node, where: str, memo: dict[int, int], active: set[int], depth: int = 0) -> int:
    """Number of nodes ``node`` stands for once its aliases are expanded (computed once per node)."""
    if id(node) in memo:
        return memo[id(node)]
    if depth > MAX_DEPTH:
        raise ConfigError(f"{where}: nested more than {MAX_DEPTH} levels deep")
    if id(node) in active:
        raise ConfigError(f"{where}: a YAML alias refers to a collection that contains it")
    active.add(id(node))
    children = []
    if isinstance(node, yaml.SequenceNode):
        children = node.value
    elif isinstance(node, yaml.MappingNode):
        children = [n for pair in node.value for n in pair]
    size = 1
    for child in children:
        size += _expanded_size(child, where, memo, active, depth + 1)
        if size > MAX_NODES:
            raise ConfigError(f"{where}: more than {MAX_NODES} values once its YAML aliases are expanded")
    active.discard(id(node))
    memo[id(node)] = size
    return size


class _Loader(yaml.SafeLoader):
    """PyYAML's safe loader, with YAML 1.2's floats: ``2e-3`` and ``1E5`` are numbers (YAML 1.1 reads a float
    without a dot as a string, and ``lr: 2e-3`` would be refused)."""


_Loader.add_implicit_resolver(
    "tag:yaml.org,2002:float",
    re.compile(r"^[-+]?(?:[0-9][0-9_]*(?:\.[0-9_]*)?|\.[0-9_]+)[eE][-+]?[0-9]+$"),
    list("-+0123456789."),
)


def _parse_yaml(text: str, where: str) -> Any:
    """Parse YAML text with bounds: at most ``MAX_DEPTH`` levels and ``MAX_NODES`` values after alias expansion
    (so an alias bomb is refused before anything is built), every failure a one-line :class:`ConfigError`."""
    loader = None
    try:
        loader = _Loader(text)  # (its reader already refuses control characters)
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node, where, {}, set())
        return loader.construct_document(node)
    except yaml.YAMLError as e:
        raise ConfigError(f"{where}: not valid YAML: {(str(e).strip().splitlines() or ['?'])[0]}") from None
    except RecursionError:
        raise ConfigError(f"{where}: nested too deeply") from None
    except (ValueError, OverflowError) as e:  # e.g. an integer with more digits than Python converts
        raise ConfigError(f"{where}: not valid YAML: {e}") from None
    finally:
        if loader is not None:
            loader.dispose()


def _read_yaml(path: Path, where: str | None = None) -> dict:
    """A YAML file whose top level is a mapping (empty file = {}); errors name the file."""
    where = where or str(path)
    try:
        with path.open("rb") as f:
            raw = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"{where}: cannot be read: {e.strerror or e}") from None
    if len(raw) > MAX_FILE_BYTES:
        raise ConfigError(f"{where}: larger than {MAX_FILE_BYTES // 1024} KiB; not a config file")
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as e:
        raise ConfigError(f"{where}: not UTF-8 text (byte {e.start} is {raw[e.start]:#04x})") from None
    values = _parse_yaml(text, where)
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise ConfigError(f"{where}: the top level must be a mapping, not a {type(values).__name__}")
    return values


def parse_overrides(text: str) -> dict[str, Any]:
    """``"expert.steps=50 sampling.prompts=[a, b]"`` → ``{"expert.steps": 50, …}`` (values parsed as YAML)."""
    out = {}
    for item in _split_overrides(text):
        key, sep, value = item.partition("=")
        key = key.strip()
        if not sep or not key:
            raise ConfigError(f"override {show_value(item)} is not of the form key=value")
        if not all(part.strip() for part in key.split(".")):
            raise ConfigError(f"override {show_value(item)}: {show_value(key)} is not a dotted key like expert.steps")
        out[key] = _parse_yaml(value, f"override {key[:MAX_VALUE]}")
    return out


def _split_overrides(text: str) -> list[str]:
    """Split on whitespace outside brackets and quotes."""
    items, cur, depth, quote = [], "", 0, None
    for ch in text:
        if quote:
            quote = None if ch == quote else quote
        elif ch in "'\"":
            quote = ch
        elif ch in "[{":
            depth += 1
        elif ch in "]}":
            depth -= 1
        elif ch.isspace() and depth == 0:
            if cur:
                items.append(cur)
            cur = ""
            continue
        cur += ch
    return items + [cur] if cur else items


def _merge(a: dict, b: dict) -> dict:
    """``a`` deep-updated by ``b`` (mappings merge, anything else is replaced)."""
    return {
        **a,
        **{k: _merge(a[k], v) if isinstance(v, dict) and isinstance(a.get(k), dict) else v for k, v in b.items()},
    }


def _with_base(values: dict, path: Path, seen: tuple[Path, ...]) -> dict:
    """Resolve ``base: other.yaml`` (relative to ``path``): the other file's values, deep-updated by these."""
    if "base" not in values:
        return values
    values = dict(values)
    name = values.pop("base")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{path}: base: expected the path of another config file, got {show_value(name)}")
    base = path.parent / name
    if base.resolve() in seen:
        raise ConfigError(f"{path}: base {base} includes itself")
    if not base.is_file():
        raise ConfigError(f"{path}: base {base} does not exist")
    where = f"{base} (base of {path})"
    parent = _with_base(_lift_sections(_read_yaml(base, where), where), base, seen + (base.resolve(),))
    return _merge(parent, values)


def _apply_overrides(values: dict, overrides: dict[str, Any], source: str) -> dict:
    for dotted, value in overrides.items():
        parts = str(dotted).split(".")
        node = values
        for i, part in enumerate(parts[:-1]):
            child = node.get(part)
            if child is None:
                child = node[part] = {}
            elif isinstance(child, dict):
                child = node[part] = dict(child)  # a copy: YAML aliases may share this mapping with another key
            else:
                raise ConfigError(f"{source}: override {dotted}: {'.'.join(parts[: i + 1])} is not a section")
            node = child
        node[parts[-1]] = value
    return values


def load_config(path: str | Path, overrides: dict[str, Any] | None = None) -> Config:
    """Load a YAML file into a validated :class:`Config`, applying dotted overrides."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist")
    source = str(path)
    raw = _read_yaml(path)
    if not raw:  # a file that says nothing is a mistake (a wrong path, an unsaved editor), not "all defaults"
        raise ConfigError(
            f"{path}: holds no settings (empty or comments only); name the defaults with base: default.yaml"
        )
    values = _with_base(_lift_sections(raw, source), path, seen=(path.resolve(),))
    if overrides:
        values = _apply_overrides(dict(values), {_lift_override(str(k)): v for k, v in overrides.items()}, source)
        names = ", ".join(map(str, overrides))
        source += f" (with overrides {names if len(names) <= 80 else names[:79] + '…'})"
    return config_from_dict(values, source)
