"""MkDocs hook: the configuration reference, generated from the schema's source.

A page that holds the line `<!-- config-reference -->` gets it replaced by tables of every
configuration key: the dataclasses of `suite/config.py` (the schema Hydra composes against) and,
for the `topology` group, those of `cost_model/topology.py` it mirrors. Each row gives the key, its
type, its default and what it means: the comment above the field and the one after it on its line.
Defaults come from `suite/conf/config.yaml` where it sets the key, else from the dataclass; the groups'
own files (`suite/conf/scale/*.yaml`, `suite/conf/backend/*.yaml`, ...) are listed with their values.

The source is read with `ast` and `tokenize`, not imported, so the manual builds without torch.
Registered in mkdocs.yml under `hooks:`.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
MARKER = "<!-- config-reference -->"
CONFIG_PY = ROOT / "suite" / "config.py"
TOPOLOGY_PY = ROOT / "cost_model" / "topology.py"
CONF = ROOT / "suite" / "conf"
GROUPS = {
    "experiment": "ExperimentConf",
    "scale": "ScaleConf",
    "backend": "BackendConf",
    "verify": "VerifyConf",
}
# keys the schema leaves without a comment, described here until it has one
NOTES = {
    "seed": "The random seed: the inputs drawn at every point, and the order of the "
    "interleaved rounds (the same on every rank)."
}
# the topology group's classes, in the order the page shows them
TOPOLOGY_CLASSES = (
    "Topology",
    "Device",
    "IntraNode",
    "InterNode",
    "FabricTier",
    "LinkClass",
    "Nccl",
)


def on_page_markdown(markdown: str, page, config, files, **kwargs) -> str:  # noqa: ARG001
    if MARKER not in markdown:
        return markdown
    return markdown.replace(MARKER, render())


# -- reading the source ------------------------------------------------------------------------
class Field:
    def __init__(self, name: str, type_: str, default: str, doc: str, allowed: str = ""):
        self.name, self.type, self.default, self.doc = name, type_, default, doc
        self.allowed = allowed


def _constants(tree: ast.Module) -> dict[str, str]:
    """Module-level tuples of strings (`RATE_BY = ("message", "transfer")`), by name."""
    out = {}
    for node in tree.body:
        if (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, ast.Tuple)
        ):
            items = [e.value for e in node.value.elts if isinstance(e, ast.Constant)]
            out[node.targets[0].id] = " | ".join(str(i) for i in items)
    return out


def _allowed(value: ast.expr | None, constants: dict[str, str]) -> str:
    """What a field's `metadata` (cost_model.schema's checks) allows, in words."""
    if not (isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field"):
        return ""
    meta = next((k.value for k in value.keywords if k.arg == "metadata"), None)
    if isinstance(meta, ast.Call) and getattr(meta.func, "id", "") == "_positive":
        strict = not (
            meta.args and isinstance(meta.args[0], ast.Constant) and not meta.args[0].value
        )
        return "> 0" if strict else ">= 0"
    if not isinstance(meta, ast.Dict):
        return ""
    m = {ast.unparse(k).strip("'\""): v for k, v in zip(meta.keys, meta.values)}
    parts = []
    if "choices" in m:
        parts.append(
            constants.get(
                ast.unparse(m["choices"]),
                " | ".join(str(getattr(e, "value", "")) for e in getattr(m["choices"], "elts", [])),
            )
        )
    if "items" in m:
        parts.append("each of " + constants.get(ast.unparse(m["items"]), ast.unparse(m["items"])))
    low = ast.unparse(m["min"]) if "min" in m else None
    strict = "strict" in m and ast.unparse(m["strict"]) == "True"
    if low is not None:
        parts.append(f"{'>' if strict else '>='} {low}")
    if "max" in m:
        parts.append(f"<= {ast.unparse(m['max'])}")
    if "fraction" in m:
        parts.append("values in (0, 1]")
    if "positive_values" in m:
        parts.append("values > 0")
    return ", ".join(parts)


def _comments(source: str) -> dict[int, str]:
    """Line number -> the text of the comment on that line."""
    out = {}
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            out[tok.start[0]] = tok.string.lstrip("#").strip()
    return out


def _default(value: ast.expr | None) -> str:
    if value is None:
        return "required"
    if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "field":
        kw = {k.arg: k.value for k in value.keywords}
        if "default" in kw:
            return _default(kw["default"])
        if "default_factory" in kw:
            factory = kw["default_factory"]
            if isinstance(factory, ast.Lambda):
                return ast.unparse(factory.body)
            return {"dict": "{}", "list": "[]"}.get(getattr(factory, "id", ""), "")
        return "required"
    if isinstance(value, ast.Name) and value.id == "MISSING":
        return "required"
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return value.value
    text = ast.unparse(value)
    return {"None": "null", "True": "true", "False": "false"}.get(text, text)


def classes(path: Path) -> dict[str, tuple[str, list[Field]]]:
    """Class name -> (its docstring, its annotated fields with their comments)."""
    source = path.read_text()
    lines, comments = source.splitlines(), _comments(source)
    tree = ast.parse(source)
    constants = _constants(tree)
    out = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        fields = []
        for stmt in node.body:
            if not isinstance(stmt, ast.AnnAssign) or not isinstance(stmt.target, ast.Name):
                continue
            above, k = [], stmt.lineno - 1
            while k >= 1 and lines[k - 1].strip().startswith("#"):
                above.insert(0, comments.get(k, ""))
                k -= 1
            after = [
                comments[n]
                for n in range(stmt.lineno, stmt.end_lineno + 1)
                if n in comments and not lines[n - 1].strip().startswith("#")
            ]
            doc = " ".join(part for part in (" ".join(above), " ".join(after)) if part)
            fields.append(
                Field(
                    stmt.target.id,
                    ast.unparse(stmt.annotation),
                    _default(stmt.value),
                    doc,
                    _allowed(stmt.value, constants),
                )
            )
        out[node.name] = (ast.get_docstring(node) or "", fields)
    return out


def module_bullets(path: Path) -> dict[str, str]:
    """The module docstring's top-level bullets, by the backticked name each begins with."""
    doc = ast.get_docstring(ast.parse(path.read_text())) or ""
    bullets, current = {}, None
    for line in doc.splitlines():
        if line.startswith("- `"):
            current = line[3:].split("`", 1)[0]
            bullets[current] = line[2:].strip()
        elif current and line.startswith("  "):
            bullets[current] += " " + line.strip()
        else:
            current = None
    return bullets


# -- rendering ---------------------------------------------------------------------------------
def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _code(text: str) -> str:
    return f"`{text}`" if text else ""


def _yaml_value(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, dict)):
        return yaml.safe_dump(value, default_flow_style=True, width=1000).strip()
    return str(value)


def _flat(data: dict, prefix: str = "") -> dict[str, object]:
    out = {}
    for key, value in data.items():
        if key in ("defaults", "hydra"):
            continue
        if isinstance(value, dict) and key in ("verify",):
            out.update(_flat(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def _see_also(prefix: str, name: str, before: list[Field]) -> str:
    """For a field without a comment: the earlier field whose comment describes it too."""
    for f in reversed(before):
        if re.search(rf"\b{re.escape(name)}\b", f.doc):
            return f"See `{prefix}{f.name}`."
    return ""


def yaml_comments(path: Path) -> dict[str, str]:
    """`key: value  # comment` lines of a YAML file: key (dotted under one level) -> comment."""
    out, parent = {}, ""
    for line in path.read_text().splitlines():
        found = re.match(r"^(\s*)([A-Za-z_]\w*):(.*?)(?:\s+#\s*(.*))?$", line)
        if not found or line.lstrip().startswith("#"):
            continue
        indent, key, value, comment = found.groups()
        if not indent:
            parent = key if not value.strip() else ""
            full = key
        else:
            full = f"{parent}.{key}" if parent else key
        if comment:
            out[full] = comment
    return out


def _described_in(name: str, texts: dict[str, str]) -> str:
    for key, text in texts.items():
        if key != name and f"`{name}`" in text:
            return key
    return ""


def _table(
    prefix: str,
    fields: list[Field],
    defaults: dict | None = None,
    links: dict[str, str] | None = None,
    notes: dict[str, str] | None = None,
) -> list[str]:
    """Rows of key, type, default, meaning; `notes` {key: text} for fields without a comment."""
    rows = ["| key | type | default | meaning |", "|---|---|---|---|"]
    for k, f in enumerate(fields):
        key = f"{prefix}{f.name}"
        default = _yaml_value(defaults[key]) if defaults and key in defaults else f.default
        doc = f.doc or _see_also(prefix, f.name, fields[:k]) or (notes or {}).get(key, "")
        if f.allowed:
            doc = (doc + " " if doc else "") + f"Allowed: {f.allowed}."
        for cls, anchor in (links or {}).items():
            if cls in f.type.replace("[", " ").replace("]", " ").replace(",", " ").split():
                doc = (doc + " " if doc else "") + f"Fields: [{cls}](#{anchor})."
        rows.append(
            f"| `{key}` | {_cell(_code(f.type))} | {_cell(_code(default))} | {_cell(doc)} |"
        )
    return rows


def _group_files(group: str) -> dict[str, dict]:
    return {
        p.stem: (yaml.safe_load(p.read_text()) or {}) for p in sorted((CONF / group).glob("*.yaml"))
    }


SENTENCE_END = re.compile(r"(?<!Fig)(?<!e\.g)(?<!i\.e)\.\s+(?=[A-Z])")


def _first_comment(path: Path) -> str:
    """The first sentence of a group file's leading comment."""
    lines = []
    for line in path.read_text().splitlines():
        if not line.startswith("#"):
            break
        if "@package" not in line:
            lines.append(line[1:].strip())
    text = " ".join(lines)
    return SENTENCE_END.split(text)[0].rstrip(".") + "." if text else ""


def _options(group: str) -> list[str]:
    rows = [f"| `{group}=` | what it is |", "|---|---|"]
    for p in sorted((CONF / group).glob("*.yaml")):
        rows.append(f"| `{p.stem}` | {_cell(_first_comment(p))} |")
    return rows


def _by_option(group: str, fields: list[Field]) -> list[str]:
    files = _group_files(group)
    names = list(files)
    if group == "scale":
        names = [n for n in ("smoke", "default", "paper") if n in files]
    rows = [
        "| key | " + " | ".join(f"`{group}={n}`" for n in names) + " |",
        "|---|" + "---|" * len(names),
    ]
    for f in fields:
        cells = [
            _cell(_code(_yaml_value(files[n][f.name]))) if f.name in files[n] else "" for n in names
        ]
        rows.append(f"| `{group}.{f.name}` | " + " | ".join(cells) + " |")
    return rows


def render() -> str:
    """The markdown of every configuration key."""
    schema = classes(CONFIG_PY)
    return "\n".join([*_top_level(schema), *_groups(schema), *_topology()]) + "\n"


def _notes() -> dict[str, str]:
    """Comments for keys the schema leaves without one: NOTES, then the YAML files' own."""
    notes = {**NOTES, **yaml_comments(CONF / "config.yaml")}
    for group, option in (("scale", "default"), ("backend", "cpu"), ("backend", "cuda")):
        path = CONF / group / f"{option}.yaml"
        if path.exists():
            notes.update({f"{group}.{k}": v for k, v in yaml_comments(path).items()})
    return notes


def _top_level(schema: dict) -> list[str]:
    defaults = _flat(yaml.safe_load((CONF / "config.yaml").read_text()))
    top = [f for f in schema["Config"][1] if f.type not in (*GROUPS.values(), "TopologyConf")]
    out = [
        "## Top-level keys",
        "",
        "Given as `key=value` on the command line. The default is `suite/conf/config.yaml`'s where "
        "it sets the key, else the schema's.",
        "",
    ]
    out += _table("", top, defaults, notes=_notes())
    out += ["", "`predict_also` entries: " + schema["ExtraTopology"][0].replace("\n", " "), ""]
    return out + _table("predict_also[].", schema["ExtraTopology"][1])


def _groups(schema: dict) -> list[str]:
    defaults = _flat(yaml.safe_load((CONF / "config.yaml").read_text()))
    out = []
    for group, cls in GROUPS.items():
        fields = schema[cls][1]
        out += ["", f"## `{group}`", ""]
        if (CONF / group).is_dir():
            out += [
                f"Options: one file each in `suite/conf/{group}/`, picked with `{group}=NAME`.",
                "",
            ]
            out += _options(group) + [""]
        out += _table(f"{group}.", fields, defaults, notes=_notes())
        if group == "experiment":
            out += [
                "",
                "`experiment.runs` entries: " + schema["PaperRun"][0].replace("\n", " "),
                "",
            ]
            out += _table("experiment.runs[].", schema["PaperRun"][1])
        if group in ("scale", "backend"):
            out += ["", f"The values each `{group}` file sets:", ""]
            out += _by_option(group, fields)
    return out


TOPOLOGY_INTRO = (
    "The hardware the cost model predicts on. Options: one file each in `suite/conf/topology/`, picked "
    "with `topology=NAME`, whose fields `topology.KEY=VALUE` overrides (`topology.nodes=16`). "
    "`topology.path=FILE` loads a whole topology from a YAML file instead (a calibration's "
    "`topology.yaml`, or your own): its top level holds the fields below. Types are checked when "
    "the command line is composed; ranges and required fields when the run loads the topology. "
    "The schema is `cost_model.topology` (see its [API page](api/cost-model.md#cost_model.topology))."
)


def _topology() -> list[str]:
    topology, bullets = classes(TOPOLOGY_PY), module_bullets(TOPOLOGY_PY)
    anchors = {name: f"topology-{name.lower()}" for name in TOPOLOGY_CLASSES}
    out = ["", "## `topology`", "", TOPOLOGY_INTRO, ""] + _options("topology") + [""]
    out += [
        "| key | type | default | meaning |",
        "|---|---|---|---|",
        "| `topology.path` | `Optional[str]` | `null` | A topology file to load instead of "
        "the group's figures. |",
    ]
    fields = topology["Topology"][1]
    # the module's bullets that describe Topology's own fields (nccl's introduces the Nccl table)
    described = {k: v for k, v in bullets.items() if k in {f.name for f in fields} - {"nccl"}}
    notes = {}
    for f in fields:
        where = f.name if f.name in described else _described_in(f.name, described)
        if where:
            notes[f"topology.{f.name}"] = f"See `{where}` below the table."
    out += _table("topology.", fields, links=anchors, notes=notes)[2:]
    out += ["", "What the top-level topology fields mean, from `cost_model.topology`:", ""]
    out += [f"- {text}" for text in described.values()]
    for name in TOPOLOGY_CLASSES[1:]:
        doc, fields = topology[name]
        intro = bullets.get(name) or bullets.get(name.lower()) or doc
        out += ["", f"### {name} {{#{anchors[name]}}}", ""] + ([intro, ""] if intro else [])
        notes = {f.name: "See the description above." for f in fields if f"`{f.name}`" in intro}
        out += _table("", fields, links=anchors, notes=notes)
    return out
