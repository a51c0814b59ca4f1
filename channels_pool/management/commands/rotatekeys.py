"""rotatekeys: re-encrypt every channel secret with the first key of
HOPBASE_ENCRYPTION_KEYS (core.encryption).

A key is rotated in three steps: put the new key first in
HOPBASE_ENCRYPTION_KEYS, keeping the old ones after it, and restart every
process; run ``rotatekeys``; then drop the old keys. A secret still stored in
plaintext (written before encryption, or restored from an old dump) is
encrypted too. A secret no configured key decrypts is left as it is and
named, and the command exits non-zero: keep its key listed until it is
fixed. ``--derived-key`` prints the key derived from SECRET_KEY, which is
the one in use while HOPBASE_ENCRYPTION_KEYS is unset: list it after a new
key to move to keys of your own. The admin log has a row for each channel
whose secret was re-encrypted (or encrypted), by the OS user (core.audit),
in the same transaction; the secret is named, never shown.
"""

from __future__ import annotations

from django.conf import settings
from django.core.management.base import CommandError
from django.db import models, transaction
from django.db.models.functions import Cast

from channels_pool.models import Channel
from core import audit
from core.commands import OperatorCommand
from core.encryption import SecretUnreadable, decrypt, derived_key, looks_like_token

# The admin log's sentences (what an admin action would say).
REENCRYPTED = "Secret re-encrypted with the first key of HOPBASE_ENCRYPTION_KEYS."
ENCRYPTED = "Secret, stored in plaintext, encrypted with the first key of HOPBASE_ENCRYPTION_KEYS."


class Command(OperatorCommand):
    help = "Re-encrypt every channel secret with the first key of HOPBASE_ENCRYPTION_KEYS."

    def add_arguments(self, parser) -> None:
        parser.add_argument(
            "--derived-key", action="store_true", dest="print_derived_key",
            help="Only print the Fernet key derived from SECRET_KEY (alone on the last line)",
        )

    def handle(self, *args, print_derived_key: bool = False, **options) -> None:
        if print_derived_key:
            self.stdout.write(derived_key(settings.SECRET_KEY))
            return
        rotated, encrypted, unreadable = [], [], []
        with transaction.atomic():
            # The stored text itself (a Cast escapes the field's decryption),
            # so that one bad row cannot stop the others.
            rows = (
                Channel.objects.select_for_update()
                .annotate(stored=Cast("secret", models.TextField()))
                .order_by("pk")
                .values_list("pk", "name", "stored")
            )
            for pk, name, stored in rows:
                if not stored:
                    continue
                if looks_like_token(stored):
                    try:
                        plaintext = decrypt(stored)
                    except SecretUnreadable:
                        unreadable.append(name)
                        continue
                    rotated.append(pk)
                else:
                    plaintext = stored
                    encrypted.append(pk)
                # The field encrypts with the first key on the way in.
                Channel.objects.filter(pk=pk).update(secret=plaintext)
            if rotated or encrypted:
                by = audit.actor()
                # Each channel's name only: its secret is neither read nor decrypted again here.
                named = {c.pk: c for c in Channel.objects.filter(pk__in=rotated + encrypted).only("pk", "name")}
                audit.acted([named[pk] for pk in rotated], REENCRYPTED, by)
                audit.acted([named[pk] for pk in encrypted], ENCRYPTED, by)
        self.stdout.write(
            f"re-encrypted {len(rotated)} channel secret(s) with the first key"
            + (f"; encrypted {len(encrypted)} stored in plaintext" if encrypted else "")
        )
        if unreadable:
            raise CommandError(
                f"{len(unreadable)} channel secret(s) no configured key decrypts, left as they are: "
                f"{', '.join(unreadable)} (list the key they were encrypted with in HOPBASE_ENCRYPTION_KEYS)"
            )

