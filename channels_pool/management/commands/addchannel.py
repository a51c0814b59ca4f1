"""addchannel NAME --protocol KIND --base-url URL [--api-key SECRET | --api-key-file PATH]
--models public[=upstream],… [--priority N] [--weight N] [--max-concurrency N] [--native-only]
[--region R] [--project P] [--location L] [--api-version V]

Adds one upstream channel of one kind (providers.kinds): a vendor's own
API or a cloud (rule C1). Everything is checked before anything is written,
with the same per-kind rules the admin applies (``Channel.clean``), and a
refusal names the flag to fix. The secret (an API key, an AWS key pair, a
service-account JSON key) is stored encrypted (core.encryption) for the
relay and never echoed. The admin log has the channel's addition by the OS
user (core.audit).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction

from channels_pool.models import SECRET_MAX_LENGTH, Channel, validate_base_url
from core import audit
from core.commands import (
    INT_MAX,
    OperatorCommand,
    checked,
    parse_int,
    parse_name,
    parse_optional_positive,
)
from core.model_names import parse_channel_models, parse_model_names
from providers.kinds import KINDS
from providers.openai.azure import DEFAULT_API_VERSION

PROTOCOLS = list(KINDS)
# A kind's own settings (ChannelKind.settings) and the flags that set them.
SETTING_FLAGS = {"region": "--region", "project": "--project", "location": "--location",
                 "api_version": "--api-version"}


def a_channel(kind: str) -> str:
    """'an openai channel', 'a bedrock channel'."""
    return f"{'an' if kind[:1] in 'aeiou' else 'a'} {kind} channel"


def read_key_file(path: str) -> str:
    """The key a file holds (a service-account JSON key, say), its trailing newline dropped."""
    try:
        with open(path, encoding="utf-8") as file:
            # A wrong path (a log, a device) is never read whole; but what is
            # read is all the file holds, or it is refused: a prefix cut at
            # the limit could pass, once stripped, for a shorter key.
            text = file.read(2 * SECRET_MAX_LENGTH)
            more = file.read(1)
    except OSError as error:
        raise CommandError(f"--api-key-file: cannot read {path}: {error.strerror or error}") from None
    except UnicodeDecodeError:
        raise CommandError(f"--api-key-file: {path} is not UTF-8 text") from None
    if more:
        raise CommandError(f"--api-key-file is too long (at most {SECRET_MAX_LENGTH} characters)")
    return text.strip()


class Command(OperatorCommand):
    help = "Add an upstream channel (a provider account serving some models)."

    def add_arguments(self, parser) -> None:
        parser.add_argument("name", help="Unique channel name")
        parser.add_argument("--protocol", required=True, metavar="KIND", help=f"One of {', '.join(PROTOCOLS)}")
        parser.add_argument(
            "--base-url", required=True, metavar="URL",
            help="As the provider's SDK takes it: OpenAI http://host:port/v1; Anthropic and Gemini http://host:port; "
                 "Azure https://NAME.openai.azure.com; Bedrock https://bedrock-runtime.REGION.amazonaws.com; "
                 "Vertex https://LOCATION-aiplatform.googleapis.com",
        )
        key = parser.add_mutually_exclusive_group()
        key.add_argument(
            "--api-key", metavar="SECRET",
            help="The provider API key; bedrock: ACCESS_KEY_ID:SECRET[:SESSION_TOKEN] or a Bedrock API key "
                 "(none: the gateway's own AWS credentials)",
        )
        key.add_argument("--api-key-file", metavar="PATH", help="Read the key from a file (vertex: the service-account "
                                                                 "JSON key)")
        parser.add_argument(
            "--models", required=True, metavar="M1,M2=UPSTREAM",
            help="Models this channel serves; public=upstream sends the upstream name for the public one "
                 "(azure: the deployment; bedrock: the model id or inference profile)",
        )
        parser.add_argument(
            "--responses-only", default="", metavar="M1,M2",
            help="openai, azure: upstream model names served on /v1/responses only (the gpt-5-codex class); "
                 "clients of the other APIs reach them translated to Responses",
        )
        parser.add_argument("--priority", default="0", metavar="N", help="Higher is tried first (default 0)")
        parser.add_argument("--weight", default="1", metavar="N", help="Share among equal priorities (default 1)")
        parser.add_argument("--max-concurrency", metavar="N", help="Open requests at once (default: no limit)")
        parser.add_argument(
            "--native-only", action="store_true",
            help="Serve only clients of the channel's own protocol (default: every API, translated)",
        )
        parser.add_argument("--region", default="", help="bedrock (required): the AWS region, e.g. us-east-1")
        parser.add_argument("--project", default="", help="vertex (required): the Google Cloud project")
        parser.add_argument("--location", default="", help="vertex (required): the region, e.g. us-east5, or global")
        parser.add_argument(
            "--api-version", default="", metavar="V", help=f"azure: the API version (default {DEFAULT_API_VERSION})",
        )

    def handle(self, *args, **options) -> None:
        name = parse_name(options["name"], "channel name", Channel._meta.get_field("name").max_length)
        protocol = options["protocol"].strip().lower()
        if protocol not in KINDS:
            raise CommandError(f"--protocol: {options['protocol']!r} is not one of {', '.join(PROTOCOLS)}")
        base_url = checked(options["base_url"], validate_base_url, "--base-url")
        key_flag, secret = self._secret(options)
        models = checked(options["models"], parse_channel_models, "--models")
        responses_only = checked(options["responses_only"], parse_model_names, "--responses-only")
        priority = parse_int(options["priority"], "--priority", minimum=-INT_MAX)
        weight = parse_int(options["weight"], "--weight", minimum=1)
        max_concurrency = parse_optional_positive(options["max_concurrency"], "--max-concurrency")
        settings = self._settings(protocol, options)
        channel = Channel(
            name=name, protocol=protocol, base_url=base_url, secret=secret, served_models=models,
            responses_only=responses_only,
            priority=priority, weight=weight, max_concurrency=max_concurrency,
            cross_protocol=not options["native_only"], **settings,
        )
        self._check_kind(channel, key_flag)

        try:
            with transaction.atomic():
                if Channel.objects.filter(name=name).exists():
                    raise CommandError(f"a channel named {name!r} already exists")
                channel.save(force_insert=True)
                audit.added(channel)
        except IntegrityError:  # created by someone else since the check above
            raise CommandError(f"a channel named {name!r} already exists") from None
        self.stdout.write(f"added channel {channel.name} (id {channel.pk}): " + ", ".join(self._described(
            channel, models, max_concurrency, options["native_only"])))

    @staticmethod
    def _described(channel: Channel, models: list[str], max_concurrency: int | None, native_only: bool) -> list[str]:
        """What was added, its secret left out."""
        parts = [f"{channel.protocol} at {channel.base_url}"]
        parts += [f"{field.replace('_', ' ')} {value}" for field, value in channel.settings().items() if value]
        if channel.protocol == "azure" and not channel.api_version:
            parts.append(f"api version {DEFAULT_API_VERSION} (the default)")
        if not channel.secret:
            parts.append("no key: the gateway's own AWS credentials")
        parts += [f"models {', '.join(models)}", f"priority {channel.priority}", f"weight {channel.weight}",
                  f"max concurrency {max_concurrency or 'no limit'}"]
        if native_only:
            parts.append("its own protocol's clients only")
        return parts

    @staticmethod
    def _secret(options: dict) -> tuple[str, str]:
        """(the flag it came from, the secret); no flag at all is an empty secret."""
        if options["api_key_file"] is not None:
            flag, secret = "--api-key-file", read_key_file(options["api_key_file"])
        elif options["api_key"] is not None:
            flag, secret = "--api-key", options["api_key"].strip()
        else:
            return "--api-key", ""
        # A key given but empty (a failed `$(cat …)`) is a mistake, not a wish
        # for bedrock's credential chain: that is asked for by giving none.
        if not secret:
            raise CommandError(f"{flag} must not be empty")
        if len(secret) > SECRET_MAX_LENGTH:
            raise CommandError(f"{flag} is too long (at most {SECRET_MAX_LENGTH} characters)")
        return flag, secret

    @staticmethod
    def _settings(protocol: str, options: dict) -> dict[str, str]:
        """The kind's settings; one the kind does not read is refused, since
        the operator who typed it meant a channel of another kind."""
        wanted = KINDS[protocol].settings
        settings = {}
        for field, flag in SETTING_FLAGS.items():
            value = options[field].strip()
            if value and field not in wanted:
                raise CommandError(f"{flag} does not apply to {a_channel(protocol)}")
            max_length = Channel._meta.get_field(field).max_length
            if len(value) > max_length:
                raise CommandError(f"{flag}: {value!r} is longer than {max_length} characters")
            settings[field] = value
        return settings

    @staticmethod
    def _check_kind(channel: Channel, key_flag: str) -> None:
        """The kind's own rules (Channel.clean, as in the admin), each refusal naming its flag."""
        try:
            channel.clean()
        except ValidationError as error:
            field, messages = next(iter(error.message_dict.items()))
            flag = key_flag if field == "secret" else SETTING_FLAGS.get(field, f"--{field.replace('_', '-')}")
            if not getattr(channel, field, None):
                what = "--api-key (or --api-key-file)" if field == "secret" else flag
                raise CommandError(f"{what} is required for {a_channel(channel.protocol)}") from None
            raise CommandError(f"{flag}: {' '.join(messages)}") from None
