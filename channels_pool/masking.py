"""What operators are shown of a channel's refusals (the channel's health,
the test button): the provider's own error words, never a piece of the
channel's credential (a provider may quote a refused key back), and nothing
of an answer that is not a provider's error at all (an HTML page, an
internal service's text: a channel pointed at one must not be a way to read
it)."""

from __future__ import annotations

import orjson

# Shown where a piece of the channel's credential was, should a provider echo one back.
MASK = "••••"
# Shorter pieces of a credential (an AWS session token's parts, say) are not
# looked for: they would match ordinary words. The whole secret always is.
MIN_MASKED = 8


def masked(text: str, secret: str) -> str:
    """``text`` with no piece of the channel's credential in it: a provider
    may quote a refused key back (the parts of an AWS key pair, a service
    account's private key or its id included)."""
    if not secret:
        return text
    pieces = credential_pieces(secret)
    for piece in sorted(pieces, key=len, reverse=True):
        if piece == secret or len(piece) >= MIN_MASKED:
            text = text.replace(piece, MASK)
    return text


def credential_pieces(secret: str) -> set[str]:
    """The secret, and the parts of it a provider might quote on their own."""
    if not secret.lstrip().startswith("{"):
        return {secret, *secret.split(":")}
    try:
        info = orjson.loads(secret)
    except orjson.JSONDecodeError:
        return {secret}
    pieces = {secret}
    if isinstance(info, dict):
        for name in ("private_key", "private_key_id"):
            if isinstance(info.get(name), str) and info[name]:
                pieces.add(info[name])
                # A PEM key may be quoted a line at a time.
                pieces.update(line for line in info[name].splitlines() if "-----" not in line)
    return pieces


PROVIDER_MARKERS = ('"error"', '"message"', '"Message"', '"__type"')


def provider_words(body: str) -> str:
    """An error body as operators may read it: a JSON object naming an error
    or a message, as every provider's is; else nothing."""
    if body.lstrip().startswith("{") and any(marker in body for marker in PROVIDER_MARKERS):
        return body
    return ""
