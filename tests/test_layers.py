"""Dependencies run one way (the map in docs/architecture.md, "The layers"):

    hopbase (the project: settings, urls, entry points, admin, commands)
      -> serving (the process)  -> gateway (the request path)
      -> channels_pool, billing  -> providers, tenants  -> core
    console (the customers' pages)  -> billing, tenants, the shared models, core

Each package may import only those below it, never one beside or above it:
no lower package imports ``hopbase``, ``gateway`` or ``serving``, the
providers know nothing but the core, and the money side and the channels
know each other only by their models. The upstream simulator, a test and
demo tool, stands alone. Read from the source, so a wrong-way import fails
here even where nothing runs it.
"""

from __future__ import annotations

import ast
import warnings
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "tenants", "providers", "channels_pool", "billing", "gateway", "serving", "hopbase", "console",
            "simulator")
BELOW_SERVING = ("core", "tenants", "providers", "channels_pool", "billing", "gateway")
# What each package may import of the others (its own modules always).
ALLOWED = {
    "core": ("core",),
    "tenants": ("core", "tenants"),
    "providers": ("core", "providers"),
    "channels_pool": ("core", "tenants", "providers", "channels_pool"),
    "billing": ("core", "tenants", "channels_pool.models", "billing"),
    "gateway": BELOW_SERVING,
    "serving": (*BELOW_SERVING, "serving"),
    "hopbase": (*BELOW_SERVING, "serving", "hopbase", "simulator"),
    "console": ("core", "tenants", "channels_pool.models", "billing", "console"),
    "simulator": ("simulator",),
}
# Modules that import each other, directly or round about (a type-only
# import too): a circle is two things that cannot be read apart. None is left;
# where a lower module must reach a higher one, the higher one joins it.
CIRCLES_ALLOWED = 0
# Files split along meaning, not length: past WARN_LINES a module is worth a
# look (a warning), past MAX_LINES it is refused.
WARN_LINES = 400
MAX_LINES = 600
# Other libraries' loggers HopBase sets the level of (uvicorn's own lines).
THIRD_PARTY_LOGGERS = {"uvicorn"}


def modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)


def imports(path: Path) -> Iterator[tuple[str, str | None]]:
    """Each absolute import in ``path``, anywhere in it: ``(module, None)``
    for ``import module``, ``(module, name)`` for ``from module import name``."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((alias.name, None) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield from ((node.module, alias.name) for alias in node.names)


def imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for module, name in imports(path):
        names.add(module)
        if name is not None:
            # ``from channels_pool import health`` imports a module too.
            names.add(f"{module}.{name}")
    return {name for name in names if name.split(".")[0] in PACKAGES}


def permitted(name: str, allowed: tuple[str, ...]) -> bool:
    """``name`` is a module, or ``module.attribute`` from a from-import."""
    if name in PACKAGES:
        return True  # a bare package import carries no layer's logic by itself
    candidates = (name, name.rsplit(".", 1)[0])
    return any(c not in PACKAGES and (c == p or c.startswith(p + ".")) for c in candidates for p in allowed)


def violations(path: Path, package: str) -> set[str]:
    return {name for name in imported_names(path) if not permitted(name, ALLOWED[package])}


@pytest.mark.parametrize("package", PACKAGES)
def test_imports_run_one_way(package):
    wrong = [f"{path.relative_to(ROOT)} imports {sorted(found)}" for path in modules(package) if (found := violations(path, package))]
    assert not wrong, "\n".join(wrong)


def test_a_wrong_way_import_is_caught(tmp_path):
    path = tmp_path / "recorder.py"
    path.write_text("from gateway.relay.relay import Relay\nfrom tenants.models import ApiKey\nfrom core.errors import GatewayError\n")
    assert violations(path, "billing") == {"gateway.relay.relay", "gateway.relay.relay.Relay"}


def module_name(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path, known: set[str]) -> set[str]:
    """The project's modules ``path`` imports: ``from a.b import c`` is
    module a.b.c where there is one, else attribute c of module a.b."""
    found = {module if name is None or f"{module}.{name}" not in known else f"{module}.{name}"
             for module, name in imports(path)}
    return found & known


def import_graph() -> dict[str, set[str]]:
    """Each module of the project and the project's modules it imports
    (anywhere in it, a deferred import included)."""
    paths = {module_name(path): path for package in PACKAGES for path in modules(package)}
    return {name: imported_modules(path, set(paths)) - {name} for name, path in paths.items()}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The groups of modules that reach each other (Tarjan's strongly
    connected components of more than one module)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_modules_import_each_other():
    found = circles(import_graph())
    assert len(found) <= CIRCLES_ALLOWED, "\n".join(" <-> ".join(group) for group in found)


def test_a_circle_is_found_however_long():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": {"f"}, "f": {"e"}}
    assert circles(graph) == [["a", "b", "c"], ["e", "f"]]


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_600_lines_and_those_over_400_are_named(package):
    sizes = {p.relative_to(ROOT): len(p.read_text().splitlines()) for p in modules(package)}
    long = [f"{path}: {n}" for path, n in sizes.items() if n > MAX_LINES]
    assert not long, long
    for path, n in sizes.items():
        if n > WARN_LINES:
            warnings.warn(f"{path} has {n} lines: does it still hold one subject?", stacklevel=1)


# The names operators search logs by and write alert rules on (the
# operator contract in docs/operations.md): moving a module renames none.
LOGGER_NAMES = {
    "billing.budget_status", "console.mail", "console.signin", "hopbase.admission", "hopbase.affinity",
    "hopbase.alerts", "hopbase.asgi", "hopbase.billing", "hopbase.budgets", "hopbase.channels", "hopbase.counting",
    "hopbase.dependencies", "hopbase.lifecycle", "hopbase.limits", "hopbase.periodic", "hopbase.provider_state",
    "hopbase.relay", "hopbase.requests", "hopbase.revocations", "hopbase.serve", "hopbase.settlement",
    "hopbase.spend", "hopbase.spool", "hopbase.staff_login", "hopbase.token_limits", "hopbase.translation",
    "hopbase.twisted_web", "hopbase.upstream", "hopbase.uvicorn_web",
}


def test_the_logger_names_are_the_ones_operators_know():
    from core import loggers

    assert {value for name, value in vars(loggers).items() if name.isupper()} == LOGGER_NAMES


@pytest.mark.parametrize("package", PACKAGES)
def test_every_logger_is_named_from_the_one_list(package):
    """Logger names are an operator contract (log search): each module takes
    its logger's name from core.loggers, so moving a module renames nothing."""
    from core import loggers

    declared = {value for name, value in vars(loggers).items() if name.isupper()}
    named_elsewhere = []
    for path in modules(package):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.Call) and getattr(node.func, "attr", "") == "getLogger" and node.args:
                argument = node.args[0]
                from_list = isinstance(argument, ast.Attribute) and getattr(argument.value, "id", "") == "loggers"
                if from_list:
                    assert getattr(loggers, argument.attr) in declared
                elif not (isinstance(argument, ast.Constant) and argument.value in THIRD_PARTY_LOGGERS):
                    named_elsewhere.append(f"{path.relative_to(ROOT)}:{node.lineno}")
    assert not named_elsewhere, named_elsewhere
