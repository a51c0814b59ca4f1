"""The repository explains itself: every rule the code cites (F4, B9…)
is defined in docs/behaviour.md, and so is table E, so that a reader of the
code never needs a document that is not here."""

from __future__ import annotations

import re

from tests.support.processes import ROOT

CODE = ("core", "tenants", "providers", "channels_pool", "billing", "gateway", "serving", "hopbase", "console",
        "simulator", "tests", "bin")
# A rule id: a letter of the rule families and a number, standing alone ("F4",
# not "F401" in a noqa, not "S3Client").
RULE_ID = re.compile(r"(?<![\w.-])([PSFMBDTCVGKWXO]\d{1,2})(?!\w)")
DEFINED = re.compile(r"^- \*\*([A-Z]\d+)\*\*", re.MULTILINE)


def behaviour() -> str:
    return (ROOT / "docs" / "behaviour.md").read_text()


def cited_ids(text: str) -> set[str]:
    return set(RULE_ID.findall(text))


def test_every_rule_the_code_cites_is_defined_in_the_docs():
    defined = set(DEFINED.findall(behaviour()))
    undefined = {
        f"{path.relative_to(ROOT)}: {sorted(missing)}"
        for folder in CODE
        for path in (ROOT / folder).rglob("*.py")
        if (missing := cited_ids(path.read_text()) - defined)
    }
    assert not undefined, sorted(undefined)


def test_table_e_is_defined_in_the_docs():
    assert re.search(r"^#+ .*[Tt]able E", behaviour(), re.MULTILINE)


def test_a_rule_id_is_told_from_a_lint_code_or_a_name():
    assert cited_ids("rules F4 and B10 (M1–M6); # noqa: F401; S3Client; x.F4") == {"F4", "B10", "M1", "M6"}
