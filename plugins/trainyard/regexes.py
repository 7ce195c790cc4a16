"""What a data contract's ``regex`` may be, and how values are searched with it.

Python's ``re`` backtracks: a repeated group whose rounds can split a value many ways
(``(a+)+``, ``(a|aa)+``) takes exponential time on a value that almost matches, so one
record could stall validation or the stream scorer. :func:`nested_repetition` and
:func:`ambiguous_alternation` refuse such patterns when a contract is read, from the
pattern as ``re``'s own parser sees it (:class:`_RegexTree`); :func:`value_pattern` makes
``$`` the value's end. Slow patterns the checks cannot see (``a*a*a*...``) become the
stream scorer's poison records.
"""

from __future__ import annotations

import math
import re
from functools import lru_cache
from typing import Any


def value_pattern(regex: str) -> str:
    r"""``regex`` with every ``$`` meaning the value's end (``\Z``).

    Python's ``$`` also matches before a final newline, so ``^ev-[0-9]+$`` took
    ``"ev-1\n"``, and so did ``^yes$|^no$``. An escaped ``\$``, one in a class (``[$]``)
    and one in a comment stay; under ``(?m)`` anywhere, a ``$`` is a line's end and stays.
    """
    try:
        tree = _RegexTree(regex)
        flags = tree.tree.state.flags
        scoped = [av[1] for op, av in tree.items() if op == tree.c.SUBPATTERN]
    except (re.error, OverflowError, RecursionError):
        return regex  # refused with its own error
    if any(f & re.MULTILINE for f in [flags, *scoped]):
        return regex
    verbose = [bool(flags & re.VERBOSE)]  # per open group: (?x:...) and (?-x:...) scope it
    out, i, in_class, first = [], 0, False, 0
    while i < len(regex):
        ch = regex[i]
        end = i + 1
        if ch == "\\":
            end = i + 2
        elif in_class:
            in_class = not (ch == "]" and i > first)  # []a] and [^]a] hold a "]"
        elif ch == "[":
            in_class, first = True, i + 1 + (regex[i + 1 : i + 2] == "^")
        elif regex.startswith("(?#", i):
            end = regex.find(")", i) + 1 or len(regex)
        elif verbose[-1] and ch == "#":
            end = regex.find("\n", i) + 1 or len(regex)
        elif ch == "(":
            scope = re.match(r"\(\?([aiLmsux]*)(?:-([imsx]*))?:", regex[i:])
            on = verbose[-1]
            if scope:
                on = "x" in scope[1] or (on and "x" not in (scope[2] or ""))
            verbose.append(on)
        elif ch == ")" and len(verbose) > 1:
            verbose.pop()
        elif ch == "$":
            ch = "\\Z"
        out.append(ch if end == i + 1 else regex[i:end])
        i = end
    return "".join(out)


@lru_cache(maxsize=256)
def usable_regex(regex: str) -> re.Pattern[str] | None:
    """The compiled search of a contract's ``regex``; None if it is invalid or slow."""
    try:
        compiled = re.compile(value_pattern(regex))
        if nested_repetition(regex) or ambiguous_alternation(regex):
            return None
    except (re.error, OverflowError, RecursionError):
        return None
    return compiled


@lru_cache(maxsize=1)
def _every_character() -> str:
    """Every code point but the surrogates, in order."""
    return "".join(map(chr, range(0xD800))) + "".join(map(chr, range(0xE000, 0x110000)))


@lru_cache(maxsize=1024)
def _leaf_chars(source: str, flags: int) -> tuple[tuple[int, int], ...]:
    r"""What the one-character pattern ``source`` matches, as ranges, asked of ``re``.

    One pass of ``re`` over every code point finds the runs it matches: exact, where a
    sample of characters missed a ``\d`` inside ``[\u1000-\u2000]`` or ``(?i)`` pairs.
    """
    if re.fullmatch(r"\\?.", source, re.DOTALL) and not flags:  # one literal
        x = ord(source[-1])
        return ((x, x),)
    every = _every_character()
    runs = []
    for m in re.finditer(f"(?:{source})+", every, flags):
        lo, hi = ord(m.group()[0]), ord(m.group()[-1])
        runs.append((lo, hi))
    return tuple(runs)


def _merged(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(ranges):
        if out and lo <= out[-1][1] + 1:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def _meet(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    """Whether two sorted, merged range lists share a character."""
    i = j = 0
    while i < len(a) and j < len(b):
        if a[i][1] < b[j][0]:
            i += 1
        elif b[j][1] < a[i][0]:
            j += 1
        else:
            return True
    return False


def _leaf_source(c: Any, op: Any, av: Any) -> str:
    """A pattern matching what one parsed leaf (a literal, a class) matches."""

    def one(x: int) -> str:
        return re.escape(chr(x))

    if op == c.LITERAL:
        return one(av)
    if op == c.NOT_LITERAL:
        return f"[^{one(av)}]"
    categories = {"DIGIT": r"\d", "NOT_DIGIT": r"\D", "SPACE": r"\s", "NOT_SPACE": r"\S",
                  "WORD": r"\w", "NOT_WORD": r"\W"}  # fmt: skip
    body = ""
    for kind, arg in av:
        if kind == c.NEGATE:
            body = "^" + body
        elif kind == c.LITERAL:
            body += one(arg)
        elif kind == c.RANGE:
            body += f"{one(arg[0])}-{one(arg[1])}"
        elif kind == c.CATEGORY:
            body += categories.get(str(arg).removeprefix("CATEGORY_"), r"\s\S")
    return f"[{body}]" if body else "[^\\s\\S]"


class _RegexTree:
    """A pattern as Python's ``re`` parser sees it, and what its parts can match."""

    def __init__(self, pattern: str) -> None:
        from re import _constants as c  # type: ignore[attr-defined]
        from re import _parser  # type: ignore[attr-defined]

        self.c = c
        self.tree = _parser.parse(pattern)
        # (?i) anywhere folds case everywhere: LITERAL 65 then matches "a" too
        self.fold = bool(self.tree.state.flags & c.SRE_FLAG_IGNORECASE) or any(
            op == c.SUBPATTERN and av[1] & c.SRE_FLAG_IGNORECASE for op, av in self.items()
        )
        self.flags = re.IGNORECASE if self.fold else 0
        self.varying_ops = (c.MAX_REPEAT, c.MIN_REPEAT)
        self.zero_width = (c.AT, c.ASSERT, c.ASSERT_NOT)

    def children(self, op: Any, av: Any) -> list[Any]:
        """The sequences directly inside one node (every kind: atomic, conditional...)."""
        c = self.c
        if op in (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT):
            return [av[2]]
        if op == c.SUBPATTERN:
            return [av[3]]
        if op == c.ATOMIC_GROUP:
            return [av]
        if op == c.BRANCH:
            return list(av[1])
        if op in (c.ASSERT, c.ASSERT_NOT):
            return [av[1]]
        if op == c.GROUPREF_EXISTS:
            return [x for x in av[1:] if x is not None]
        return []

    def items(self, seq: Any = None) -> Any:
        """Every node of ``seq`` (default: the whole pattern), depth first."""
        for op, av in self.tree if seq is None else seq:
            yield op, av
            for child in self.children(op, av):
                yield from self.items(child)

    def chars(self, leaves: list[tuple[Any, Any]]) -> list[tuple[int, int]]:
        """Every character one of ``leaves`` can match, as sorted, merged ranges."""
        c = self.c
        ranges: list[tuple[int, int]] = []
        for op, av in leaves:
            if op not in (c.LITERAL, c.NOT_LITERAL, c.IN):
                return [(0, 0x10FFFF)]  # any character, a back reference
            ranges += _leaf_chars(_leaf_source(c, op, av), self.flags)
        return _merged(ranges)

    def leaves(self, seq: Any) -> list[tuple[Any, Any]]:
        """The character-matching nodes anywhere inside ``seq``."""
        c = self.c
        kinds = (c.LITERAL, c.NOT_LITERAL, c.IN, c.ANY, c.GROUPREF)
        return [(op, av) for op, av in self.items(seq) if op in kinds]

    def overlap(self, a: Any, b: Any) -> bool:
        """Whether some character can be matched inside both ``a`` and ``b`` (sequences)."""
        return _meet(self.chars(self.leaves(a)), self.chars(self.leaves(b)))

    def varying(self, seq: Any) -> bool:
        """Whether ``seq`` holds a repeat of varying length that can give characters back."""
        for op, av in seq:
            if op in self.varying_ops and av[0] != av[1]:
                return True
            if op in (self.c.ATOMIC_GROUP, self.c.POSSESSIVE_REPEAT):
                continue  # gives nothing back
            if any(self.varying(child) for child in self.children(op, av)):
                return True
        return False

    def splits(self, seq: Any) -> float:
        """At most how many ways one round of ``seq`` can split a stretch (inf: unbounded)."""
        ways = 1.0
        for op, av in seq:
            if op in (self.c.ATOMIC_GROUP, self.c.POSSESSIVE_REPEAT):
                continue
            if op in self.varying_ops and av[0] != av[1]:
                ways *= math.inf if av[1] == self.c.MAXREPEAT else av[1] - av[0] + 1
            inner = 1.0
            for child in self.children(op, av):
                inner *= self.splits(child)
            if op in self.varying_ops and av[0] == av[1] > 1 and inner > 1:
                inner = math.inf if av[1] * math.log(inner) > 50 else inner ** av[1]
            ways = min(ways * inner, math.inf)
        return ways

    def delimited(self, body: Any) -> bool:
        r"""Whether each round of ``body`` is cut off by a character found nowhere else in it.

        A first or last part (a literal, a class) that no other part can match, as in
        ``(\d{1,3}\.){3}`` or ``( [a-z]+)*``: its rounds then split a value one way only.
        """
        parts = self.flat(body)
        for k in (0, len(parts) - 1):
            if not parts:
                return False
            op, av = parts[k]
            others = parts[:k] + parts[k + 1 :]
            if op in self.varying_ops and av[0] >= 1:  # \s+ starts each round too,
                if all(self.nullable([(o, a)]) for o, a in others):
                    continue  # if something else must follow it: not (a+)+, (a+,?+)+
                op, av = av[2][0] if len(av[2]) == 1 else (None, None)
            if op not in (self.c.LITERAL, self.c.IN):
                continue
            if not _meet(self.chars([(op, av)]), self.chars(self.leaves(others))):
                return True
        return False

    def nullable(self, seq: Any) -> bool:
        """Whether ``seq`` can match nothing (``a?+``, ``(?>,?)``, ``(?(1),)``...)."""
        c = self.c
        for op, av in seq:
            if op in self.zero_width:
                continue
            if op in (*self.varying_ops, c.POSSESSIVE_REPEAT):
                if av[0] == 0 or self.nullable(av[2]):
                    continue
                return False
            if op == c.GROUPREF_EXISTS and (av[2] is None or self.nullable(av[2])):
                continue
            kids = self.children(op, av)
            if op in (c.SUBPATTERN, c.ATOMIC_GROUP) and self.nullable(kids[0]):
                continue
            if op in (c.BRANCH, c.GROUPREF_EXISTS) and any(self.nullable(k) for k in kids):
                continue
            return False
        return True

    def heads(self, seq: Any) -> list[tuple[Any, Any]]:
        """The parts a match of ``seq`` can start with (``-`` for ``-[a-z0-9]+``)."""
        out: list[tuple[Any, Any]] = []
        for op, av in self.flat(seq):
            if op in self.varying_ops or op == self.c.POSSESSIVE_REPEAT:
                out += self.heads(av[2])
                if av[0] > 0:
                    return out
            elif op in (self.c.LITERAL, self.c.NOT_LITERAL, self.c.IN, self.c.ANY):
                return [*out, (op, av)]
            else:  # alternatives, a conditional, an atomic group, a back reference
                return [*out, (op, av)]
        return out

    def flat(self, seq: Any) -> list[tuple[Any, Any]]:
        """``seq``'s parts in order, groups that are not repeated opened, no zero-width part."""
        out: list[tuple[Any, Any]] = []
        for op, av in seq:
            if op == self.c.SUBPATTERN:
                out += self.flat(av[3])
            elif op not in self.zero_width:
                out.append((op, av))
        return out

    def repeats_in_a_row(self, seq: Any) -> bool:
        r"""Whether two repeats of varying length in a row can take the same characters.

        ``x+x+`` or ``\d+,?\d*``: each round then splits one stretch many ways.
        """
        parts = self.flat(seq)
        for i, (op, av) in enumerate(parts):
            if op in self.varying_ops and av[0] == av[1] > 1 and self.varying(av[2]):
                return True  # (a{1,2}){5}: five repeats in a row
            if op in self.varying_ops and av[0] != av[1]:
                for op2, av2 in parts[i + 1 :]:
                    if op2 in self.varying_ops and av2[0] != av2[1]:
                        if self.overlap(av[2], self.heads(av2[2])):
                            return True
                        continue
                    if not self.overlap(av[2], [(op2, av2)]):
                        break  # a part the repeat cannot take: the stretch ends here
            if op not in (self.c.ATOMIC_GROUP, self.c.POSSESSIVE_REPEAT) and any(
                self.repeats_in_a_row(child) for child in self.children(op, av)
            ):
                return True
        return False


def nested_repetition(pattern: str) -> bool:
    r"""Whether a repeated group of ``pattern`` holds a repeat that splits its rounds many ways.

    Such a group (``(a+)+``, ``(a{1,8}){1,12}``, ``(x+x+,)*``) can make Python's
    backtracking matcher take exponential time on a value that almost matches: a record
    could stall the scorer and validation. Bounds do not save it: ``(a{1,8}){1,12}`` runs
    for minutes on sixty a's and a full stop. A group whose rounds start or end with a
    character nothing else in it matches (``(\d{1,3}\.){3}``, ``([a-z]+,)*``) splits a
    value one way, unless two repeats in a row inside it can take the same characters; so
    does a group of few rounds whose repeats have few lengths (``(\d{2,3}){2}``).
    Possessive repeats (``a++``) and atomic groups (``(?>...)``) give nothing back, so a
    repeat inside them does not count; what is inside them is checked as a pattern of its own.
    """
    regex = _RegexTree(pattern)
    few = 0.0  # the groups let pass for their few splits share one budget
    for op, av in regex.items():
        if not (op in regex.varying_ops and av[1] > 1 and regex.varying(av[2])):
            continue
        if regex.repeats_in_a_row(av[2]):
            return True
        if regex.delimited(av[2]):
            continue
        few += min(av[1], 64) * math.log(regex.splits(av[2]))  # (\d{2,3}){2}: 4 ways
        if few > math.log(10_000):
            return True
    return False


def ambiguous_alternation(pattern: str) -> bool:
    """Whether a repeated group of ``pattern`` holds parts that start alike or match nothing.

    ``(a|aa)+``, ``([a-z]|[a-z]{2})*`` or ``(a?){28}`` can split one value between their
    parts in exponentially many ways, each tried on a value that almost matches, as a
    nested repeat can (:func:`nested_repetition`). Alternatives that may match nothing,
    or start with any character, count as starting alike (under ``(?i)``, in either case);
    possessive repeats and atomic groups give nothing back and do not count, though what
    they hold is checked as a pattern of its own.
    """
    regex = _RegexTree(pattern)
    c = regex.c
    repeats = (c.MAX_REPEAT, c.MIN_REPEAT, c.POSSESSIVE_REPEAT)

    def first(seq: Any) -> list[tuple[int, int]] | None:
        """The characters a match of ``seq`` can start with; None: any, or none."""
        out: list[tuple[int, int]] = []
        for op, av in seq:
            if op in regex.zero_width:
                continue
            if op in (c.LITERAL, c.NOT_LITERAL, c.IN):
                return _merged(out + regex.chars([(op, av)]))
            if op in repeats:
                sub = first(av[2])
                if sub is None:
                    return None
                out += sub
                if av[0] > 0:
                    return _merged(out)
                continue  # may repeat 0 times: what follows can start the match too
            if op in (c.SUBPATTERN, c.ATOMIC_GROUP, c.BRANCH, c.GROUPREF_EXISTS):
                subs = [first(b) for b in regex.children(op, av)]
                if op == c.GROUPREF_EXISTS and len(subs) == 1:
                    return None  # (?(1)x): no second branch, it may match nothing
                if any(x is None for x in subs):
                    return None
                return _merged(out + [r for sub in subs for r in sub])  # type: ignore[union-attr]
            return None  # any character, a back reference...
        return None  # it may match nothing

    def ambiguous(seq: Any) -> bool:
        for op, av in seq:
            if op in (c.BRANCH, c.GROUPREF_EXISTS):
                starts = [first(b) for b in regex.children(op, av)]
                for i, a in enumerate(starts):
                    for b in starts[i + 1 :]:
                        if a is None or b is None or _meet(a, b):
                            return True
            if op in (c.ATOMIC_GROUP, c.POSSESSIVE_REPEAT):
                continue  # gives nothing back
            if any(ambiguous(child) for child in regex.children(op, av)):
                return True
        return False

    def empty_ok(seq: Any) -> bool:
        """Whether ``seq`` can match nothing."""
        for op, av in seq:
            if op in regex.zero_width:
                continue
            if op in repeats and (av[0] == 0 or empty_ok(av[2])):
                continue
            if op in (c.SUBPATTERN, c.BRANCH, c.GROUPREF_EXISTS, c.ATOMIC_GROUP) and any(
                empty_ok(b) for b in regex.children(op, av)
            ):
                continue
            return False
        return True

    return any(
        op in (c.MAX_REPEAT, c.MIN_REPEAT) and av[1] > 1 and (ambiguous(av[2]) or empty_ok(av[2]))
        for op, av in regex.items()
    )
