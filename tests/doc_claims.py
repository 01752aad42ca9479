"""What the tests of docs/results.md's claims share: the committed results, a passage of the doc with its line breaks
folded, and numbers written the way the doc writes them (thousands with a comma, the sign always, the unicode minus),
so that a claim is checked by recomputing its number from ``benchmarks/results/`` and finding that exact string."""

import json
import re
from functools import cache
from pathlib import Path

from hddm_flower.gmm.truth import interval

ROOT = Path(__file__).resolve().parent.parent
RESULTS = ROOT / "benchmarks" / "results"
DOC = ROOT / "docs" / "results.md"


@cache
def load(name: str) -> dict:
    """A committed result file of ``benchmarks/results/``."""
    return json.loads((RESULTS / name).read_text())


@cache
def raw_passage(start: str, end: str, doc: Path = DOC) -> str:
    """The text of ``doc`` from ``start`` up to ``end`` (not included)."""
    text = doc.read_text()
    i = text.index(start)
    return text[i : text.index(end, i)]


@cache
def passage(start: str, end: str, doc: Path = DOC) -> str:
    """:func:`raw_passage` with its whitespace folded, so a number wrapped over two lines reads as one."""
    return re.sub(r"\s+", " ", raw_passage(start, end, doc)).strip()


def num(x: float, digits: int, sign: bool = True) -> str:
    """``x`` as the doc writes it: thousands with a comma, the sign always (unless ``sign`` is off), unicode minus."""
    return format(x, f"{'+' if sign else ''},.{digits}f").replace("-", "−")


def iv(x: dict, digits: int, half_digits: int | None = None, scale: float = 1.0) -> str:
    """``mean ± half`` of an interval (a dict with ``mean`` and ``half``), as the doc writes it."""
    h = digits if half_digits is None else half_digits
    return f"{num(x['mean'] * scale, digits)} ± {num(x['half'] * scale, h, sign=False)}"


def resolved(x: dict) -> bool:
    """A paired difference's own verdict (``resolved``), or else its interval off 0 (``lo``/``hi`` or ``mean ± half``)."""
    if "resolved" in x:
        return x["resolved"]
    lo, hi = (x["lo"], x["hi"]) if "lo" in x else (x["mean"] - x["half"], x["mean"] + x["half"])
    return lo > 0 or hi < 0


def md_table(text: str, header: str) -> list[list[str]]:
    """The cells of the markdown table of ``text`` whose header line starts with ``header`` (one such line): the
    header's cells first, then each body row's, up to the first line that is not a row; the rule is checked."""
    lines = [line.strip() for line in text.splitlines()]
    (i,) = [i for i, line in enumerate(lines) if line.startswith(header)]
    rows = [lines[i]]
    for line in lines[i + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(line)
    cells = [[c.strip() for c in line.strip("|").split("|")] for line in rows]
    assert set(lines[i + 1].strip("|").split("|")) == {"---"}, f"{header}: no rule under the header"
    return cells


def change(before: list[float], after: list[float]) -> dict:
    """A change paired by training: the interval of ``after − before``, training by training."""
    return interval([b - a for a, b in zip(before, after, strict=True)])


def verdict(x: dict) -> str:
    """``a tie`` where the interval holds 0, else ``resolved``, as the doc words it."""
    return "a tie" if x["lo"] < 0 < x["hi"] else "resolved"
