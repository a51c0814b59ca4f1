"""addchannel NAME --protocol P --base-url URL --api-key SECRET --models public[=upstream],…
[--priority N] [--weight N] [--max-concurrency N] [--native-only]

Adds one upstream channel. The provider secret is stored encrypted
(core.encryption) for the relay and never echoed.
"""

from __future__ import annotations

from django.core.management.base import CommandError
from django.db import IntegrityError, transaction

from channels_pool.models import SECRET_MAX_LENGTH, Channel, validate_base_url
from core.commands import (
    INT_MAX,
    OperatorCommand,
    checked,
    parse_int,
    parse_name,
    parse_optional_positive,
)
from core.model_names import parse_channel_models
from core.vocabulary import WireProtocol

PROTOCOLS = [p.value for p in WireProtocol]


class Command(OperatorCommand):
    help = "Add an upstream channel (a provider account serving some models)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="Unique channel name")
        parser.add_argument("--protocol", required=True, help=f"One of {', '.join(PROTOCOLS)}")
        parser.add_argument(
            "--base-url", required=True, metavar="URL",
            help="As the provider's SDK takes it: OpenAI http://host:port/v1; Anthropic and Gemini http://host:port",
        )
        parser.add_argument("--api-key", required=True, metavar="SECRET", help="The provider API key")
        parser.add_argument(
            "--models", required=True, metavar="M1,M2=UPSTREAM",
            help="Models this channel serves; public=upstream sends the upstream name for the public one",
        )
        parser.add_argument("--priority", default="0", metavar="N", help="Higher is tried first (default 0)")
        parser.add_argument("--weight", default="1", metavar="N", help="Share among equal priorities (default 1)")
        parser.add_argument("--max-concurrency", metavar="N", help="Open requests at once (default: no limit)")
        parser.add_argument(
            "--native-only", action="store_true",
            help="Serve only clients of the channel's own protocol (default: every API, translated)",
        )

    def handle(self, *args, **options) -> None:
        name = parse_name(options["name"], "channel name", Channel._meta.get_field("name").max_length)
        protocol = options["protocol"].strip().lower()
        if protocol not in PROTOCOLS:
            raise CommandError(f"--protocol: {options['protocol']!r} is not one of {', '.join(PROTOCOLS)}")
        base_url = checked(options["base_url"], validate_base_url, "--base-url")
        secret = options["api_key"].strip()
        if not secret:
            raise CommandError("--api-key must not be empty")
        if len(secret) > SECRET_MAX_LENGTH:
            raise CommandError("--api-key is too long")
        models = checked(options["models"], parse_channel_models, "--models")
        priority = parse_int(options["priority"], "--priority", minimum=-INT_MAX)
        weight = parse_int(options["weight"], "--weight", minimum=1)
        max_concurrency = parse_optional_positive(options["max_concurrency"], "--max-concurrency")
        if Channel.objects.filter(name=name).exists():
            raise CommandError(f"a channel named {name!r} already exists")

        try:
            with transaction.atomic():
                channel = Channel.objects.create(
                    name=name, protocol=protocol, base_url=base_url, secret=secret, served_models=models,
                    priority=priority, weight=weight, max_concurrency=max_concurrency,
                    cross_protocol=not options["native_only"],
                )
        except IntegrityError:  # created by someone else since the check above
            raise CommandError(f"a channel named {name!r} already exists") from None
        self.stdout.write(
            f"added channel {channel.name} (id {channel.pk}): {channel.protocol} at {channel.base_url}, "
            f"models {', '.join(models)}, priority {priority}, weight {weight}, "
            f"max concurrency {max_concurrency or 'no limit'}"
            + (", its own protocol's clients only" if options["native_only"] else "")
        )
