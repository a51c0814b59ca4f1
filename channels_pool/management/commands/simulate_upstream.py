"""``manage.py simulate_upstream``: run the fake LLM provider until killed.

The gateway's demo and process-level tests point their channels at it; see
``channels_pool.simulator`` for what it speaks and the directives it obeys.
"""

from __future__ import annotations

from argparse import ArgumentParser
from typing import Any

from django.core.management.base import BaseCommand

from channels_pool.simulator import run


class Command(BaseCommand):
    help = "Run the upstream LLM simulator (OpenAI, Anthropic and Gemini wire formats) until killed."
    # It touches neither models nor the database; skipping checks makes it start fast.
    requires_system_checks: list[str] = []

    def add_arguments(self, parser: ArgumentParser) -> None:
        parser.add_argument("--host", default="127.0.0.1")
        parser.add_argument("--port", type=int, default=8901, help="0 picks a free port")

    def handle(self, *args: Any, **options: Any) -> None:
        def ready(host: str, port: int) -> None:
            # Scripts wait for this exact line before sending requests.
            self.stdout.write(f"simulator listening on http://{host}:{port}")
            self.stdout.flush()

        try:
            run(options["host"], options["port"], ready=ready)
        except KeyboardInterrupt:
            pass
