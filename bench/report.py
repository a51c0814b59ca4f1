"""The benchmark's report: percentiles, the Markdown table and a summary of the gateway's log."""

from __future__ import annotations

import argparse
import collections
import contextlib
import math
import re
from pathlib import Path

from bench.measure import CLEANUP_TIMEOUT


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.2f} ms"


def report(args: argparse.Namespace, settings: list[str], res: dict) -> str:
    c = args.concurrency
    rows: list[tuple[str, str, str, str]] = []

    def latency_rows(label: str, key: str, attr: str) -> None:
        gw, dr = res[key]["gateway"], res[key]["direct"]
        for q in (0.5, 0.99):
            g, d = percentile(getattr(gw, attr), q), percentile(getattr(dr, attr), q)
            rows.append((f"{label} p{round(q * 100)}", ms(g), ms(d), f"{(g - d) * 1000:+.2f} ms"))

    latency_rows("chat non-stream latency, C=1", "whole_serial", "latency")
    latency_rows(f"chat non-stream latency, C={c}", "whole", "latency")
    latency_rows(f"chat stream TTFT, C={c}", "chat_stream", "ttft")
    latency_rows(f"chat stream total, C={c}", "chat_stream", "latency")
    latency_rows(f"anthropic stream TTFT, C={c}", "anth_stream", "ttft")
    latency_rows(f"anthropic stream total, C={c}", "anth_stream", "latency")
    bg, bd = res["burst_gateway"], res["burst_direct"]
    rps_g, rps_d = bg["done"] / bg["wall"], bd["done"] / bd["wall"]
    rows.append((f"chat non-stream throughput, C={c}", f"{rps_g:.0f} req/s", f"{rps_d:.0f} req/s",
                 f"{(1 / rps_g - 1 / rps_d) * 1000:+.2f} ms/req wall"))
    rows.append(("CPU per request: gateway process", ms(bg["cpu"]["gateway"]), "—", ms(bg["cpu"]["gateway"])))
    rows.append(("CPU per request: simulator process", ms(bg["cpu"]["simulator"]), ms(bd["cpu"]["simulator"]),
                 f"{(bg['cpu']['simulator'] - bd['cpu']['simulator']) * 1000:+.2f} ms"))
    rows.append(("CPU per request: bench client", ms(bg["cpu"]["client"]), ms(bd["cpu"]["client"]),
                 f"{(bg['cpu']['client'] - bd['cpu']['client']) * 1000:+.2f} ms"))
    total_g = sum(bg["cpu"].values())
    total_d = sum(bd["cpu"].values())
    rows.append(("CPU per request: all three", ms(total_g), ms(total_d), f"{(total_g - total_d) * 1000:+.2f} ms"))
    if "open" in res:
        o = res["open"]
        n = max(o["opened"], 1)
        rows.append((f"open streams: {o['opened']}/{o['count']} held (opened in {o['open_seconds']:.1f} s)",
                     f"RSS {o['rss_before']:.0f} -> {o['rss_open']:.0f} MB", "—",
                     f"{(o['rss_open'] - o['rss_before']) * 1024 / n:.1f} KB/stream"))
        rows.append(("open streams: gateway sockets",
                     f"{o['fds_before']} -> {o['fds_open']}", "—", f"{(o['fds_open'] - o['fds_before']) / n:.2f} sockets/stream"))
        rows.append((f"open streams: all hung up; {o['cleanup_seconds']:.1f} s later",
                     f"RSS {o['rss_closed']:.0f} MB, {o['fds_closed']} sockets", "—",
                     "" if o["fds_closed"] <= o["fds_before"] + 4 else f"gave up after {CLEANUP_TIMEOUT:.0f} s"))
    sk = res["sockets"]
    rows.append((f"gateway sockets still open after {sk['requests']} requests ended",
                 f"{sk['before']} -> {sk['after']}", "—", f"{(sk['after'] - sk['before']) * 100 / max(sk['requests'], 1):+.1f} per 100 req"))

    lines = ["## HopBase gateway overhead", "", "```", *settings, "```", "",
             "| what | gateway | direct | added |", "|---|---:|---:|---:|"]
    lines += [f"| {a} | {b} | {c_} | {d} |" for a, b, c_, d in rows]
    errors = []
    for key in ("whole_serial", "whole", "chat_stream", "anth_stream"):
        for name, samples in res[key].items():
            if samples.errors:
                errors.append(f"{key}/{name}: {dict(samples.errors)}")
    for key in ("burst_gateway", "burst_direct"):
        if res[key]["errors"]:
            errors.append(f"{key}: {dict(res[key]['errors'])}")
    if "open" in res and res["open"]["errors"]:
        errors.append(f"open streams: {res['open']['errors']}")
    lines += ["", "errors: " + ("; ".join(errors) if errors else "none")]
    counts = {k: len(res[k]["gateway"].latency) for k in ("whole_serial", "whole", "chat_stream", "anth_stream")}
    lines.append(f"samples per target: {counts}; bursts: {bg['done']} gateway, {bd['done']} direct requests")
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

