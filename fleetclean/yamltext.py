"""What is wrong with a YAML file a person wrote (an inventory, a playbook, a ``-e @file``),
for a one-line error that names its line and column and says what to do: the file's bytes
that are not UTF-8, the characters YAML refuses (a control character), and the parser's
own complaints.

>>> import yaml
>>> try:
...     yaml.safe_load("a:\\n\\tb: 1\\n")
... except yaml.YAMLError as err:
...     problem(err, "a:\\n\\tb: 1\\n")
("found character '\\\\t' that cannot start any token", 2, 1, 'indent with spaces, not tabs')
>>> try:
...     yaml.safe_load("a: \\x01\\n")
... except yaml.YAMLError as err:
...     problem(err, "a: \\x01\\n")  # doctest: +ELLIPSIS
('unacceptable character #x0001: special characters are not allowed', 1, 4, ...)
>>> undecodable(b"a: 1\\nb: \\xff\\n", UnicodeDecodeError("utf-8", b"", 8, 9, "invalid"))
('not UTF-8 text (byte 0xff)', 2, 4, 'save the file as UTF-8')
"""

from __future__ import annotations

import yaml

__all__ = ["problem", "undecodable"]


def problem(err: yaml.YAMLError, text: str) -> tuple[str, int | None, int | None, str]:
    """(what is wrong, line, column, the fix) for ``err``, raised reading ``text``."""
    if isinstance(err, yaml.MarkedYAMLError):
        mark = err.problem_mark or err.context_mark
        said = err.problem or str(err)
        if err.context and not err.context.startswith("while"):
            said = f"{err.context}, {said}"
        return (said, mark.line + 1 if mark else None, mark.column + 1 if mark else None,
                _hint(err))
    if isinstance(err, yaml.reader.ReaderError):
        # A character YAML refuses anywhere (a control character, a NUL): where it is.
        at = min(max(err.position, 0), len(text))
        line = text.count("\n", 0, at) + 1
        column = at - (text.rfind("\n", 0, at) + 1) + 1
        return (f"unacceptable character #x{err.character:04x}: {err.reason}", line, column,
                "remove the character, or write it escaped inside double quotes")
    return str(err), None, None, "check that the file is YAML"


def undecodable(data: bytes, err: UnicodeDecodeError) -> tuple[str, int, int, str]:
    """(what is wrong, line, column, the fix) for a file whose bytes are not UTF-8."""
    line = data.count(b"\n", 0, err.start) + 1
    column = err.start - (data.rfind(b"\n", 0, err.start) + 1) + 1
    return f"not UTF-8 text (byte 0x{data[err.start]:02x})", line, column, "save the file as UTF-8"


def _hint(err: yaml.MarkedYAMLError) -> str:
    said = err.problem or ""
    if "\\t" in said or "\t" in said:
        return "indent with spaces, not tabs"
    if "document" in said:
        return "keep one document: remove the second '---'"
    opened = err.context_mark
    if err.context and "flow" in err.context and opened is not None:
        return f"close the '{{' or '[' opened at line {opened.line + 1}"
    return "check the indentation and the ':' after each name"
