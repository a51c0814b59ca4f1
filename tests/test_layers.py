"""Dependencies run one way (the layout in docs/architecture.md, "How a request flows"):

    hopbase (the gateway)  ->  channels_pool, billing  ->  tenants  ->  core
    console (the customers' pages)  ->  billing, the shared models, tenants, core

The gateway may use the channels and the money side; those two use only
the shared core, the tenants and the shared models, never the gateway or
each other's logic; the tenants (who calls, who logs in) use only the core.
The tenant console reads the money side and the shared models; the gateway
never imports the console (it is mounted by name in hopbase.urls). Read from the
source, so a wrong-way import fails here even where nothing runs it."""

from __future__ import annotations

import ast
import warnings
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("core", "tenants", "providers", "hopbase", "channels_pool", "billing", "console", "simulator")
SHARED_MODELS = ("tenants.models", "channels_pool.models", "billing.models")
# What each package may import of the others (its own modules always).
ALLOWED = {
    "core": ("core", *SHARED_MODELS),
    "tenants": ("core", "tenants"),
    "providers": ("core", "providers"),
    "channels_pool": ("core", "tenants", "providers", "channels_pool"),
    "billing": ("core", "tenants", *SHARED_MODELS, "billing"),
    "hopbase": ("core", "tenants", "providers", "hopbase", "channels_pool", "billing", "simulator"),
    "console": ("core", "tenants", *SHARED_MODELS, "billing", "console"),
    # The upstream simulator, a test and demo tool, stands alone.
    "simulator": ("simulator",),
}
# Files split along meaning, not length: past WARN_LINES a module is worth a
# look (a warning), past MAX_LINES it is refused.
WARN_LINES = 400
MAX_LINES = 600
# Other libraries' loggers HopBase sets the level of (uvicorn's own lines).
THIRD_PARTY_LOGGERS = {"uvicorn"}


def modules(package: str) -> list[Path]:
    return sorted(p for p in (ROOT / package).rglob("*.py") if "migrations" not in p.parts)


def imported_names(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
            # ``from channels_pool import health`` imports a module too.
            names.update(f"{node.module}.{alias.name}" for alias in node.names)
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
    path.write_text("from hopbase.relay import Relay\nfrom tenants.models import ApiKey\nfrom core.errors import GatewayError\n")
    assert violations(path, "billing") == {"hopbase.relay", "hopbase.relay.Relay"}


@pytest.mark.parametrize("package", PACKAGES)
def test_no_module_is_over_600_lines_and_those_over_400_are_named(package):
    sizes = {p.relative_to(ROOT): len(p.read_text().splitlines()) for p in modules(package)}
    long = [f"{path}: {n}" for path, n in sizes.items() if n > MAX_LINES]
    assert not long, long
    for path, n in sizes.items():
        if n > WARN_LINES:
            warnings.warn(f"{path} has {n} lines: does it still hold one subject?", stacklevel=1)


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
