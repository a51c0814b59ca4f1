"""``manage.py simulate_upstream``: run the fake LLM provider until killed.

The gateway's demo and process-level tests point their channels at it; see
``simulator`` for what it speaks and the directives it obeys.
"""

from __future__ import annotations

import json
from argparse import ArgumentParser
from pathlib import Path
from typing import Any

from django.core.management.base import BaseCommand

from simulator import run, vertex_service_account


class Command(BaseCommand):
    help = ("Run the upstream LLM simulator (OpenAI, Anthropic and Gemini wire formats, and Azure, Bedrock and "
            "Vertex) until killed.")
    # It touches neither models nor the database; skipping checks makes it start fast.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8901, help="0 picks a free port")
        parser.add_argument("--vertex-key-out", type=Path, default=None,
                            help="write a service-account JSON key this simulator accepts (its token_uri included)")
        parser.add_argument("--vertex-token-ttl", type=float, default=None,
                            help="seconds a Vertex access token lives (default 3600)")

    def handle(self, *args: Any, **options: Any) -> None:
        def ready(host: str, port: int) -> None:
            if options["vertex_key_out"] is not None:
                # Written before the ready line, so a script that waits for the line finds the key.
                key = vertex_service_account(f"http://{host}:{port}")
                options["vertex_key_out"].write_text(json.dumps(key, indent=2))
            # Scripts wait for this exact line before sending requests.
            self.stdout.write(f"simulator listening on http://{host}:{port}")
            self.stdout.flush()

        try:
            run(options["host"], options["port"], ready=ready, vertex_token_ttl=options["vertex_token_ttl"])
        except KeyboardInterrupt:
            pass
