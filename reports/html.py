"""report.html: a self-contained page from report.md (figures embedded, no network needed).

`markdown_to_html(text, base_dir)` renders the subset of Markdown the suite's reports use
(headings, paragraphs, bullet lists, fenced code, pipe tables, images, inline code and bold);
images are read from `base_dir` and embedded as base64 data URIs (PNG, or SVG inline as data).
`write_html(md_path)` writes report.html beside report.md and returns its path.
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

STYLE = """body{font-family:system-ui,sans-serif;max-width:1100px;margin:2em auto;padding:0 1em;
line-height:1.45;color:#222}table{border-collapse:collapse;margin:1em 0;font-size:.85em}
th,td{border:1px solid #ccc;padding:.25em .5em;text-align:left}th{background:#f3f3f3}
pre{background:#f6f8fa;padding:.8em;overflow-x:auto;font-size:.8em}code{background:#f6f8fa}
img{max-width:100%}"""

BLOCKS = ("#", "|", "```", "- ")
_IMAGE = re.compile(r"!\[([^\]]*)\]\(([^)]+)\)")
_MIME = {".png": "image/png", ".svg": "image/svg+xml", ".jpg": "image/jpeg"}


def _text(t: str) -> str:
    t = html.escape(t)
    t = re.sub(r"`([^`]+)`", r"<code>\1</code>", t)
    return re.sub(r"\*\*([^*]+)\*\*", r"<strong>\1</strong>", t)


def _image(alt: str, src: str, base: Path) -> str:
    path = base / src
    mime = _MIME.get(path.suffix.lower(), "application/octet-stream")
    data = base64.b64encode(path.read_bytes()).decode() if path.exists() else ""
    return f'<img alt="{html.escape(alt)}" src="data:{mime};base64,{data}">'


def _inline(text: str, base: Path) -> str:
    out, at = [], 0
    for m in _IMAGE.finditer(text):
        out += [_text(text[at : m.start()]), _image(m.group(1), m.group(2), base)]
        at = m.end()
    return "".join(out + [_text(text[at:])])


def _table(lines: list[str], base: Path) -> str:
    rows = [[c.strip() for c in ln.strip().strip("|").split("|")] for ln in lines]
    head, body = rows[0], [r for r in rows[2:]]
    out = [
        "<table><thead><tr>"
        + "".join(f"<th>{_inline(c, base)}</th>" for c in head)
        + "</tr></thead><tbody>"
    ]
    out += ["<tr>" + "".join(f"<td>{_inline(c, base)}</td>" for c in r) + "</tr>" for r in body]
    return "\n".join(out) + "</tbody></table>"


def markdown_to_html(text: str, base_dir: Path, title: str = "coconet-suite report") -> str:
    lines, out, k = text.splitlines(), [], 0
    while k < len(lines):
        ln = lines[k]
        if ln.startswith("```"):
            j = k + 1
            while j < len(lines) and not lines[j].startswith("```"):
                j += 1
            out.append("<pre><code>" + html.escape("\n".join(lines[k + 1 : j])) + "</code></pre>")
            k = j + 1
        elif ln.startswith("#"):
            level = len(ln) - len(ln.lstrip("#"))
            out.append(f"<h{level}>{_inline(ln[level:].strip(), base_dir)}</h{level}>")
            k += 1
        elif ln.startswith("|"):
            j = k
            while j < len(lines) and lines[j].startswith("|"):
                j += 1
            out.append(_table(lines[k:j], base_dir))
            k = j
        elif ln.startswith("- "):
            j = k
            while j < len(lines) and lines[j].startswith("- "):
                j += 1
            out.append(
                "<ul>"
                + "".join(f"<li>{_inline(x[2:], base_dir)}</li>" for x in lines[k:j])
                + "</ul>"
            )
            k = j
        elif ln.strip():
            j = k
            while j < len(lines) and lines[j].strip() and not lines[j].startswith(BLOCKS):
                j += 1
            out.append("<p>" + _inline(" ".join(lines[k:j]), base_dir) + "</p>")
            k = j
        else:
            k += 1
    return (
        f"<!DOCTYPE html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{STYLE}</style></head><body>\n" + "\n".join(out) + "\n</body></html>\n"
    )


def write_html(md_path) -> Path:
    md_path = Path(md_path)
    out = md_path.with_suffix(".html")
    out.write_text(markdown_to_html(md_path.read_text(), md_path.parent))
    return out
