"""Text read from a results folder, made safe for the format it is written into.

A decoder, task or pair name, a knob name, an error reason: whatever a folder holds is data,
and every output that shows it escapes it for the program that reads that output, one
function per format:

- ``csv_cell``: a spreadsheet evaluates a cell that starts with ``=``, ``+``, ``-``, ``@``, a
  tab or a line break (formula injection); such a cell gets a leading ``'`` (a name ``+1``
  stays the text ``+1``), except, with ``numbers=True``, a plain number (a formatted table
  cell such as ``-0.5``). The CSV writer quotes the rest.
- ``md_cell`` / ``md_text``: a Markdown table cell / a line of Markdown (heading, list item).
  Line breaks become spaces (no forged rows or lines), ``|`` is escaped in cells (no forged
  columns), a ``<`` that would open HTML (a tag, comment or autolink) becomes ``&lt;``.
- ``html``: HTML text and attribute values (``html.escape``).
- ``latex``: LaTeX text: the ten special characters as pandas' ``Styler`` escapes them
  (``escape="latex"``, so a table's cells and captions agree), line breaks as spaces.
- ``plot_text``: a matplotlib label drawn as plain text: ``$`` escaped (no mathtext), line
  breaks as spaces, at most ``PLOT_CHARS`` characters.
- ``file_part``: one component of a file name: ordinary names (letters, digits, ``._-``, not
  starting with a dot, at most ``FILE_CHARS``) unchanged, any other gets the offending
  characters replaced and a short hash of the original appended, so two names never share a
  file; ``unique_file_parts`` settles what collisions remain.

Every function takes any value (``str()`` of it), drops NUL and other control characters
(spaces instead), and replaces lone surrogates (which JSON can carry and UTF-8 cannot write)
with U+FFFD. Ordinary names (letters, digits, ``_``, ``-``, ``.``, spaces, ``=``, commas,
parentheses) come out unchanged from ``csv_cell``, ``md_cell``, ``md_text``, ``plot_text``
and ``file_part``, and with only ``_`` escaped from ``latex``. This module knows nothing
about tables or figures.
"""

from __future__ import annotations

import hashlib
import html as _html
import re
from collections.abc import Iterable

#: Longest label drawn in a figure (longer ones end with an ellipsis).
PLOT_CHARS = 200
#: Longest file-name component made from a name (the hash suffix included).
FILE_CHARS = 100

_SURROGATE = re.compile(r"[\ud800-\udfff]")
_LINE_BREAK = re.compile(r"\r\n|[\r\n\v\f\x1c-\x1e\x85\u2028\u2029]")
_CONTROL = re.compile(r"[\x00-\x08\x0b-\x1f\x7f]")
_FORMULA_START = ("=", "+", "-", "@", "\t", "\r", "\n")
_NUMBER = re.compile(r"[+-]?(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?|[+-]?(?:inf|nan)", re.I)
_HTML_OPEN = re.compile(r"<(?=[A-Za-z/!?])")
_FILE_OK = re.compile(r"[A-Za-z0-9_-][A-Za-z0-9._-]*")
_FILE_BAD = re.compile(r"[^A-Za-z0-9._-]+")


def _text(value) -> str:
    """``str(value)`` with lone surrogates replaced (U+FFFD)."""
    return _SURROGATE.sub("\ufffd", str(value))


def one_line(value) -> str:
    """``value`` as one line of text: line breaks and control characters become spaces."""
    return _CONTROL.sub(" ", _LINE_BREAK.sub(" ", _text(value).replace("\t", " ")))


def csv_cell(value, numbers: bool = False):
    """A CSV cell a spreadsheet shows as text, never evaluates; anything but a string (a
    number, None) passes through as the CSV writer would write it. ``numbers``: the cell is a
    formatted number where one is found (``-0.5`` is left to read as a number)."""
    if not isinstance(value, str):
        return value
    text = _text(value).replace("\x00", "")
    if text.startswith(_FORMULA_START) and not (numbers and _NUMBER.fullmatch(text)):
        return "'" + text
    return text


def md_text(value) -> str:
    """A line of Markdown (heading, list item, prose) that stays one line and opens no HTML."""
    return _HTML_OPEN.sub("&lt;", one_line(value))


def md_cell(value) -> str:
    """A Markdown table cell: one line, ``|`` escaped, no HTML opened."""
    return md_text(value).replace("\\", "\\\\").replace("|", "\\|")


def html(value) -> str:
    """HTML text or attribute value."""
    return _html.escape(one_line(value), quote=True)


def latex(value) -> str:
    """LaTeX text, escaped as pandas' ``Styler.format(escape="latex")`` does, on one line."""
    return (
        one_line(value).replace("\\", "ab2§=§8yz")  # pandas' placeholder, kept for equal output
        .replace("ab2§=§8yz ", "ab2§=§8yz\\space ")
        .replace("&", "\\&")
        .replace("%", "\\%")
        .replace("$", "\\$")
        .replace("#", "\\#")
        .replace("_", "\\_")
        .replace("{", "\\{")
        .replace("}", "\\}")
        .replace("~ ", "~\\space ")
        .replace("~", "\\textasciitilde ")
        .replace("^ ", "^\\space ")
        .replace("^", "\\textasciicircum ")
        .replace("ab2§=§8yz", "\\textbackslash ")
    )


def plot_text(value, max_chars: int = PLOT_CHARS) -> str:
    """A matplotlib label drawn as plain text: ``$`` escaped (no mathtext), one line, bounded."""
    text = one_line(value)
    if len(text) > max_chars:
        text = text[: max_chars - 1] + "…"
    return text.replace("$", r"\$")


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:8]


def file_part(value, max_chars: int = FILE_CHARS) -> str:
    """One component of a file name made from a name: never ``/``, ``..``, NUL or a leading
    dot; an ordinary name unchanged, any other one made safe and suffixed with its hash."""
    text = str(value)
    if _FILE_OK.fullmatch(text) and len(text) <= max_chars:
        return text
    safe = _FILE_BAD.sub("_", text).lstrip(".") or "_"
    return f"{safe[: max_chars - 9]}-{_digest(text)}"


def unique_file_parts(values: Iterable) -> dict:
    """``{value: file_part(value)}`` with every part distinct (a counter appended where two
    would still meet, e.g. a name that reads like another's hashed form)."""
    out: dict = {}
    used: set[str] = set()
    for value in dict.fromkeys(values):
        part, n = file_part(value), 1
        while part.lower() in used:  # case-insensitive file systems too
            n += 1
            part = f"{file_part(value)}-{n}"
        used.add(part.lower())
        out[value] = part
    return out
