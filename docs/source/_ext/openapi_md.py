"""``openapi`` directive: a REST API reference rendered from an OpenAPI 3.0 spec at build time.

    ```{openapi} ../_static/rest-api.yml
    ```

renders, from the YAML, the API's introduction, its authentication, one section per tag with
one subsection per operation (method and path, summary, description, required scopes from the
``x-scopes`` extension, a parameters table, the request body's fields, the responses), and one
subsection per schema of ``components.schemas``, linked from the operations that use it. The
spec stays the single source: the reference cannot drift from what the tests check.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import yaml
from docutils import nodes
from docutils.parsers.rst import directives
from sphinx.util.docutils import SphinxDirective

HTTP_METHODS = ("get", "put", "post", "delete", "patch", "head", "options")
_CODE = re.compile(r"`([^`]+)`")
#: How deep request-body fields are unfolded (``gpus[].mig.instances[].start``).
MAX_DEPTH = 4


def _inline(text: str) -> list[nodes.Node]:
    """Plain text with ``code`` spans."""
    out: list[nodes.Node] = []
    for i, part in enumerate(_CODE.split(text)):
        if i % 2:
            out.append(nodes.literal(part, part))
        elif part:
            out.append(nodes.Text(part))
    return out


def _paragraphs(text: str | None) -> list[nodes.Node]:
    """Blank-line separated paragraphs (lines within one are joined)."""
    out = []
    for block in re.split(r"\n\s*\n", (text or "").strip()):
        if block.strip():
            out.append(nodes.paragraph("", "", *_inline(" ".join(block.split()))))
    return out


def _table(
    headers: list[str], rows: list[list[list[nodes.Node]]], widths: list[int]
) -> nodes.table:
    table = nodes.table(classes=["openapi-table"])
    group = nodes.tgroup(cols=len(headers))
    table += group
    for width in widths:
        group += nodes.colspec(colwidth=width)
    head = nodes.thead()
    group += head
    row = nodes.row()
    for title in headers:
        row += nodes.entry("", nodes.paragraph("", title))
    head += row
    body = nodes.tbody()
    group += body
    for cells in rows:
        row = nodes.row()
        for cell in cells:
            row += nodes.entry("", nodes.paragraph("", "", *cell))
        body += row
    return table


class Spec:
    """The loaded spec, with ``$ref`` resolution and the ids of the schema sections."""

    def __init__(self, data: dict[str, Any], prefix: str) -> None:
        self.data = data
        self.prefix = prefix

    def deref(self, node: Any) -> Any:
        """Follow local ``$ref``s."""
        while isinstance(node, dict) and "$ref" in node:
            target: Any = self.data
            for part in node["$ref"].removeprefix("#/").split("/"):
                target = target[part]
            node = target
        return node

    def schema_id(self, name: str) -> str:
        return nodes.make_id(f"{self.prefix}-schema-{name}")

    def type_of(self, schema: dict[str, Any]) -> list[nodes.Node]:
        """A schema's type for a table cell: links for named schemas, enums, bounds, null."""
        ref = schema.get("$ref", "")
        if ref.startswith("#/components/schemas/"):
            name = ref.rsplit("/", 1)[1]
            target = self.deref(schema)
            out: list[nodes.Node] = [
                nodes.reference("", name, internal=True, refid=self.schema_id(name))
            ]
            if "enum" in target:
                out.append(nodes.Text(": "))
                out += self._enum(target["enum"])
            return out
        schema = self.deref(schema)
        if "oneOf" in schema:
            out = []
            for i, option in enumerate(schema["oneOf"]):
                if i:
                    out.append(nodes.Text(" or "))
                out += self.type_of(option)
            return out
        kind = schema.get("type", "any")
        if kind == "array":
            out = [nodes.Text("array of "), *self.type_of(schema.get("items", {}))]
        elif kind == "object" and "additionalProperties" in schema and not schema.get("properties"):
            extra = schema["additionalProperties"]
            if isinstance(extra, dict):
                out = [nodes.Text("object of "), *self.type_of(extra)]
            else:
                out = [nodes.Text("object" if extra else "empty object")]
        else:
            out = [nodes.Text(kind)]
        if "format" in schema:
            out.append(nodes.Text(f" ({schema['format']})"))
        if "enum" in schema:
            out.append(nodes.Text(": "))
            out += self._enum(schema["enum"])
        bounds = [
            f"{label} {schema[key]}"
            for key, label in (
                ("minimum", "≥"),
                ("maximum", "≤"),
                ("minLength", "length ≥"),
                ("maxLength", "length ≤"),
                ("maxItems", "at most"),
            )
            if key in schema
        ]
        if bounds:
            out.append(nodes.Text(f", {', '.join(bounds)}"))
        if schema.get("nullable"):
            out.append(nodes.Text(", or null"))
        return out

    @staticmethod
    def _enum(values: list[Any]) -> list[nodes.Node]:
        out: list[nodes.Node] = []
        for i, value in enumerate(values):
            if i:
                out.append(nodes.Text(", "))
            out.append(nodes.literal(str(value), str(value)))
        return out

    def field_rows(
        self, schema: dict[str, Any], prefix: str = "", depth: int = 0
    ) -> list[list[list[nodes.Node]]]:
        """One row per property; inline nested objects unfold as ``a.b`` and ``a[].b`` (named
        schemas are linked instead: they have their own section)."""
        schema = self.deref(schema)
        rows = []
        required = set(schema.get("required", ()))
        for name, prop in (schema.get("properties") or {}).items():
            target = self.deref(prop)
            description = target.get("description", "")
            if "default" in target:
                description += f" Default: `{json.dumps(target['default'])}`."
            rows.append(
                [
                    [nodes.literal(prefix + name, prefix + name)],
                    self.type_of(prop),
                    [nodes.Text("yes" if name in required else "no")],
                    _inline(description.strip()),
                ]
            )
            if depth >= MAX_DEPTH or "$ref" in prop:
                continue
            inner, suffix = target, "."
            if target.get("type") == "array":
                items = target.get("items", {})
                if "$ref" in items:
                    continue
                inner, suffix = items, "[]."
            if inner.get("properties"):
                rows += self.field_rows(inner, f"{prefix}{name}{suffix}", depth + 1)
        return rows


class OpenAPIDirective(SphinxDirective):
    """Render the OpenAPI spec named by the argument (relative to this document)."""

    required_arguments = 1
    option_spec = {"id-prefix": directives.unchanged}

    def run(self) -> list[nodes.Node]:
        rel, path = self.env.relfn2path(self.arguments[0], self.env.docname)
        self.env.note_dependency(rel)
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
        spec = Spec(data, self.options.get("id-prefix", "api"))
        out: list[nodes.Node] = []
        info = data.get("info", {})
        out += _paragraphs(info.get("description"))
        servers = [s["url"] for s in data.get("servers", [])]
        if servers:
            out.append(
                nodes.paragraph(
                    "", "", nodes.Text("Base URL: "), nodes.literal(servers[0], servers[0])
                )
            )
        out.append(self._auth(spec))
        for tag in data.get("tags", []):
            section = self._section(spec, f"tag-{tag['name']}", tag["name"].capitalize())
            section += _paragraphs(tag.get("description"))
            for path_, item in data["paths"].items():
                for method in HTTP_METHODS:
                    op = item.get(method)
                    if op is not None and tag["name"] in op.get("tags", ()):
                        section += self._operation(spec, path_, method, item, op)
            out.append(section)
        out.append(self._schemas(spec))
        return out

    def _section(self, spec: Spec, key: str, title: str) -> nodes.section:
        section = nodes.section(ids=[nodes.make_id(f"{spec.prefix}-{key}")])
        section += nodes.title(title, title)
        return section

    def _auth(self, spec: Spec) -> nodes.section:
        section = self._section(spec, "authentication", "Authentication")
        for name, scheme in spec.data.get("components", {}).get("securitySchemes", {}).items():
            where = f"{scheme.get('in', '')} {scheme.get('name', '')}".strip()
            para = nodes.paragraph("", "", nodes.strong(name, name), nodes.Text(f" ({where}): "))
            para += _inline(scheme.get("description", ""))
            section += para
        return section

    def _operation(
        self, spec: Spec, path: str, method: str, item: dict[str, Any], op: dict[str, Any]
    ) -> nodes.section:
        title = f"{method.upper()} {path}"
        section = self._section(spec, op.get("operationId", title), title)
        if op.get("summary"):
            section += nodes.paragraph("", "", nodes.strong(op["summary"], op["summary"]))
        section += _paragraphs(op.get("description"))
        scopes = op.get("x-scopes", [])
        if scopes:
            para = nodes.paragraph("", "", nodes.Text("Scopes (any of): "))
            para += Spec._enum(scopes)
            section += para
        params = [spec.deref(p) for p in item.get("parameters", []) + op.get("parameters", [])]
        if params:
            rows = [
                [
                    [nodes.literal(p["name"], p["name"])],
                    [nodes.Text(p["in"])],
                    spec.type_of(p.get("schema", {})),
                    [nodes.Text("yes" if p.get("required") else "no")],
                    _inline(" ".join(p.get("description", "").split())),
                ]
                for p in params
            ]
            section += nodes.rubric("", "Parameters")
            section += _table(
                ["Name", "In", "Type", "Required", "Description"], rows, [14, 6, 22, 8, 50]
            )
        body = op.get("requestBody")
        if body is not None:
            for media, content in body.get("content", {}).items():
                schema = content.get("schema", {})
                required = "required" if body.get("required") else "optional"
                section += nodes.rubric("", "Request body")
                para = nodes.paragraph("", "", nodes.literal(media, media))
                para += nodes.Text(f" ({required}): ")
                para += spec.type_of(schema)
                section += para
                rows = spec.field_rows(schema)
                if rows:
                    section += _table(
                        ["Field", "Type", "Required", "Description"], rows, [22, 26, 8, 44]
                    )
        rows = []
        for status, response in op.get("responses", {}).items():
            response = spec.deref(response)
            cell: list[nodes.Node] = []
            for media, content in (response.get("content") or {}).items():
                if cell:
                    cell.append(nodes.Text("; "))
                cell += [nodes.literal(media, media), nodes.Text(" ")]
                cell += spec.type_of(content.get("schema", {}))
            rows.append(
                [
                    [nodes.Text(status)],
                    _inline(" ".join(response.get("description", "").split())),
                    cell,
                ]
            )
        section += nodes.rubric("", "Responses")
        section += _table(["Status", "Description", "Body"], rows, [8, 52, 40])
        return section

    def _schemas(self, spec: Spec) -> nodes.section:
        section = self._section(spec, "schemas", "Schemas")
        section += nodes.paragraph(
            "", "Bodies of requests and responses; fields marked required are always present."
        )
        for name, schema in spec.data.get("components", {}).get("schemas", {}).items():
            sub = nodes.section(ids=[spec.schema_id(name)])
            sub += nodes.title(name, name)
            sub += _paragraphs(schema.get("description"))
            rows = spec.field_rows(schema)
            if rows:
                sub += _table(["Field", "Type", "Required", "Description"], rows, [22, 26, 8, 44])
            else:
                para = nodes.paragraph("", "", nodes.Text("Type: "))
                para += spec.type_of(schema)
                sub += para
            section += sub
        return section


def setup(app) -> dict:
    app.add_directive("openapi", OpenAPIDirective)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
