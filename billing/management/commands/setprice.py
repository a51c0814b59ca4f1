"""setprice MODEL --input USD_PER_MTOK --output USD_PER_MTOK
[--cache-read USD_PER_MTOK] [--cache-write USD_PER_MTOK] [--max-output-tokens N]
[--extra FEATURE=MULTIPLIER ...]

Adds a price row effective now. Older rows are never changed: requests made
before now keep the price they were made under. The admin log has the row's
addition by the OS user (core.audit).
"""

from __future__ import annotations

from django.core.exceptions import ValidationError
from django.core.management.base import CommandError
from django.db import IntegrityError, transaction
from django.utils import timezone

from billing.models import ModelPrice, valid_extras
from core import audit
from core.commands import OperatorCommand, checked, parse_price
from core.model_names import parse_model_names
from core.money import usd_text


class Command(OperatorCommand):
    help = "Set a model's price (USD per million tokens) from now on; earlier prices are kept."

    def add_arguments(self, parser) -> None:
        parser.add_argument("model", help="Model name as clients request it")
        parser.add_argument("--input", required=True, metavar="USD_PER_MTOK", help="Uncached input tokens")
        parser.add_argument("--output", required=True, metavar="USD_PER_MTOK", help="Output tokens, thinking included")
        parser.add_argument("--cache-read", default="0", metavar="USD_PER_MTOK", help="Cached input read (default 0)")
        parser.add_argument("--cache-write", default="0", metavar="USD_PER_MTOK", help="Cache write (default 0)")
        parser.add_argument("--max-output-tokens", type=int, metavar="N",
                            help="The model's output ceiling, reserved for requests that name no limit "
                                 "(default HOPBASE_DEFAULT_OUTPUT_CAP)")
        parser.add_argument("--extra", action="append", default=[], metavar="FEATURE=MULTIPLIER",
                            help="Allow a surcharge (rule B10) at a multiplier of the token charge, e.g. "
                                 "service_tier:priority=2 or tool:web_search=1.5; repeatable")

    def handle(self, *args, **options) -> None:
        names = checked(options["model"], parse_model_names, "model")
        if len(names) != 1:
            raise CommandError(f"model: {options['model']!r} is not one model name")
        model = names[0]
        prices = {
            "input_usd_per_mtok": parse_price(options["input"], "--input"),
            "output_usd_per_mtok": parse_price(options["output"], "--output"),
            "cache_read_usd_per_mtok": parse_price(options["cache_read"], "--cache-read"),
            "cache_write_usd_per_mtok": parse_price(options["cache_write"], "--cache-write"),
        }
        extras = dict(extra.rpartition("=")[::2] for extra in options["extra"])
        try:
            valid_extras(extras)
        except ValidationError as error:
            raise CommandError(f"--extra: {error.messages[0]}") from None
        ceiling = options["max_output_tokens"]
        if ceiling is not None and ceiling < 1:
            raise CommandError("--max-output-tokens: must be a positive number of tokens")
        try:
            with transaction.atomic():
                price = ModelPrice.objects.create(model=model, effective_from=timezone.now(),
                                                  max_output_tokens=ceiling, extras=extras, **prices)
                audit.added(price)
        except IntegrityError:  # the same model priced in the same microsecond
            raise CommandError(f"{model} was priced at this very moment by someone else; try again") from None
        self.stdout.write(
            f"price of {model} from {price.effective_from.isoformat()} (USD per million tokens): "
            f"input {usd_text(price.input_usd_per_mtok)}, output {usd_text(price.output_usd_per_mtok)}, "
            f"cache read {usd_text(price.cache_read_usd_per_mtok)}, "
            f"cache write {usd_text(price.cache_write_usd_per_mtok)}"
        )
