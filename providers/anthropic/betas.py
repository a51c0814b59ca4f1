"""Which of Anthropic's beta flags a cloud takes (``anthropic_betas.json``,
data to update as clouds and Claude Code ship new ones): a cloud refuses a
whole request for one flag it does not know, so the rest are dropped."""

from __future__ import annotations

from pathlib import Path

import orjson

_TAKEN: dict[str, frozenset[str]] = {
    cloud: frozenset(flags)
    for cloud, flags in orjson.loads((Path(__file__).parent / "anthropic_betas.json").read_bytes()).items()
    if isinstance(flags, list)
}


def taken_by(cloud: str, header: str | None) -> list[str]:
    """The flags of an ``anthropic-beta`` header that ``cloud`` takes, in order."""
    allowed = _TAKEN[cloud]
    return [flag for flag in (part.strip() for part in (header or "").split(",")) if flag in allowed]
