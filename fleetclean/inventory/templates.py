"""The Jinja templates an inventory's connection variables hold, as far as they are sure.

``ansible_host: "{{ inventory_hostname }}.ib.cluster"`` in group_vars/ (every node's
InfiniBand name), ``ansible_user: "{{ lookup('env', 'USER') }}"`` (whoever runs it),
``ansible_host: "{{ ip | default(inventory_hostname) }}"``: Ansible renders them with the
host's variables and the controller's environment. fleetclean renders the part of Jinja's
expressions that such values are written in, with no ``eval`` and nothing run:

- text and whole-number literals; ``inventory_hostname``, ``inventory_hostname_short``
  and the host's own variables whose values are texts or numbers (themselves rendered, a
  few levels deep), also as ``vars['x']`` or ``hostvars[inventory_hostname].x``;
- ``lookup('env', NAME)`` (or ``ansible.builtin.env``), with ``default=`` as ansible-core
  2.13 takes it: an unset variable reads empty, as Ansible's does;
- the filters ``default`` (``d``; a second argument ``true`` also replaces an empty
  text), ``lower``, ``upper``, ``trim``, ``string``, ``int`` (of a text that is a
  number), ``replace(OLD, NEW)``; ``~`` to join, parentheses.

Anything else (another filter or lookup, arithmetic, a test, a condition, a
``{% ... %}`` block), a variable the host does not have or has as null outside a
``default``, another host's ``hostvars``, gives ``Unrendered`` with the reason: its value
would be a guess, and a guessed host name or user reaches another machine or account than
Ansible does.

>>> render("{{ inventory_hostname }}.ib", "gpu01.lab", {})
'gpu01.lab.ib'
>>> render("{{inventory_hostname_short}}-{{ site }}", "gpu01.lab", {"site": "{{ dc }}a",
...        "dc": 7})
'gpu01-7a'
>>> render("{{ ip | default(inventory_hostname) }}", "gpu01", {})
'gpu01'
>>> render("{{ lookup('env', 'OPS_USER') | default('ops', true) | lower }}", "gpu01", {},
...        environ={"OPS_USER": ""})
'ops'
>>> try:
...     render("{{ user | regex_replace('a', 'b') }}", "gpu01", {"user": "Ops"})
... except Unrendered as err:
...     print(err)
"{{ user | regex_replace('a', 'b') }}" uses the filter regex_replace, which fleetclean ...
>>> render("{{ admin_user }}", "gpu01", {})
Traceback (most recent call last):
...
fleetclean.inventory.templates.Unrendered: admin_user is not set for this host
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping

MAX_DEPTH = 8  # a variable whose value names itself, directly or not, stops here

_PART = re.compile(r"\{\{(.*?)\}\}", re.DOTALL)
_TOKEN = re.compile(r"""\s*(?:
    (?P<str>'(?:[^'\\]|\\.)*'|"(?:[^"\\]|\\.)*")
  | (?P<int>\d+(?![\w.]))
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<op>[|~()\[\].,=])
  | (?P<other>\S+?)
)""", re.VERBOSE)
_ENV_LOOKUPS = frozenset({"env", "ansible.builtin.env"})
_CONSTANTS: dict[str, object] = {"true": True, "True": True, "false": False,
                                 "False": False}


class Unrendered(ValueError):
    """A template this module does not render; the message says why."""


class _Undefined:
    """A variable the host does not have (``null``: ``null`` true), which only a
    ``default`` filter may stand in for."""

    __slots__ = ("name", "null")

    def __init__(self, name: str, null: bool = False) -> None:
        self.name = name
        self.null = null

    def fail(self) -> Unrendered:
        return Unrendered(f"{self.name} is not set for this host")


class _Vars:
    """``vars``, or ``hostvars[inventory_hostname]``: the host's variables by key."""


_HOSTVARS = object()  # ``hostvars`` before its subscript
_VARS = _Vars()


def is_template(text: str) -> bool:
    """Whether Ansible would render ``text`` (it holds Jinja's delimiters)."""
    return "{{" in text or "{%" in text or "{#" in text


def render(text: str, host: str, variables: Mapping[str, object], *, depth: int = 0,
           used: set[str] | None = None, environ: Mapping[str, str] | None = None) -> str:
    """``text`` with each ``{{ expression }}`` rendered for ``host`` (see the module);
    raises ``Unrendered``. ``used``: gets the name of every variable the text read (a
    password's template makes them secrets too). ``environ``: what ``lookup('env')``
    reads (this process's environment, the controller's, as Ansible's)."""
    if depth > MAX_DEPTH:
        raise Unrendered(f"{text!r} refers to itself (through {MAX_DEPTH} variables)")
    if "{%" in text or "{#" in text:
        raise Unrendered(f"{text!r} holds a Jinja block or comment")
    context = _Context(host, variables, depth, used, os.environ if environ is None else environ)
    out: list[str] = []
    end = 0
    for part in _PART.finditer(text):
        value = _Parser(part.group(0), part.group(1), context).expression()
        out += [text[end:part.start()], _text(value)]
        end = part.end()
    rest = text[end:]
    if "{{" in rest or "}}" in rest:
        raise Unrendered(f"{text!r} has an unclosed {{{{ }}}}")
    return "".join(out) + rest


def _text(value: object) -> str:
    if isinstance(value, _Undefined):
        raise value.fail()
    if isinstance(value, bool) or not isinstance(value, (str, int)):
        raise Unrendered("its value is not a text or a number")
    return str(value)


class _Context:
    """What one template's expressions read: the host, its variables, the environment."""

    # A plain class, not a dataclass: this module is imported by every run, and a
    # dataclass's generated methods cost about 1 ms of start-up each class.
    __slots__ = ("depth", "environ", "host", "used", "variables")

    def __init__(self, host: str, variables: Mapping[str, object], depth: int,
                 used: set[str] | None, environ: Mapping[str, str]) -> None:
        self.host = host
        self.variables = variables
        self.depth = depth
        self.used = used
        self.environ = environ

    def variable(self, name: str) -> object:
        if name == "inventory_hostname":
            return self.host
        if name == "inventory_hostname_short":
            return self.host.split(".", 1)[0]
        if self.used is not None:
            self.used.add(name)
        if name not in self.variables:
            return _Undefined(name)
        value = self.variables[name]
        if value is None:  # `admin_user:` with no value: Jinja's none, not undefined
            return _Undefined(name, null=True)
        if isinstance(value, float) and not isinstance(value, bool):
            return str(value)
        if isinstance(value, str) and is_template(value):
            return render(value, self.host, self.variables, depth=self.depth + 1,
                          used=self.used, environ=self.environ)
        return value


class _Parser:
    """One ``{{ ... }}``'s expression, read by recursive descent over its tokens and
    worked out as it is read (the grammar in the module's text)."""

    def __init__(self, whole: str, source: str, context: _Context) -> None:
        self.whole = whole
        self.context = context
        self.tokens: list[tuple[str, str]] = []
        for match in _TOKEN.finditer(source):
            kind = match.lastgroup
            if kind is None:
                continue  # trailing blanks
            if kind == "other":
                raise self.beyond(f"{match.group(kind)!r}")
            self.tokens.append((kind, match.group(kind)))
        self.at = 0

    def beyond(self, what: str) -> Unrendered:
        return Unrendered(f"{self.whole!r} uses {what}, which fleetclean does not render")

    def peek(self) -> tuple[str, str]:
        return self.tokens[self.at] if self.at < len(self.tokens) else ("end", "")

    def take(self, text: str) -> bool:
        if self.peek() == ("op", text):
            self.at += 1
            return True
        return False

    def expect(self, text: str) -> None:
        if not self.take(text):
            kind, got = self.peek()
            raise self.beyond(f"{got!r} where {text!r} was expected" if kind != "end"
                              else f"an expression cut short before {text!r}")

    def expression(self) -> object:
        if not self.tokens:
            raise Unrendered(f"{self.whole!r} is empty")
        value = self.joined()
        kind, got = self.peek()
        if kind != "end":
            raise self.beyond(f"{got!r}")
        return value

    def joined(self) -> object:
        value = self.filtered()
        while self.take("~"):
            right = self.filtered()
            value = _text(value) + _text(right)
        return value

    def filtered(self) -> object:
        value = self.primary()
        while self.take("|"):
            kind, name = self.peek()
            if kind != "name":
                raise self.beyond(f"{name!r} after '|'")
            self.at += 1
            args, kwargs = self.arguments() if self.peek() == ("op", "(") else ([], {})
            apply = _FILTERS.get(name)
            if apply is None:
                raise self.beyond(f"the filter {name}")
            if name in ("default", "d") and kwargs.keys() <= {"default_value", "boolean"}:
                # Jinja's signature: default(value, default_value='', boolean=False).
                if len(args) > 2:
                    raise self.beyond("default() with more than two arguments")
                both = [*args, *["", False][len(args):]]
                args = [kwargs.get("default_value", both[0]), kwargs.get("boolean", both[1])]
            elif kwargs:
                raise self.beyond(f"the filter {name} with named arguments")
            value = apply(self, value, args)
        return value

    def arguments(self) -> tuple[list[object], dict[str, object]]:
        self.expect("(")
        args: list[object] = []
        kwargs: dict[str, object] = {}
        while not self.take(")"):
            if args or kwargs:
                self.expect(",")
            kind, name = self.peek()
            if kind == "name" and self.tokens[self.at + 1:self.at + 2] == [("op", "=")]:
                self.at += 2
                kwargs[name] = self.joined()
            else:
                args.append(self.joined())
        return args, kwargs

    def primary(self) -> object:
        kind, text = self.peek()
        self.at += 1
        if kind == "str":
            value: object = _unquote(text)
        elif kind == "int":
            value = int(text)
        elif kind == "op" and text == "(":
            value = self.joined()
            self.expect(")")
        elif kind == "name" and text in _CONSTANTS:
            value = _CONSTANTS[text]
        elif kind == "name" and text == "lookup":
            value = self.lookup()
        elif kind == "name" and text == "hostvars":
            value = _HOSTVARS
        elif kind == "name" and text == "vars":
            value = _VARS
        elif kind == "name" and self.peek() != ("op", "("):
            value = self.context.variable(text)
        else:
            raise self.beyond(f"{text!r}" if kind != "name" else f"the function {text}")
        while self.peek() in (("op", "["), ("op", ".")):
            value = self.member(value)
        return value

    def member(self, value: object) -> object:
        if self.take("."):
            kind, key = self.peek()
            if kind != "name":
                raise self.beyond(f"{key!r} after '.'")
            self.at += 1
        else:
            self.expect("[")
            index = self.joined()
            self.expect("]")
            key = _text(index)
        if value is _HOSTVARS:
            if key != self.context.host:
                raise Unrendered(f"{self.whole!r} reads hostvars of another host ({key})")
            return _VARS
        if value is _VARS:
            return self.context.variable(key)
        raise self.beyond("an attribute or item of a variable")

    def lookup(self) -> object:
        args, kwargs = self.arguments()
        if not args or _text(args[0]) not in _ENV_LOOKUPS:
            plugin = repr(args[0]) if args else "nothing"
            raise self.beyond(f"the lookup of {plugin}")
        if len(args) != 2 or set(kwargs) - {"default"}:
            raise self.beyond("a lookup('env') of other than one name and a default")
        # Ansible's env lookup takes a term's first word (term.split()[0]).
        words = _text(args[1]).split()
        if not words:
            raise Unrendered(f"{self.whole!r} looks up no environment variable")
        name = words[0]
        if name in self.context.environ:
            return self.context.environ[name]
        return kwargs.get("default", "")


def _unquote(literal: str) -> str:
    # As Jinja's lexer reads a string literal: Python's escapes (\n, \x41, \u00e9).
    return literal[1:-1].encode("ascii", "backslashreplace").decode("unicode-escape")


def _default(parser: _Parser, value: object, args: list[object]) -> object:
    # Jinja: `boolean` true (any true value) also replaces what is false: an empty text, 0.
    empty_too = len(args) == 2 and bool(args[1]) and not isinstance(args[1], _Undefined)
    missing = isinstance(value, _Undefined) and not value.null
    if missing or (empty_too and (value in ("", 0) or isinstance(value, _Undefined))):
        return args[0]
    return value


def _text_filter(change: Callable[[str], str]) -> Callable[[_Parser, object, list[object]],
                                                           object]:
    def apply(parser: _Parser, value: object, args: list[object]) -> object:
        if args:
            raise parser.beyond("arguments to a filter that takes none")
        return change(_text(value))
    return apply


def _int(parser: _Parser, value: object, args: list[object]) -> object:
    # Jinja's int gives 0 for what is no number: a guessed port.
    text = _text(value).strip()
    if args or not re.fullmatch(r"[+-]?\d+", text):
        # Not the text itself: it may be read from a secret.
        raise Unrendered(f"{parser.whole!r} gives no whole number")
    return int(text)


def _replace(parser: _Parser, value: object, args: list[object]) -> object:
    if len(args) != 2:
        raise parser.beyond("replace() with other than two arguments")
    return _text(value).replace(_text(args[0]), _text(args[1]))


_FILTERS: dict[str, Callable[[_Parser, object, list[object]], object]] = {
    "default": _default,
    "d": _default,
    "lower": _text_filter(str.lower),
    "upper": _text_filter(str.upper),
    "trim": _text_filter(str.strip),
    "string": _text_filter(lambda text: text),
    "int": _int,
    "replace": _replace,
}
