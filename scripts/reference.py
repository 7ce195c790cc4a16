"""Write the generated parts of ``docs/reference/`` from the code (``make docs``).

* ``docs/reference/cli.md``: every command of ``python -m trainyard``, from its argparse
  parser: the steps' parsers come from the step table (``trainyard.steps.STEPS``), each
  tool's is captured from its ``cli_main`` (``trainyard.cli.TOOLS``) at the moment it would
  parse, so no command runs.
* ``docs/reference/pipeline-yaml.md``: every field of ``dags/pipelines/pipeline.schema.json``
  (exported from the pydantic models of ``trainyard.config``; ``pipelines schema``).
* ``docs/reference/contracts.md``: every field of ``data_contracts/contract.schema.json``.

Each page is hand-written prose around blocks this script owns, between
``<!-- BEGIN GENERATED <name> -->`` and ``<!-- END GENERATED <name> -->``; only those blocks
are rewritten. ``--check`` rewrites nothing and exits 1 naming each stale page.

Importing trainyard here stays cheap: the tools' modules are imported (their parsers are
built inside them), never TensorFlow, which is checked.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib
import json
import os
import re
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs" / "reference"
CLI_PAGE = DOCS / "cli.md"
PIPELINE_PAGE = DOCS / "pipeline-yaml.md"
CONTRACTS_PAGE = DOCS / "contracts.md"
PIPELINE_SCHEMA = ROOT / "dags" / "pipelines" / "pipeline.schema.json"
CONTRACT_SCHEMA = ROOT / "data_contracts" / "contract.schema.json"
PROG = "python -m trainyard"
LOGIN = "<your login name>"
"""What the page shows for a default that is the caller's login name (``--actor``)."""
USAGE_WIDTH = 88

BLOCK_RE = re.compile(
    r"(<!-- BEGIN GENERATED (?P<name>[a-z-]+) -->\n)(?P<body>.*?)"
    r"(<!-- END GENERATED (?P=name) -->)",
    re.DOTALL,
)

if str(ROOT / "plugins") not in sys.path:
    sys.path.insert(0, str(ROOT / "plugins"))


# --------------------------------------------------------------------------- markdown


def _cell(text: str) -> str:
    """Text safe inside a Markdown table cell.

    One line, ``|`` escaped, ``<`` and ``>`` outside code spans written as entities (GitHub
    would take ``<name>`` for HTML).
    """
    parts = re.split(r"(`+[^`]*`+)", " ".join(str(text).split()))
    for i in range(0, len(parts), 2):
        parts[i] = parts[i].replace("<", "&lt;").replace(">", "&gt;")
    return "".join(parts).replace("|", "\\|")


def _code(text: str) -> str:
    """Inline code for ``text`` (a backtick inside gets a longer fence)."""
    fence = "``" if "`" in text else "`"
    pad = " " if "`" in text else ""
    return f"{fence}{pad}{text}{pad}{fence}"


# --------------------------------------------------------------------------- the CLI


class _Captured(BaseException):
    """Raised in place of parsing: carries the parser a command built (not an error)."""

    def __init__(self, parser: argparse.ArgumentParser) -> None:
        super().__init__("parser captured")
        self.parser = parser


@contextlib.contextmanager
def _capturing() -> Iterator[None]:
    """Make every argparse parse raise :class:`_Captured` instead of parsing.

    A ``BaseException`` so that no ``except Exception`` or ``except SystemExit`` of a
    command swallows it. The login name is pinned, since ``models``'s ``--actor`` default
    is the caller's.
    """
    original = argparse.ArgumentParser.parse_known_args
    saved = {k: os.environ.get(k) for k in ("USER", "LOGNAME")}

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        raise _Captured(self)

    argparse.ArgumentParser.parse_known_args = capture  # type: ignore[method-assign]
    os.environ["USER"] = os.environ["LOGNAME"] = LOGIN
    try:
        yield
    finally:
        argparse.ArgumentParser.parse_known_args = original  # type: ignore[method-assign]
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def tool_parser(function: Callable[[list[str]], int]) -> argparse.ArgumentParser:
    """The parser a tool's ``cli_main`` builds, captured before it parses anything.

    Args:
        function: The tool's entry point (``argv -> exit code``).

    Returns:
        Its top-level parser.

    Raises:
        RuntimeError: If the function returned without parsing a command line.
    """
    with _capturing():
        try:
            function([])
        except _Captured as captured:
            return captured.parser
    raise RuntimeError(f"{function.__module__}.{function.__name__} parsed no command line")


def _subcommands(parser: argparse.ArgumentParser) -> dict[str, tuple[str, Any]]:
    """A parser's subcommands: name → (help, parser)."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            helps = {a.dest: a.help or "" for a in action._choices_actions}
            return {name: (helps.get(name, ""), p) for name, p in action.choices.items()}
    return {}


def _invocation(action: argparse.Action) -> str:
    formatter = argparse.HelpFormatter(PROG)
    return formatter._format_action_invocation(action)


def _default(action: argparse.Action) -> str:
    default = action.default
    if default is None or default is argparse.SUPPRESS or action.nargs == 0:
        return ""
    if isinstance(default, list | tuple) and not default:
        return ""
    if isinstance(default, float) and default.is_integer():
        default = int(default)
    return _code(str(default) if not isinstance(default, dict) else json.dumps(default))


def _required(action: argparse.Action) -> bool:
    if action.option_strings:
        return bool(action.required)
    return action.nargs not in ("?", "*")


def _usage(parser: argparse.ArgumentParser, prog: str) -> str:
    parser.prog = prog
    parser.formatter_class = functools.partial(  # type: ignore[assignment]
        argparse.HelpFormatter, width=USAGE_WIDTH
    )
    return parser.format_usage().strip()


def _arguments_table(parser: argparse.ArgumentParser) -> list[str]:
    rows = []
    for action in parser._actions:
        if isinstance(action, argparse._HelpAction | argparse._SubParsersAction):
            continue
        required = "yes" if _required(action) else ""
        rows.append(
            f"| {_code(_invocation(action))} | {required} | {_default(action)} "
            f"| {_cell(action.help or '')} |"
        )
    if not rows:
        return []
    return ["| argument | required | default | meaning |", "|---|---|---|---|", *rows, ""]


def _command_section(
    name: str, summary: str, parser: argparse.ArgumentParser, level: int
) -> list[str]:
    prog = f"{PROG} {name}"
    out = [f"{'#' * level} `{name}`", "", _cell(summary), ""]
    description = (parser.description or "").strip()
    if description and description.rstrip(".") != summary.strip().rstrip("."):
        out += [" ".join(description.split()), ""]
    out += ["```", _usage(parser, prog), "```", "", *_arguments_table(parser)]
    for sub, (help_text, sub_parser) in _subcommands(parser).items():
        out += _command_section(f"{name} {sub}", help_text, sub_parser, level + 1)
    return out


def cli_reference() -> str:
    """Every command of ``python -m trainyard``, from its parser, as Markdown.

    Returns:
        The body of the page's ``commands`` block.

    Raises:
        RuntimeError: If building the parsers imported TensorFlow.
    """
    from trainyard import cli, steps

    had_tensorflow = "tensorflow" in sys.modules  # a test session may have imported it
    out = ["| command | what it does |", "|---|---|"]
    out += [f"| [`{c}`](#{_slug(c)}) | {_cell(h)} |" for c, h in cli.commands().items()]
    out += ["", "## Steps", ""]
    out += ["Each step prints its result as JSON (the task's XCom) on success.", ""]
    for name, step in steps.STEPS.items():
        section = _command_section(name, step.help, step.parser(), 3)
        keys = ", ".join(f"`{k}`" for k in step.result)
        out += [*section, f"Result keys: {keys}.", ""]
    out += ["## Tools", ""]
    for name, (module, function, help_text) in cli.TOOLS.items():
        parser = tool_parser(getattr(importlib.import_module(module), function))
        out += _command_section(name, help_text, parser, 3)
    if "tensorflow" in sys.modules and not had_tensorflow:
        raise RuntimeError("building the CLI's parsers imported TensorFlow")
    return "\n".join(out).rstrip("\n") + "\n"


def _slug(heading: str) -> str:
    """GitHub's anchor of a ``### `name` `` heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


# --------------------------------------------------------------------------- JSON schemas


def _resolve(schema: dict[str, Any], node: dict[str, Any]) -> dict[str, Any]:
    """A node with its ``$ref`` followed (siblings of the ``$ref`` win)."""
    ref = node.get("$ref")
    if not ref:
        return node
    target: Any = schema
    for part in ref.removeprefix("#/").split("/"):
        target = target[part]
    return {**_resolve(schema, target), **{k: v for k, v in node.items() if k != "$ref"}}


def _variants(schema: dict[str, Any], node: dict[str, Any]) -> list[dict[str, Any]]:
    """The alternatives of a node (``anyOf``/``oneOf``), each resolved; null left out."""
    options = node.get("anyOf") or node.get("oneOf")
    if not options:
        return [_resolve(schema, node)]
    return [_resolve(schema, o) for o in options if o.get("type") != "null"]


def _nullable(node: dict[str, Any]) -> bool:
    options = node.get("anyOf") or node.get("oneOf") or []
    return any(o.get("type") == "null" for o in options) or node.get("type") == "null"


def _bounds(node: dict[str, Any]) -> str:
    parts = []
    low = node.get("minimum", node.get("exclusiveMinimum"))
    high = node.get("maximum", node.get("exclusiveMaximum"))
    if low is not None:
        parts.append(("more than " if "exclusiveMinimum" in node else "≥ ") + f"{low:g}")
    if high is not None:
        parts.append(("less than " if "exclusiveMaximum" in node else "≤ ") + f"{high:g}")
    if "maxLength" in node:
        parts.append(f"length {node.get('minLength', 0)} to {node['maxLength']}")
    elif node.get("minLength"):
        parts.append(f"at least {node['minLength']} character{'s' * (node['minLength'] > 1)}")
    if "minItems" in node:
        parts.append(f"at least {node['minItems']} item{'s' if node['minItems'] != 1 else ''}")
    if node.get("uniqueItems"):
        parts.append("no duplicates")
    if "minProperties" in node:
        parts.append(f"at least {node['minProperties']} key")
    return ", ".join(parts)


def _type(schema: dict[str, Any], node: dict[str, Any]) -> str:
    """A field's type in a few words: ``integer (≥ 1)``, ``a | b`` (an enum), ``list of …``."""
    words = []
    for v in _variants(schema, node):
        if "const" in v:
            words.append(_code(json.dumps(v["const"]).strip('"')))
        elif "enum" in v:
            words.append(" | ".join(_code(json.dumps(e).strip('"')) for e in v["enum"]))
        elif v.get("type") == "array":
            item = _type(schema, v.get("items", {}))
            words.append(f"list of {item}" + (f" ({_bounds(v)})" if _bounds(v) else ""))
        elif v.get("type") == "object" or "properties" in v:
            extra = v.get("additionalProperties")
            if isinstance(extra, dict) and not v.get("properties"):
                words.append(f"map of name → {_type(schema, extra)}")
            elif len(_variants(schema, node)) > 1 and v.get("properties"):
                words.append(_code("{" + ", ".join(f"{k}: …" for k in v["properties"]) + "}"))
            else:
                words.append("object")
        else:
            kind = v.get("format") or v.get("type") or "any"
            if isinstance(kind, list):
                kind = " or ".join(kind)
            bounds = _bounds(v)
            words.append(kind + (f" ({bounds})" if bounds else ""))
            if "pattern" in v:
                words[-1] += f", matching {_code(v['pattern'])}"
    text = " or ".join(words)
    return text + (" or null" if _nullable(node) else "")


def _default_text(schema: dict[str, Any], node: dict[str, Any], required: bool) -> str:
    if required:
        return "**required**"
    node = _resolve(schema, node)
    if "default" not in node:
        return ""
    value = node["default"]
    if isinstance(value, dict) and value:
        return ""  # an object's defaults are its fields'
    if value == "":
        return '`""`'
    return _code(value if isinstance(value, str) else json.dumps(value))


def _fields(
    schema: dict[str, Any], node: dict[str, Any], prefix: str, required: bool
) -> Iterator[tuple[str, dict[str, Any], bool]]:
    """Every field under ``node``: (dotted path, its schema, required), depth first."""
    if prefix:
        yield prefix, node, required
    for v in _variants(schema, node):
        target = v
        if v.get("type") == "array" and isinstance(v.get("items"), dict):
            target = _resolve(schema, v["items"])
            sub = f"{prefix}[]" if prefix else "[]"
        else:
            sub = prefix
        extra = target.get("additionalProperties")
        if isinstance(extra, dict) and not target.get("properties"):
            yield from _fields(schema, extra, f"{sub}.<name>", False)
            continue
        needed = set(target.get("required", []))
        for key, child in target.get("properties", {}).items():
            path = f"{sub}.{key}" if sub else key
            yield from _fields(schema, child, path, key in needed)


def schema_reference(schema: dict[str, Any]) -> str:
    """Every field of a JSON schema as one Markdown table (path, type, default, meaning).

    Args:
        schema: A JSON schema whose fields carry ``description``s.

    Returns:
        The table, one row per field path (``a.b``; ``a[]`` for a list's items,
        ``a.<name>`` for a map's values).
    """
    rows = ["| field | type | default | meaning |", "|---|---|---|---|"]
    seen = set()
    for path, node, required in _fields(schema, schema, "", False):
        if path in seen:  # a field two variants share is listed once
            continue
        seen.add(path)
        description = node.get("description") or _resolve(schema, node).get("description", "")
        rows.append(
            f"| {_code(path)} | {_cell(_type(schema, node))} "
            f"| {_default_text(schema, node, required)} | {_cell(description)} |"
        )
    return "\n".join(rows) + "\n"


def undocumented(schema: dict[str, Any]) -> list[str]:
    """The field paths of a schema that have no ``description``.

    Args:
        schema: A JSON schema.

    Returns:
        Dotted paths, in schema order.
    """
    out = []
    for path, node, _ in _fields(schema, schema, "", False):
        if not (node.get("description") or _resolve(schema, node).get("description")):
            out.append(path)
    return out


# --------------------------------------------------------------------------- pages


def _blocks() -> dict[Path, dict[str, Callable[[], str]]]:
    def load(path: Path) -> dict[str, Any]:
        return json.loads(path.read_text(encoding="utf-8"))

    return {
        CLI_PAGE: {"commands": cli_reference},
        PIPELINE_PAGE: {"fields": lambda: schema_reference(load(PIPELINE_SCHEMA))},
        CONTRACTS_PAGE: {"fields": lambda: schema_reference(load(CONTRACT_SCHEMA))},
    }


def render(text: str, blocks: dict[str, Callable[[], str]], page: Path) -> str:
    """A page's text with each generated block replaced by what the code says now.

    Args:
        text: The page as it is.
        blocks: Block name → function returning the block's body.
        page: The page's path (for errors).

    Returns:
        The page as it should be.

    Raises:
        ValueError: If a block is missing from the page.
    """
    found = {m.group("name") for m in BLOCK_RE.finditer(text)}
    missing = sorted(set(blocks) - found)
    if missing:
        raise ValueError(f"{page}: no generated block {', '.join(missing)}")

    def body(match: re.Match[str]) -> str:
        name = match.group("name")
        if name not in blocks:
            return match.group(0)
        return match.group(1) + blocks[name]() + match.group(4)

    return BLOCK_RE.sub(body, text)


def pages() -> dict[Path, tuple[str, str]]:
    """Every generated page: path → (text now, text the code gives)."""
    out = {}
    for page, blocks in _blocks().items():
        text = page.read_text(encoding="utf-8")
        out[page] = (text, render(text, blocks, page))
    return out


def main(argv: list[str] | None = None) -> int:
    """Write the generated blocks, or with ``--check`` name the stale pages.

    Args:
        argv: Command-line arguments (``--check``).

    Returns:
        0, or 1 when ``--check`` found a page the code no longer matches.
    """
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="write nothing; exit 1 if stale")
    args = parser.parse_args(argv)
    stale = []
    for page, (now, wanted) in pages().items():
        if now == wanted:
            continue
        stale.append(page)
        if not args.check:
            page.write_text(wanted, encoding="utf-8")
    for page in stale:
        verb = "is stale (run `make docs`)" if args.check else "written"
        print(f"{page.relative_to(ROOT)} {verb}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
