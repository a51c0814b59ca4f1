"""The benchmark's report: percentiles, the Markdown table and a summary of the gateway's log."""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import re
from pathlib import Path

from bench.servers import PAIRS, PRODUCTION

# The row label of serve on PostgreSQL and Redis (--production-shape).
PRODUCTION_SHAPE = "uvicorn, production shape (PostgreSQL, Redis, a Celery worker settling)"
from bench.targets import ROUNDS


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def per(total: dict, events: int = 1) -> float:
    return total["cpu"] / max(total["done"] * events, 1)


def ratio(over: dict, under: dict, over_events: int = 1, under_events: int = 1) -> str:
    """The ratio over all rounds (as the columns beside it), and the range
    of the rounds' own: how far one round's noise reaches. With events, per
    event: two streams may differ by an event or two."""
    scale = under_events / max(over_events, 1)
    rounds = sorted(a / b * scale for a, b in zip(over["rounds"], under["rounds"]) if b > 0)
    whole = per(over, over_events) / max(per(under, under_events), 1e-12)
    if not rounds:
        return f"{whole:.2f}×"
    return f"{whole:.2f}× (rounds {rounds[0]:.2f}–{rounds[-1]:.2f})"


def added(gateway: float, floor: float) -> str:
    """What the gateway adds against what the bare relay adds, as a ratio
    and as the time beyond it (seconds in)."""
    return f"{gateway / max(floor, 1e-6):.2f}×, {(gateway - floor) * 1e3:+.2f} ms beyond the bare relay"


def raw_latency_row(samples: dict) -> tuple[str, str, str, str, str]:
    """Added latency read by a raw socket, each relay held against the
    exchange it makes: the gateway reads the channel's stream (F4), where
    the bare relay passes on its body, and the simulator takes longer to
    write 50 events than one body (a provider generating the tokens takes
    as long for either)."""
    raw = {name: percentile(s.latency, 0.5) for name, s in samples.items()}
    g, f, body, stream = raw["gateway"], raw["floor"], raw["direct"], raw["direct stream"]
    label = ("  the same read by a raw socket, each relay against the exchange it makes: the gateway the "
             "channel's 50-event stream (F4), the bare relay its body")
    return (label,
            f"+{(f - body) * 1e3:.2f} ms (bare relay; the body direct {body * 1e3:.2f} ms)",
            f"+{(g - stream) * 1e3:.2f} ms (the stream direct {stream * 1e3:.2f} ms)",
            added(g - stream, f - body), "≤ +1 ms")


def refusals(events: dict[str, int]) -> str:
    """The legs the gateway refused (their events: minus the status)."""
    return "gateway answered " + ", ".join(f"{name} HTTP {-n}" for name, n in events.items() if n <= 0)


def cloud_rows(tgt: dict) -> list[tuple[str, str, str, str, str]]:
    """The cloud channels against the vendors' own, the same answer passed
    through on both (rule C1): whole streams, and Bedrock's event stream
    event by event on a paced stream."""
    rows: list[tuple[str, str, str, str, str]] = []
    events, clouds = tgt["cloud_events"], tgt["clouds"]
    for leg, under, what in (("bedrock", "anthropic", "Messages stream over a bedrock channel (SigV4, AWS event stream)"),
                             ("vertex claude", "anthropic", "Messages stream over a vertex channel (Claude; token, SSE)"),
                             ("vertex gemini", "gemini", "Gemini stream over a vertex channel (token, SSE)")):
        label = f"CPU per {what}, {events[leg]} events"
        if clouds is None:
            rows.append((label, "—", f"n/a ({refusals(events)})", "—", "—"))
            continue
        rows.append((label, f"{per(clouds[under]) * 1e3:.2f} ms (the same over an {under} channel)",
                     f"{per(clouds[leg]) * 1e3:.2f} ms", ratio(clouds[leg], clouds[under]), f"≤ 1.15× {under}"))
    events, paced = tgt["paced_events"], tgt["paced"]
    label = f"CPU per streamed event, paced ({events['bedrock paced']} events, each its own read): bedrock's event stream"
    if paced is None:
        rows.append((label, "—", f"n/a ({refusals(events)})", "—", "—"))
    else:
        sse_events, decoded_events = events["anthropic paced"], events["bedrock paced"]
        sse, decoded = paced["anthropic paced"], paced["bedrock paced"]
        rows.append((label, f"{per(sse, sse_events) * 1e3:.3f} ms (Anthropic SSE passed through, paced)",
                     f"{per(decoded, decoded_events) * 1e3:.3f} ms", ratio(decoded, sse, decoded_events, sse_events),
                     "≤ 1.2× SSE"))
    return rows


def embedding_rows(found: dict) -> list[tuple[str, str, str, str, str]]:
    """Embeddings (issue 27) against the bare relay, a 1,536-number answer each."""
    floor = found["floor float"]
    rows = []
    for leg, what, goal in (("gateway float", "floats passed through (openai channel)", "≤ 2× floor"),
                            ("gateway base64", "base64 passed through, never decoded", "≤ 2× floor"),
                            ("gateway translated", "translated from Vertex :predict", "—")):
        rows.append((f"CPU per embeddings request: {what}", f"{per(floor) * 1e3:.2f} ms (bare relay, floats)",
                     f"{per(found[leg]) * 1e3:.2f} ms", ratio(found[leg], floor), goal))
    return rows


def server_rows(found: dict) -> list[tuple[str, str, str, str, str]]:
    """Issue 31's targets: HopBase on each server against that server's
    floor; with ``--production-shape``, serve on PostgreSQL and Redis too,
    against the same floor as serve."""
    rows = []
    whole, paced, serial = found["whole"], found["paced"], found["serial"]
    uvicorn_goals = ("≤ 2× floor", "≤ 1.3× floor", "≤ 1.5× floor's")
    goals = {"uvicorn": uvicorn_goals, PRODUCTION_SHAPE: uvicorn_goals, "daphne": ("≤ 2× floor", "≤ 1.4× floor", "—")}
    production = [(PRODUCTION_SHAPE, PRODUCTION, "floor-uvicorn")] if PRODUCTION in whole else []
    for server, hopbase, floor in (*PAIRS, *production):
        what = "plain daphne" if server == "daphne" else "serve --workers 1"
        floor_name = f"bare relay on {floor_server(floor)}"
        rows.append((f"{server}: CPU per whole answer (16 tokens), {what}",
                     f"{per(whole[floor]) * 1e3:.2f} ms ({floor_name})",
                     f"{per(whole[hopbase]) * 1e3:.2f} ms", ratio(whole[hopbase], whole[floor]), goals[server][0]))
        if server == "uvicorn":
            rows.append(("  against HopBase under plain daphne in the same rounds",
                         f"{per(whole['gateway']) * 1e3:.2f} ms (plain daphne)",
                         f"{per(whole[hopbase]) * 1e3:.2f} ms", ratio(whole[hopbase], whole["gateway"]),
                         "≤ 0.8× daphne's"))
        rows.append((f"{server}: CPU per paced stream (200 events, each its own read), {what}",
                     f"{per(paced[floor]) * 1e3:.2f} ms ({floor_name})",
                     f"{per(paced[hopbase]) * 1e3:.2f} ms", ratio(paced[hopbase], paced[floor]), goals[server][1]))
        direct = serial["direct"].latency
        for q, name in ((0.5, "p50"), (0.99, "p99")):
            base = percentile(direct, q)
            f_add = percentile(serial[floor].latency, q) - base
            h_add = percentile(serial[hopbase].latency, q) - base
            rows.append((f"{server}: added latency, non-stream, C=1, {name}",
                         f"+{f_add * 1e3:.2f} ms (bare relay; direct {base * 1e3:.2f} ms)", f"+{h_add * 1e3:.2f} ms",
                         f"{h_add / max(f_add, 1e-6):.2f}×", goals[server][2]))
        rows.append(f4_bound_row(found["raw"], hopbase, floor))
    return rows


def floor_server(floor: str) -> str:
    """The server a floor's target runs on, by its name in PAIRS."""
    return next(server for server, _, name in PAIRS if name == floor)


def f4_bound_row(samples: dict, hopbase: str, floor: str) -> tuple[str, str, str, str, str]:
    """Added latency at p50 read by raw sockets, and the least that any
    gateway reading the channel's stream (F4) can add: what the bare relay
    adds, plus what the simulator takes to write the answer's stream beyond
    its body (a provider generating the tokens takes as long for either)."""
    raw = {name: percentile(s.latency, 0.5) for name, s in samples.items()}
    body, stream = raw["direct"], raw["direct stream"]
    bare, added_here = raw[floor] - body, raw[hopbase] - body
    least = bare + stream - body
    return (f"  read by raw sockets, p50; the least a gateway that reads the channel's stream (F4) can add (the "
            f"simulator streams the answer in {stream * 1e3:.2f} ms, sends it whole in {body * 1e3:.2f} ms)",
            f"+{bare * 1e3:.2f} ms (bare relay)", f"+{added_here * 1e3:.2f} ms; F4's least +{least * 1e3:.2f} ms",
            f"{added_here / max(bare, 1e-6):.2f}×; F4's least {least / max(bare, 1e-6):.2f}×", "—")


def report(args: argparse.Namespace, settings: list[str], res: dict, tgt: dict) -> str:
    """One table: each target of issue 13, its floor, today's figure, the ratio."""
    rows: list[tuple[str, str, str, str, str]] = []

    whole = tgt["whole"]
    floor, one = per(whole["floor 50"]), per(whole["gateway 50"])
    rows.append(("CPU per relayed non-stream request (50 tokens)", f"{floor * 1e3:.2f} ms (bare relay)",
                 f"{one * 1e3:.2f} ms", ratio(whole["gateway 50"], whole["floor 50"]), "≤ 2× floor"))
    for tokens, what, goal in ((16, "issue 13's own measurement", "≤ 2× floor"),
                               (1, "the cost apart from the events", "—")):
        floor_n, one_n = per(whole[f"floor {tokens}"]), per(whole[f"gateway {tokens}"])
        rows.append((f"  the same with {tokens} token{'s' if tokens > 1 else ''} ({what})",
                     f"{floor_n * 1e3:.2f} ms (bare relay)", f"{one_n * 1e3:.2f} ms",
                     ratio(whole[f"gateway {tokens}"], whole[f"floor {tokens}"]), goal))
    bare_50, bare_1 = tgt["bare_reads"][50], tgt["bare_reads"][1]
    rows.append(("  the 50-token stream itself, read by a bare aiohttp client (F4's share; no gateway)",
                 f"{bare_1 * 1e3:.2f} ms (one token)", f"{bare_50 * 1e3:.2f} ms",
                 f"+{(bare_50 - bare_1) * 1e3:.2f} ms = {(bare_50 - bare_1) / floor:.2f}× the bare relay", "—"))
    events = tgt["long_events"]
    long = tgt["long"]
    f_ev, g_ev = per(long["floor"], events), per(long["gateway"], events)
    rows.append((f"CPU per streamed event ({events}-event pass-through)", f"{f_ev * 1e3:.3f} ms (bare relay)",
                 f"{g_ev * 1e3:.3f} ms", ratio(long["gateway"], long["floor"]), "≤ 0.05 ms"))
    if "translation" in tgt:
        n = tgt["translated_events"]
        p_st, t_st = per(tgt["translation"]["passed"]), per(tgt["translation"]["translated"])
        rows.append((f"CPU per translated stream (chat client, anthropic channel, {n} events)",
                     f"{p_st * 1e3:.2f} ms (the same stream passed through)", f"{t_st * 1e3:.2f} ms",
                     ratio(tgt["translation"]["translated"], tgt["translation"]["passed"]), "≤ 2× pass-through"))
    else:
        rows.append(("CPU per translated stream (chat client, anthropic channel)", "—",
                     f"n/a (gateway answered {-tgt['translated_events']})", "—", "—"))
    rows += cloud_rows(tgt)
    rows += embedding_rows(tgt["embeddings"])
    governed = tgt["governed"]
    plain, held = per(governed["gateway"]), per(governed["governed"])
    rows.append(("CPU per request, a key with two budgets and a TPM limit (one token, non-stream)",
                 f"{plain * 1e3:.2f} ms (a key with none)", f"{held * 1e3:.2f} ms",
                 f"{ratio(governed['governed'], governed['gateway'])}, {(held - plain) * 1e3:+.3f} ms", "≤ +0.1 ms"))
    served = tgt["serve"]
    daphne_alone, alone, two = per(served["gateway"]), per(served["serve1"]), per(served["serve"])
    shares = sorted(served["serve"]["per_pid"].values())
    spread = "/".join(f"{100 * v / max(sum(shares), 1e-9):.0f}" for v in shares)
    rows.append((f"CPU per request, serve --workers 2 (summed; CPU split {spread} %)",
                 f"{alone * 1e3:.2f} ms (serve --workers 1)", f"{two * 1e3:.2f} ms",
                 ratio(served["serve"], served["serve1"]), "≤ 1.10×"))
    rows.append(("  serve --workers 1 (uvicorn, multiprocess metrics) against the one gateway process (plain daphne)",
                 f"{daphne_alone * 1e3:.2f} ms (gateway)", f"{alone * 1e3:.2f} ms",
                 ratio(served["serve1"], served["gateway"]), "—"))
    floor_alone, floor_two = per(served["floor-uvicorn"]), per(served["floor2"])
    rows.append(("  the bare relay on uvicorn the same way, in two processes on serve's sockets (what scaling out costs the stack)",
                 f"{floor_alone * 1e3:.2f} ms (one process)", f"{floor_two * 1e3:.2f} ms",
                 ratio(served["floor2"], served["floor-uvicorn"]), "—"))
    rows.append(("  serve's ratio over the bare relay's (what scaling out costs HopBase itself)", "—", "—",
                 f"{(two / alone) / (floor_two / floor_alone):.2f}×", "≤ 1.10×"))
    for label, key, attr in (("added latency, non-stream, C=1, p50", "whole_serial", "latency"),
                             ("added time to first token, stream, C=1, p50", "chat_stream_serial", "ttft")):
        g, f, d = (percentile(getattr(res[key][name], attr), 0.5) for name in ("gateway", "floor", "direct"))
        rows.append((label, f"+{(f - d) * 1e3:.2f} ms (bare relay; direct {d * 1e3:.2f} ms)", f"+{(g - d) * 1e3:.2f} ms",
                     added(g - d, f - d), "≤ +1 ms"))
        if key == "whole_serial":
            rows.append(raw_latency_row(res["whole_raw"]))
    if "servers" in tgt:
        rows += server_rows(tgt["servers"])
    if "open" in tgt:
        o = tgt["open"]
        rows.append((f"{o['count']} streams opened at once over serve --workers 2: connections established", "—",
                     f"{o['connected']} in {o['connect_seconds']:.1f} s", "—", "all within 5 s"))
        rows.append(("  streams with their first token", "—", f"{o['opened']} in {o['open_seconds']:.1f} s", "—",
                     "all within 5 s"))
        rows.append(("  their RSS, both processes", f"{o['rss_before_mb']:.0f} MB idle", f"{o['rss_mb']:.0f} MB",
                     f"{(o['rss_mb'] - o['rss_before_mb']) * 1024 / max(o['opened'], 1):.1f} KB/stream", "< 1024 MB"))
        rows.append(("  upstream requests cancelled when they closed", "—", f"{o['cancelled']}/{o['upstream']}", "—",
                     "all"))
    if "open_floor" in tgt:
        o, bare = tgt["open"], tgt["open_floor"]
        rows.append(("  the same burst over the bare relay on uvicorn in two processes: first tokens", "—",
                     f"{bare['opened']} in {bare['open_seconds']:.1f} s (connected in {bare['connect_seconds']:.1f} s)",
                     f"serve {o['open_seconds'] / bare['open_seconds']:.2f}× the bare relay's", "—"))

    lines = ["## HopBase against its floor (issue 13)", "", "```", *settings, "```", "",
             "| target | floor | today | ratio | goal |", "|---|---:|---:|---:|---|"]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    errors = [f"{key}/{name}: {dict(samples.errors)}" for key in ("whole_serial", "chat_stream_serial", "whole_raw")
              for name, samples in res[key].items() if samples.errors]
    measured = {key: tgt[key] for key in ("whole", "serve", "long", "translation", "clouds", "paced", "embeddings",
                                          "governed") if tgt.get(key)}
    errors += [f"{key}/{name}: {dict(t['errors'])}" for key, targets in measured.items()
               for name, t in targets.items() if t["errors"]]
    for key, what in (("open", "open streams"), ("open_floor", "open streams, bare relay")):
        if key in tgt and tgt[key]["errors"]:
            errors.append(f"{what}: {tgt[key]['errors']}")
    if "servers" in tgt:
        found = tgt["servers"]
        errors += [f"servers {key}/{name}: {dict(t['errors'])}" for key in ("whole", "paced")
                   for name, t in found[key].items() if t["errors"]]
        errors += [f"servers {key}/{name}: {dict(samples.errors)}" for key in ("serial", "raw")
                   for name, samples in found[key].items() if samples.errors]
    sk = res["sockets"]
    lines += ["", f"CPU rows: floor, today and the ratio over all {ROUNDS} alternating rounds; in brackets the "
              "range of the rounds' own ratios.",
              "", "errors: " + ("; ".join(errors) if errors else "none"),
              f"calls per target: non-stream {whole['gateway 50']['done']}, long streams {long['gateway']['done']}; "
              f"gateway sockets after {sk['requests']} requests ended: {sk['before']} -> {sk['after']}"]
    return "\n".join(lines)


def gateway_log_summary(path: Path) -> str:
    """Warnings and errors the gateway logged, counted by kind."""
    kinds: collections.Counter = collections.Counter()
    with contextlib.suppress(OSError):
        for line in path.read_text(errors="replace").splitlines():
            match = re.match(r"\S+ \S+ (WARNING|ERROR|CRITICAL) (\S+) (.*)", line)
            if match:
                message = re.sub(r"<.*>|\b\d+\b|'[^']*'", "…", match.group(3))
                if len(message) > 90:
                    message = message[:40] + " … " + message[-45:]
                kinds[f"{match.group(1)} {match.group(2)}: {message}"] += 1
            elif line.startswith("Traceback"):
                kinds["traceback"] += 1
    if not kinds:
        return "gateway log: no warnings"
    return "gateway log: " + "; ".join(f"{n}x {kind}" for kind, n in kinds.most_common(6))

