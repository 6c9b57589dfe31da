"""The subset of Go's text/template that ``docker --format`` and ``crictl -o go-template``
users write: field paths, ``index``, ``json``, ``join``, ``lower``/``upper``, pipes.

Runs inside a node (standard library only, a sibling module of the fake CLIs). Data is
JSON-shaped (dicts, lists, scalars); a dict value that is callable is a method taking the
action's arguments (docker ps's ``{{.Label "com.example"}}``). Errors read like Go's.

>>> render('{{.State.Pid}} {{.Name}}', {"State": {"Pid": 42}, "Name": "/vllm"})
'42 /vllm'
>>> render('{{index .labels "app"}}', {"labels": {"app": "p"}})
'p'
>>> render('{{json .A}}|{{.B | upper}}|{{join .C ","}}', {"A": {"x": 1}, "B": "b", "C": ["1", "2"]})
'{"x":1}|B|1,2'
>>> render('{{.Nope}}', {})
Traceback (most recent call last):
...
gotmpl.TemplateError: template: :1:2: executing "" at <.Nope>: map has no entry for key "Nope"
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Callable
from typing import Any

_ACTION = re.compile(r"\{\{-?\s*(.*?)\s*-?\}\}", re.S)


class TemplateError(Exception):
    """A template that cannot be parsed or run; the message is what Go would say."""


def render(template: str, data: Any) -> str:
    """``template`` applied to ``data``."""
    out: list[str] = []
    pos = 0
    for match in _ACTION.finditer(template):
        out.append(template[pos : match.start()])
        column = match.start() + 2
        out.append(_text(_pipeline(match.group(1), data, column)))
        pos = match.end()
    out.append(template[pos:])
    return "".join(out)


def _text(value: Any) -> str:
    """How Go prints a value: maps as map[k:v], lists as [a b], nil as <no value>."""
    if value is None:
        return "<no value>"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, dict):
        return "map[" + " ".join(f"{k}:{_text(v)}" for k, v in sorted(value.items())) + "]"
    if isinstance(value, list):
        return "[" + " ".join(_text(v) for v in value) + "]"
    return str(value)


def _pipeline(source: str, data: Any, column: int) -> Any:
    value: Any = _NOTHING
    for command in source.split("|"):
        try:
            words = shlex.split(command, posix=True)
        except ValueError as exc:
            raise TemplateError(f"template: :1: unterminated quoted string: {exc}") from exc
        if not words:
            raise TemplateError(f"template: :1:{column}: missing value for command")
        value = _command(words, data, column, value)
    return value


_NOTHING = object()


def _command(words: list[str], data: Any, column: int, piped: Any) -> Any:
    head, args = words[0], [_arg(w, data, column) for w in words[1:]]
    if piped is not _NOTHING:
        args.append(piped)
    if head.startswith("."):
        value = _field(data, head, column)
        if callable(value):
            return value(*args)
        if args:
            raise TemplateError(
                f"template: :1:{column}: can't give argument to non-function {head}")
        return value
    fn = FUNCS.get(head)
    if fn is None:
        raise TemplateError(f'template: :1: function "{head}" not defined')
    return fn(*args)


def _arg(word: str, data: Any, column: int) -> Any:
    if word.startswith("."):
        return _field(data, word, column)
    if word.lstrip("-").isdigit():
        return int(word)
    return word  # shlex already removed the quotes of a string literal


def _field(data: Any, path: str, column: int) -> Any:
    value = data
    if path == ".":
        return value
    for name in path.strip(".").split("."):
        if isinstance(value, dict) and name in value:
            value = value[name]
        elif isinstance(value, dict):
            raise TemplateError(f'template: :1:{column}: executing "" at <{path}>: '
                                f'map has no entry for key "{name}"')
        else:
            raise TemplateError(
                f'template: :1:{column}: executing "" at <{path}>: can\'t evaluate field {name}'
            )
    return value


def _index(value: Any, *keys: Any) -> Any:
    for key in keys:
        if isinstance(value, dict):
            value = value.get(key)
        elif isinstance(value, list) and isinstance(key, int) and 0 <= key < len(value):
            value = value[key]
        else:
            raise TemplateError(
                f"template: :1: error calling index: cannot index with {key!r}")
    return value


FUNCS: dict[str, Callable[..., Any]] = {
    "json": lambda v: json.dumps(v, separators=(",", ":")),
    "index": _index,
    "join": lambda items, sep: sep.join(str(i) for i in items),
    "lower": lambda s: str(s).lower(),
    "upper": lambda s: str(s).upper(),
    "println": lambda *a: " ".join(_text(x) for x in a) + "\n",
}


def unescape(fmt: str) -> str:
    r"""docker's own step before Go sees a --format: ``\t`` and ``\n`` become tab and
    newline, and a ``table`` prefix is the caller's to handle."""
    return fmt.replace("\\t", "\t").replace("\\n", "\n")
