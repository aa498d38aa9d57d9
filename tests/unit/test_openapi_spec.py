"""The OpenAPI spec (docs/source/_static/rest-api.yml) must equal what the handlers serve.

No hub, no service: the route table is the one ``PoolService.make_app`` mounts
(``service.routes.routes``), the methods come from the handler classes (inherited ones count:
tornado dispatches them), and the accepted body fields, query arguments and 4xx statuses from
the handlers' source, parsed with ``ast``. A handler that grows a method, a body field or a
query argument without the spec following fails here, and so does a spec that promises more.
"""

from __future__ import annotations

import ast
import inspect
import re
import textwrap
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import pytest
import yaml
from tornado import web

from jupyterhub_gpupool.service.apihandlers import allocations, users
from jupyterhub_gpupool.service.apihandlers.base import APIHandler
from jupyterhub_gpupool.service.apihandlers.errors import STATUS, APIError
from jupyterhub_gpupool.service.routes import NotFoundHandler, routes
from jupyterhub_gpupool.store import StoreError

ROOT = Path(__file__).resolve().parents[2]
SPEC_PATH = ROOT / "docs" / "source" / "_static" / "rest-api.yml"
HTTP_METHODS = ("GET", "HEAD", "POST", "DELETE", "PATCH", "PUT", "OPTIONS")
#: A path segment of a route: plain text, or one capturing group.
_GROUP = re.compile(r"^\((?P<body>[^()]*)\)$")
_ALTERNATIVES = re.compile(r"^[A-Za-z0-9_-]+(\|[A-Za-z0-9_-]+)*$")


@cache
def load_spec() -> dict[str, Any]:
    """The spec as a dict (loaded once)."""
    return yaml.safe_load(SPEC_PATH.read_text())


def resolve(spec: dict[str, Any], node: Any) -> Any:
    """Follow a local ``$ref`` (repeatedly)."""
    while isinstance(node, dict) and "$ref" in node:
        ref = node["$ref"]
        assert ref.startswith("#/"), ref
        node = spec
        for part in ref[2:].split("/"):
            node = node[part]
    return node


def spec_operations() -> set[tuple[str, str]]:
    """(path, METHOD) of every operation in the spec."""
    return {
        (path, method.upper())
        for path, item in load_spec()["paths"].items()
        for method in item
        if method.upper() in HTTP_METHODS
    }


def handler_routes() -> list[tuple[str, type[web.RequestHandler]]]:
    """(pattern, handler class) of every API v1 resource the service mounts
    (``service.routes.routes``, as ``PoolService.make_app`` serves it), under ``api/v1/``."""
    prefix = "/api/v1/"
    return [
        (route[0][len(prefix) :], route[1])
        for route in routes("/")
        if route[0].startswith(prefix) and route[1] is not NotFoundHandler
    ]


def implemented_methods(handler: type[web.RequestHandler]) -> set[str]:
    """HTTP methods the class (or a base) implements, as tornado would dispatch them."""
    found = set()
    for method in handler.SUPPORTED_METHODS:
        impl = getattr(handler, method.lower(), None)
        if impl is not None and impl is not getattr(web.RequestHandler, method.lower()):
            found.add(method)
    return found


def _segments(pattern: str) -> list[tuple[str, str | None]]:
    """Split a route into (text, None) for plain segments and (regex, "group") for groups."""
    out: list[tuple[str, str | None]] = []
    for segment in re.split(r"/(?![^(]*\))", pattern):  # "/" outside groups: [^/] has one
        m = _GROUP.match(segment)
        if m:
            out.append((m.group("body"), "group"))
        else:
            assert re.fullmatch(r"[A-Za-z0-9_.-]+", segment), (
                f"route {pattern!r}: segment {segment!r} is neither plain text nor one group; "
                "teach this test to read it"
            )
            out.append((segment, None))
    return out


def spec_path_for(pattern: str) -> str | None:
    """The spec path with the same plain segments and a ``{param}`` wherever the route has a
    group; parameter names come from the spec at the same position."""
    segments = _segments(pattern)
    for path in load_spec()["paths"]:
        parts = path.strip("/").split("/")
        if len(parts) != len(segments):
            continue
        if all(
            (kind == "group") == (part.startswith("{") and part.endswith("}"))
            and (kind == "group" or text == part)
            for (text, kind), part in zip(segments, parts, strict=True)
        ):
            return path
    return None


def route_id(pattern: str) -> str:
    """A readable test id: the spec path if there is one, else the route with ``{?}``."""
    path = spec_path_for(pattern)
    if path is not None:
        return path
    return "/" + "/".join("{?}" if k == "group" else t for t, k in _segments(pattern))


ROUTES = [
    pytest.param(pattern, handler, id=route_id(pattern)) for pattern, handler in handler_routes()
]


# -- handler source, read with ast ------------------------------------------------------------


@cache
def _function_node(func: Callable) -> ast.FunctionDef | ast.AsyncFunctionDef:
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    node = tree.body[0]
    assert isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))
    return node


def _handler_functions(handler: type, method: str) -> Iterator[ast.FunctionDef]:
    """The method's function, and the handler's own helpers it calls as ``self._x(...)``."""
    func = getattr(handler, method.lower())
    node = _function_node(func)
    yield node
    for call in ast.walk(node):
        if (
            isinstance(call, ast.Call)
            and isinstance(call.func, ast.Attribute)
            and isinstance(call.func.value, ast.Name)
            and call.func.value.id == "self"
        ):
            helper = getattr(handler, call.func.attr, None)
            defined_in = getattr(helper, "__qualname__", "").split(".")[0]
            if (
                inspect.isfunction(helper)
                and defined_in not in ("APIHandler", "RequestHandler")
                and defined_in in {c.__name__ for c in handler.__mro__}
            ):
                yield _function_node(helper)


def _self_calls(handler: type, method: str, name: str) -> list[ast.Call]:
    return [
        node
        for fn in _handler_functions(handler, method)
        for node in ast.walk(fn)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and isinstance(node.func.value, ast.Name)
        and node.func.value.id == "self"
        and node.func.attr == name
    ]


def _type_names(node: ast.expr) -> frozenset[str]:
    if isinstance(node, ast.Tuple):
        return frozenset().union(*(_type_names(e) for e in node.elts))
    if isinstance(node, ast.Name):
        return frozenset({node.id})
    if ast.unparse(node) == "type(None)":
        return frozenset({"None"})
    raise AssertionError(f"cannot read the type {ast.unparse(node)!r} of a json_body field")


def json_body_fields(handler: type, method: str) -> dict[str, tuple[frozenset[str], bool]] | None:
    """``{field: (python type names, required)}`` of the handler's ``self.json_body({...})``,
    or None when the method reads no JSON body."""
    calls = _self_calls(handler, method, "json_body")
    if not calls:
        return None
    assert len(calls) == 1, f"{handler.__name__}.{method.lower()} parses its body twice"
    arg = calls[0].args[0]
    assert isinstance(arg, ast.Dict), "json_body's fields must be a dict literal"
    fields = {}
    for key, value in zip(arg.keys, arg.values, strict=True):
        assert key is not None and isinstance(value, ast.Tuple) and len(value.elts) == 2
        types, required = value.elts
        fields[ast.literal_eval(key)] = (_type_names(types), ast.literal_eval(required))
    return fields


def query_arguments(handler: type, method: str) -> set[str]:
    """Names of the query arguments the method reads."""
    names: set[str] = set()
    for reader in ("get_argument", "get_arguments", "int_arg", "time_arg", "get_query_argument"):
        for call in _self_calls(handler, method, reader):
            names.add(ast.literal_eval(call.args[0]))
    if _self_calls(handler, method, "page_args"):
        names |= {"offset", "limit"}
    return names


def error_statuses(handler: type, method: str) -> set[int]:
    """4xx statuses the handler itself can answer (the store adds its own on top)."""
    statuses = {401}  # APIHandler.prepare: no valid token
    needs = getattr(getattr(handler, method.lower()), "needs", None)  # declared by @needs
    if (needs is not None and needs[0] != "identified") or _self_calls(handler, method, "require"):
        statuses.add(403)
    if _self_calls(handler, method, "json_body"):
        statuses |= {400, 413, 422}
    for reader in ("int_arg", "time_arg", "page_args"):
        if _self_calls(handler, method, reader):
            statuses.add(400)
    module = inspect.getmodule(handler)
    for fn in _handler_functions(handler, method):
        for node in ast.walk(fn):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name):
                statuses |= _api_error_statuses(node, vars(module))
    return statuses


def _api_error_statuses(call: ast.Call, scope: dict[str, Any]) -> set[int]:
    """``APIError(code, ...)`` or ``StoreError(code, ...)`` (the status its code maps to), or
    a helper function of the module that builds one."""
    target = scope.get(call.func.id)  # type: ignore[attr-defined]
    if target in (APIError, StoreError):
        code = call.args[0] if call.args else None
        return {STATUS[code.value]} if isinstance(code, ast.Constant) else set()
    if inspect.isfunction(target):
        return {
            status
            for node in ast.walk(_function_node(target))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
            for status in _api_error_statuses(node, vars(inspect.getmodule(target)))
        }
    return set()


#: Python types a json_body field accepts → (JSON Schema type, nullable). Only exact matches.
_JSON_TYPES = {
    frozenset({"str"}): "string",
    frozenset({"int"}): "integer",
    frozenset({"int", "float"}): "number",
    frozenset({"bool"}): "boolean",
    frozenset({"list"}): "array",
    frozenset({"dict"}): "object",
}


def json_type(python_types: frozenset[str]) -> tuple[str, bool]:
    """The JSON Schema type equal to what ``APIHandler.json_body`` accepts."""
    nullable = "None" in python_types
    key = python_types - {"None"}
    assert key in _JSON_TYPES, f"no JSON Schema type accepts exactly {sorted(python_types)}"
    return _JSON_TYPES[key], nullable


def operation(path: str, method: str) -> dict[str, Any]:
    """The spec's operation object."""
    return load_spec()["paths"][path][method.lower()]


def _body_operations() -> list[Any]:
    params = []
    for pattern, handler in handler_routes():
        path = spec_path_for(pattern)
        for method in sorted(implemented_methods(handler)):
            if path is not None and (path, method) in spec_operations():
                params.append(pytest.param(handler, path, method, id=f"{method} {path}"))
    return params


BODY_OPERATIONS = _body_operations()


# -- the spec itself --------------------------------------------------------------------------


def test_spec_is_valid_openapi_3_0():
    from openapi_spec_validator import validate

    spec = load_spec()
    assert spec["openapi"].startswith("3.0.")
    validate(spec)


def test_spec_server_and_security():
    spec = load_spec()
    assert spec["servers"] == [{"url": "/services/gpupool/api/v1"}]
    assert spec["security"] == [{"tokenAuth": []}]
    scheme = spec["components"]["securitySchemes"]["tokenAuth"]
    assert scheme == {**scheme, "type": "apiKey", "in": "header", "name": "Authorization"}
    assert "/metrics" in spec["info"]["description"]
    assert not any("metrics" in path for path in spec["paths"])


@pytest.mark.parametrize(
    ("path", "method"),
    [
        pytest.param(path, method, id=f"{method} {path}")
        for path, method in sorted(spec_operations())
    ],
)
def test_operation_is_documented(path: str, method: str):
    spec = load_spec()
    op = operation(path, method)
    assert op.get("summary") and op.get("operationId")
    scopes = op.get("x-scopes")
    assert scopes and all(s.startswith("custom:gpupool:") for s in scopes)
    assert all(scope in op.get("description", "") + spec["info"]["description"] for scope in scopes)
    responses = op["responses"]
    assert any(code.startswith("2") for code in responses), "no success response"
    for code, response in responses.items():
        response = resolve(spec, response)
        if code.startswith(("4", "5")):
            schema = response["content"]["application/json"]["schema"]
            assert schema == {"$ref": "#/components/schemas/Error"}, f"{code} is not an Error"
        else:
            assert code.startswith("2"), f"unexpected status {code}"
            assert response["content"], f"{code} has no body schema"
    body = op.get("requestBody")
    if body is not None:
        schema = resolve(spec, body["content"]["application/json"]["schema"])
        assert schema["type"] == "object" and schema["additionalProperties"] is False


def test_error_schema_is_the_api_error_shape():
    error = load_spec()["components"]["schemas"]["Error"]
    assert error["required"] == ["error"] and error["additionalProperties"] is False
    inner = error["properties"]["error"]
    assert sorted(inner["required"]) == ["code", "message"]
    assert set(inner["properties"]) == {"code", "message", "field", "allowed"}


# -- routes and methods -----------------------------------------------------------------------


@pytest.mark.parametrize(("pattern", "handler"), ROUTES)
def test_route_methods_match_spec(pattern: str, handler: type[web.RequestHandler]):
    path = spec_path_for(pattern)
    assert path is not None, f"route {pattern!r} ({handler.__name__}) is not in the spec"
    served = implemented_methods(handler)
    documented = {m for p, m in spec_operations() if p == path}
    assert served == documented, f"{handler.__name__} serves {sorted(served)} at {path}"


@pytest.mark.parametrize(("pattern", "handler"), ROUTES)
def test_route_parameters_match_spec(pattern: str, handler: type[web.RequestHandler]):
    path = spec_path_for(pattern)
    assert path is not None
    spec = load_spec()
    item = spec["paths"][path]
    names = [p[1:-1] for p in path.strip("/").split("/") if p.startswith("{")]
    groups = [text for text, kind in _segments(pattern) if kind == "group"]
    assert len(names) == len(groups)
    for method in implemented_methods(handler) & {m for p, m in spec_operations() if p == path}:
        params = [resolve(spec, p) for p in item.get("parameters", [])]
        params += [resolve(spec, p) for p in operation(path, method).get("parameters", [])]
        in_path = {p["name"]: p for p in params if p["in"] == "path"}
        assert set(in_path) == set(names), f"{method} {path}: path parameters {set(in_path)}"
        for name, regex in zip(names, groups, strict=True):
            param = in_path[name]
            assert param["required"] is True
            schema = resolve(spec, param["schema"])
            assert schema["type"] == "string"
            if regex == "[^/]+":
                continue  # any segment: the spec may narrow it with an enum (404 otherwise)
            assert _ALTERNATIVES.match(regex), f"cannot compare group ({regex}) with the spec"
            assert set(schema.get("enum", ())) == set(regex.split("|")), (
                f"{path}: {{{name}}} must enumerate exactly {regex.split('|')}"
            )


def test_every_spec_operation_is_served():
    served = {
        (spec_path_for(pattern), method)
        for pattern, handler in handler_routes()
        for method in implemented_methods(handler)
    }
    missing = spec_operations() - served
    assert not missing, f"the spec documents operations no handler serves: {sorted(missing)}"


def test_route_mapping_derives_names_from_the_spec():
    # the mapping itself: groups become the spec's names at the same position, never a guess
    assert spec_path_for(r"nodes/([^/]+)/(cordon|uncordon|drain)") == "/nodes/{name}/{action}"
    assert spec_path_for(r"nodes/([^/]+)/inventory") == "/nodes/{name}/inventory"
    assert spec_path_for(r"quotas/([^/]+)/([^/]+)") == "/quotas/{kind}/{name}"
    assert spec_path_for(r"allocations/([^/]+)") == "/allocations/{id}"
    assert spec_path_for(r"allocations/([^/]+)/frobnicate") is None
    assert spec_path_for(r"nodes/inventory/([^/]+)") is None


def test_inherited_methods_count_as_served():
    class Base(APIHandler):
        def get(self) -> None: ...

    class Child(Base):
        def post(self) -> None: ...

    class Limited(Child):
        SUPPORTED_METHODS = ("POST",)

    assert implemented_methods(Child) == {"GET", "POST"}
    assert implemented_methods(Limited) == {"POST"}


# -- bodies, query arguments, statuses ---------------------------------------------------------


@pytest.mark.parametrize(("handler", "path", "method"), BODY_OPERATIONS)
def test_request_body_matches_json_body(handler: type, path: str, method: str):
    spec = load_spec()
    fields = json_body_fields(handler, method)
    body = operation(path, method).get("requestBody")
    if fields is None:
        assert body is None, f"{method} {path} documents a body the handler never reads"
        return
    assert body is not None, f"{method} {path} reads {sorted(fields)} but documents no body"
    assert list(body["content"]) == ["application/json"]
    schema = resolve(spec, body["content"]["application/json"]["schema"])
    assert schema["type"] == "object" and schema["additionalProperties"] is False
    properties = schema.get("properties", {})
    assert set(properties) == set(fields), f"{method} {path} body fields"
    required = sorted(name for name, (_, req) in fields.items() if req)
    assert sorted(schema.get("required", [])) == required, f"{method} {path} required fields"
    assert body.get("required", False) == bool(required), (
        "the body is required exactly when a field is (an empty body reads as {})"
    )
    for name, (types, _) in fields.items():
        prop = resolve(spec, properties[name])
        expected, nullable = json_type(types)
        assert prop.get("type") == expected, f"{name}: {prop.get('type')} != {expected}"
        assert bool(prop.get("nullable", False)) == nullable, f"{name}: nullable"


@pytest.mark.parametrize(("handler", "path", "method"), BODY_OPERATIONS)
def test_query_parameters_match_handler(handler: type, path: str, method: str):
    spec = load_spec()
    params = [resolve(spec, p) for p in spec["paths"][path].get("parameters", [])]
    params += [resolve(spec, p) for p in operation(path, method).get("parameters", [])]
    documented = {p["name"] for p in params if p["in"] == "query"}
    assert documented == query_arguments(handler, method), f"{method} {path} query parameters"


@pytest.mark.parametrize(("handler", "path", "method"), BODY_OPERATIONS)
def test_error_statuses_are_listed(handler: type, path: str, method: str):
    responses = operation(path, method)["responses"]
    listed = {int(code) for code in responses if code.startswith(("4", "5"))}
    missing = error_statuses(handler, method) - listed
    assert not missing, f"{method} {path} can answer {sorted(missing)} but does not list it"


def test_ast_readers_find_what_handlers_use():
    # guard the guards: the readers must see the fields, arguments and statuses they claim to
    mounted = {handler.__module__.rsplit(".", 1)[1] for _, handler in handler_routes()}
    assert mounted >= {"allocations", "users", "jobs", "kernels"}
    fields = json_body_fields(allocations.AllocationsHandler, "POST")
    assert fields is not None
    assert fields["offer"] == (frozenset({"str"}), True)
    assert fields["group"] == (frozenset({"str", "None"}), False)
    assert json_body_fields(allocations.KeepaliveHandler, "POST") == {}
    assert json_body_fields(users.PoolHandler, "GET") is None
    assert query_arguments(allocations.AllocationsHandler, "GET") == {
        "user",
        "state",
        "offset",
        "limit",
    }
    assert query_arguments(allocations.OffersHandler, "GET") == {"user", "group", "cluster"}
    assert 404 in error_statuses(users.UtilizationHandler, "GET")
    assert 404 in error_statuses(allocations.AllocationHandler, "GET")  # via self._check
    assert json_type(frozenset({"int", "float", "None"})) == ("number", True)
    with pytest.raises(AssertionError):
        json_type(frozenset({"float"}))


class _StrictLoader(yaml.SafeLoader):
    """A YAML loader that refuses a key twice in one mapping (plain ``safe_load`` keeps the
    last one silently: the spec once declared ``"400"`` twice for two operations)."""


def _no_duplicates(loader: yaml.SafeLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: dict[Any, int] = {}
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        line = key_node.start_mark.line + 1
        assert key not in seen, f"rest-api.yml:{line}: {key!r} again (first at line {seen[key]})"
        seen[key] = line
    return yaml.SafeLoader.construct_mapping(loader, node, deep)


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _no_duplicates)


def test_spec_has_no_key_twice():
    assert yaml.load(SPEC_PATH.read_text(), Loader=_StrictLoader) == load_spec()


def test_spec_info_says_what_metrics_need():
    """``/metrics`` needs a token by default (``authenticate_prometheus``), as the spec says."""
    text = load_spec()["info"]["description"]
    assert "no token" not in text and "read:metrics" in text


def test_every_path_parameter_is_bounded_as_the_server_checks():
    """Every string path parameter: at most 255 characters and no NUL (``APIHandler.prepare``
    refuses both with 400), so the fuzz test's negative cases probe the server's checks."""
    spec = load_spec()
    components = spec["components"]["parameters"]
    for path, item in spec["paths"].items():
        for method, op in item.items():
            if method == "parameters":
                continue
            for param in [*item.get("parameters", []), *op.get("parameters", [])]:
                param = components.get(param.get("$ref", "").rsplit("/", 1)[-1], param)
                schema = param["schema"]
                if param["in"] != "path" or "enum" in schema:
                    continue
                where = f"{method.upper()} {path} {param['name']}"
                assert schema.get("maxLength") == 255, where
                assert schema.get("pattern") == "^[^\\x00]*$", where
