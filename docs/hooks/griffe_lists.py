"""Griffe extension: the project's docstrings render as they read in the source.

The docstrings are prose in the house style: a line ending in a colon, then a list with no blank
line before it ("Contract\\n- ..."). Markdown needs a blank line before a list, so without one
the list runs into the paragraph. This extension inserts that blank line when the API reference
is built; the source is not changed. Registered in mkdocs.yml under the python handler's
`extensions`.
"""

from __future__ import annotations

import re

import griffe

ITEM = re.compile(r"^\s*(?:[-*] |\d+\. )")


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip())


def separate_lists(text: str) -> str:
    """`text` with a blank line before each list that follows a paragraph line directly (not
    before an item that follows another item or an item's continuation lines)."""
    out: list[str] = []
    fenced, item_indent = False, None  # the indent of the list item being continued, if any
    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            fenced = not fenced
        previous = out[-1] if out else ""
        if not fenced and ITEM.match(line):
            continues = item_indent is not None and _indent(previous) > item_indent
            if (
                previous.strip()
                and not ITEM.match(previous)
                and not continues
                and _indent(line) < 4
            ):  # deeper: a code block after a blank line
                out.append("")
            item_indent = _indent(line)
        elif line.strip() and item_indent is not None and _indent(line) <= item_indent:
            item_indent = None
        out.append(line)
    return "\n".join(out)


class ListsAfterParagraphs(griffe.Extension):
    def on_object(self, *, obj, **kwargs) -> None:  # noqa: ARG002
        if obj.docstring is not None:
            obj.docstring.value = separate_lists(obj.docstring.value)

    def on_package(self, *, pkg, **kwargs) -> None:  # noqa: ARG002
        self.on_object(obj=pkg)
