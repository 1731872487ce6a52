"""Folding similar log lines of many ranks into one, as Monarch's log client does.

A window's lines are kept per stream (stdout, stderr) in groups. A line joins the group whose
first line is most similar to it, if any is similar enough, and starts a group of its own
otherwise. Two lines are similar when their normalized edit distance (Levenshtein distance
over the length of the longer) is below ``SIMILARITY`` (0.15, Monarch's threshold), compared
on what the actor wrote: the text after podium's ``[<mesh> <rank>] `` prefix, so
``[w {'gpus': 0/4}] loss 0.31`` and ``[w {'gpus': 3/4}] loss 0.31`` are one line said by two
ranks, and "step 1" / "step 2" are similar, as they are in Monarch.

When the window closes, each group is printed once, in the order the groups began, as
``[<count> similar log lines] <its first line, prefix included>``, between a
``>>> Aggregated Logs (<start>) >>>`` and a ``<<< Aggregated Logs (<end>) <<<`` line, as
Monarch prints them (coloured only on a terminal).

Bounds, so that a chatty window stays cheap: an identical text joins its group through a
dict; the edit distance (C++, ``podium._core.base.edit_distance_below``) is computed on the
first ``COMPARE_CHARS`` characters and stops once the threshold is out of reach; a new text
is compared with the ``FUZZY_GROUPS`` groups begun last; a window holding ``MAX_GROUPS``
groups is printed early by the sink (nothing is dropped).

  LG-4 Every line added to an Aggregator is counted in exactly one group, and take() returns
    each group once, with its count, in the order the groups began; after take() the
    aggregator is empty.
"""

from __future__ import annotations

import time
from typing import Dict, List, Optional, Tuple

from podium._core.base import edit_distance_below  # ED-1, in C++: thousands per window

SIMILARITY = 0.15
COMPARE_CHARS = 512
FUZZY_GROUPS = 64
MAX_GROUPS = 5000

_YELLOW, _CYAN, _RESET = "\x1b[33m", "\x1b[36m", "\x1b[0m"


def _similar_distance(a: str, b: str, below: Optional[int] = None) -> Optional[int]:
    """The edit distance of ``a`` and ``b`` (first COMPARE_CHARS characters) if they are
    similar, and it is below ``below`` when given; else None."""
    a, b = a[:COMPARE_CHARS], b[:COMPARE_CHARS]
    longest = max(len(a), len(b))
    if longest == 0:
        return 0
    # distance / longest < SIMILARITY  <=>  distance < SIMILARITY * longest
    limit = int(SIMILARITY * longest - 1e-9) + 1
    if below is not None:
        limit = min(limit, below)
    d = edit_distance_below(a, b, limit)
    return d if d is not None and d / longest < SIMILARITY else None


def similar(a: str, b: str) -> bool:
    """Monarch's rule: normalized edit distance below SIMILARITY."""
    return _similar_distance(a, b) is not None


class _Group:
    __slots__ = ("prefix", "text", "count")

    def __init__(self, prefix: str, text: str) -> None:
        self.prefix, self.text, self.count = prefix, text, 1


class Aggregator:
    """The groups of one stream's lines in the current window (not thread-safe: the sink
    calls it under its lock)."""

    def __init__(self) -> None:
        self._groups: List[_Group] = []
        self._by_text: Dict[str, _Group] = {}
        self.start: Optional[float] = None  # wall time of the window's first line

    def __len__(self) -> int:
        return len(self._groups)

    def add(self, prefix: str, text: str) -> None:
        if self.start is None:
            self.start = time.time()
        group = self._by_text.get(text)
        if group is None:
            best, best_d = None, None
            for g in self._groups[-FUZZY_GROUPS:]:
                d = _similar_distance(g.text, text, best_d)  # only a closer group matters
                if d is not None:
                    best, best_d = g, d
                    if d == 0:
                        break
            group = best
            if group is None:
                group = _Group(prefix, text)
                self._groups.append(group)
                self._by_text[text] = group
                return
            self._by_text[text] = group
        group.count += 1

    def take(self) -> List[Tuple[int, str]]:
        """(count, first line) of each group, in order; empties the aggregator."""
        out = [(g.count, g.prefix + g.text) for g in self._groups]
        self._groups, self._by_text = [], {}
        return out

    def render(self, color: bool) -> str:
        """The window's block as printed (see the module doc), and empties the aggregator;
        "" when nothing was added."""
        start = self.start
        self.start = None
        groups = self.take()
        if not groups:
            return ""
        stamp = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(start))
        end = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime())
        y, c, r = (_YELLOW, _CYAN, _RESET) if color else ("", "", "")
        lines = [f"{c}>>> Aggregated Logs ({stamp}) >>>{r}"]
        lines += [f"{y}[{n} similar log lines]{r} {line}" for n, line in groups]
        lines.append(f"{c}<<< Aggregated Logs ({end}) <<<{r}")
        return "\n".join(lines) + "\n"
