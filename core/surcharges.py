"""Provider surcharges (B10): what a request switches on that a channel
bills beyond its tokens, refused unless the operator has priced it.

Each client API names the surcharges a request asks for (``Api.surcharges``:
a feature and the field that asks for it), before any channel is called:

    service_tier:<tier>      OpenAI ``service_tier`` other than auto/default
    background               Responses ``background: true`` (the provider
                             keeps generating after the client has gone)
    tool:<name>              a hosted tool: web_search, file_search,
                             code_interpreter, image_generation, mcp, ...;
                             Anthropic's server tools (web_search,
                             web_fetch, code_execution); Gemini's
                             google_search, url_context, google_maps
    anthropic-beta:<flag>    a priced beta: context-1m (long context),
                             extended-cache-ttl (1-hour cache writes)
    cache_ttl:1h             a 1-hour ``cache_control`` in the body

A model's price prices them (``billing.pricing.with_surcharges``). A web
search the request only offers (Codex offers one with every request) is
*optional*: unpriced, it is taken out of the request rather than refused,
and the model answers unsearched, as it does on a channel of another
protocol, which has no such tool (T3's nearest equivalent). A search the
request demands (``tool_choice`` names it) is refused like the rest.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Surcharge:
    feature: str  # e.g. "service_tier:priority"
    field: str  # where the request asks for it, for the refusal
    # Where it is in the body, for one that may be taken out instead
    # (optional): ("tools", index), ("tools", index, key) or (key,).
    path: tuple[str | int, ...] = ()

    @property
    def optional(self) -> bool:
        return bool(self.path)


def without(body: dict, dropped: list[Surcharge]) -> dict:
    """The body with the optional surcharges ``dropped`` taken out."""
    body = dict(body)
    from_tools: dict[int, set[str] | None] = {}
    for surcharge in dropped:
        if surcharge.path[0] != "tools":
            body.pop(surcharge.path[0], None)
        elif len(surcharge.path) == 3:
            keys = from_tools.setdefault(surcharge.path[1], set())
            if keys is not None:
                keys.add(surcharge.path[2])
        else:
            from_tools[surcharge.path[1]] = None
    if from_tools:
        kept = []
        for n, tool in enumerate(body["tools"]):
            if n not in from_tools:
                kept.append(tool)
            elif (keys := from_tools[n]) is not None and (rest := {k: v for k, v in tool.items() if k not in keys}):
                kept.append(rest)
        if kept:
            body["tools"] = kept
        else:
            del body["tools"]
    return body


def tool_name(kind: str) -> str:
    """A hosted tool's type without its version: ``web_search_20250305`` and
    ``web_search_preview_2025_03_11`` are both ``web_search``."""
    parts = kind.split("_")
    while parts and (parts[-1].isdigit() or parts[-1] == "preview"):
        parts.pop()
    return "_".join(parts) or kind


def one_hour_cache(body: object) -> bool:
    """Whether a ``cache_control`` anywhere in the body asks for a 1-hour
    TTL. A walk with a stack of its own: a body may nest 1,024 levels."""
    pending = [body]
    while pending:
        value = pending.pop()
        if isinstance(value, dict):
            control = value.get("cache_control")
            if isinstance(control, dict) and control.get("ttl") == "1h":
                return True
            pending.extend(item for item in value.values() if isinstance(item, (dict, list)))
        elif isinstance(value, list):
            pending.extend(item for item in value if isinstance(item, (dict, list)))
    return False


# Tools a client runs itself (a namespace groups functions, as Codex sends
# its sub-agents): billed as tokens, nothing more.
CLIENT_TOOLS = frozenset({"function", "custom", "namespace", "bash", "text_editor", "str_replace_editor",
                          "str_replace_based_edit_tool", "computer", "memory", "local_shell", "apply_patch"})
# Anthropic's tools that run on Anthropic's side, billed per use or time.
ANTHROPIC_SERVER_TOOLS = frozenset({"web_search", "web_fetch", "code_execution"})
# Gemini's tool entries that Google bills beyond tokens, by either spelling.
GEMINI_TOOLS = {"googleSearch": "google_search", "google_search": "google_search",
                "googleSearchRetrieval": "google_search", "google_search_retrieval": "google_search",
                "urlContext": "url_context", "url_context": "url_context",
                "googleMaps": "google_maps", "google_maps": "google_maps"}
# anthropic-beta flags that change the price (long context, 1-hour cache).
PRICED_BETAS = ("context-1m", "extended-cache-ttl")
SEARCH = "tool:web_search"


def _demanded(body: dict) -> set[str]:
    """The tool types ``tool_choice`` forces, if it names one."""
    choice = body.get("tool_choice")
    kind = choice.get("type") if isinstance(choice, dict) else None
    return {tool_name(kind)} if isinstance(kind, str) else set()


def openai_surcharges(body: dict, tools_hosted: bool) -> list[Surcharge]:
    """``service_tier`` above the default, ``background``, and hosted tools
    (``tools_hosted``: Responses, where any tool type but a function's is
    run by OpenAI; Chat's only hosted tool is ``web_search_options``)."""
    found: list[Surcharge] = []
    tier = body.get("service_tier")
    if tier not in (None, "auto", "default"):
        found.append(Surcharge(f"service_tier:{tier}", "service_tier"))
    if body.get("background") is True:
        found.append(Surcharge("background", "background"))
    if body.get("web_search_options") is not None:
        found.append(Surcharge(SEARCH, "web_search_options", ("web_search_options",)))
    tools = body.get("tools")
    demanded = _demanded(body)
    for n, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if tools_hosted and isinstance(kind, str) and (name := tool_name(kind)) not in CLIENT_TOOLS:
            optional = f"tool:{name}" == SEARCH and name not in demanded
            found.append(Surcharge(f"tool:{name}", f"tools[{n}].type", ("tools", n) if optional else ()))
    return found


def beta_surcharges(headers: dict[str, str]) -> list[Surcharge]:
    """Priced ``anthropic-beta`` flags, whatever API the client called: the
    header goes on to any Anthropic, Bedrock or Vertex channel that serves
    the request, translated or not."""
    found: list[Surcharge] = []
    for flag in headers.get("anthropic-beta", "").split(","):
        flag = flag.strip()
        for priced in PRICED_BETAS:
            if flag.startswith(priced):
                found.append(Surcharge(f"anthropic-beta:{priced}", "anthropic-beta"))
    return found


def anthropic_surcharges(body: dict, raw_body: bytes) -> list[Surcharge]:
    found: list[Surcharge] = []
    tools = body.get("tools")
    choice = body.get("tool_choice")
    demanded = choice.get("name") if isinstance(choice, dict) and choice.get("type") == "tool" else None
    for n, tool in enumerate(tools if isinstance(tools, list) else []):
        kind = tool.get("type") if isinstance(tool, dict) else None
        if isinstance(kind, str) and (name := tool_name(kind)) in ANTHROPIC_SERVER_TOOLS:
            optional = f"tool:{name}" == SEARCH and tool.get("name") != demanded
            found.append(Surcharge(f"tool:{name}", f"tools[{n}].type", ("tools", n) if optional else ()))
    if body.get("mcp_servers"):
        found.append(Surcharge("tool:mcp", "mcp_servers"))
    # The walk only for a body whose bytes could ask: "1h" as it is, or with either character escaped.
    if (b'"1h"' in raw_body or b"\\u0031" in raw_body or b"\\u0068" in raw_body) and one_hour_cache(body):
        found.append(Surcharge("cache_ttl:1h", "cache_control.ttl"))
    return found


def gemini_surcharges(body: dict) -> list[Surcharge]:
    found: list[Surcharge] = []
    tools = body.get("tools")
    for n, tool in enumerate(tools if isinstance(tools, list) else []):
        for key in tool if isinstance(tool, dict) else ():
            if key in GEMINI_TOOLS:
                search = GEMINI_TOOLS[key] == "google_search"  # Gemini's tools cannot be forced
                found.append(Surcharge(f"tool:{GEMINI_TOOLS[key]}", f"tools[{n}].{key}", ("tools", n, key) if search else ()))
    return found
