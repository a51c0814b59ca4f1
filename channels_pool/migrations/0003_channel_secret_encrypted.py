"""Channel secrets encrypted at rest (core.encryption): the column becomes
text (a Fernet token is longer than the secret), every plaintext secret is
encrypted with the first configured key, then the field is the encrypting
one. Reversible: going back decrypts them."""

from django.core.validators import MaxLengthValidator
from django.db import migrations, models

import core.encryption

HELP = "The provider API key. Write-only; encrypted at rest."


def encrypt_secrets(apps, schema_editor):
    # The historical field here is a plain TextField: values as stored.
    Channel = apps.get_model("channels_pool", "Channel")
    for pk, stored in Channel.objects.values_list("pk", "secret"):
        if stored and not core.encryption.looks_like_token(stored):
            Channel.objects.filter(pk=pk).update(secret=core.encryption.encrypt(stored))


def decrypt_secrets(apps, schema_editor):
    Channel = apps.get_model("channels_pool", "Channel")
    for pk, stored in Channel.objects.values_list("pk", "secret"):
        if stored and core.encryption.looks_like_token(stored):
            Channel.objects.filter(pk=pk).update(secret=core.encryption.decrypt(stored))


class Migration(migrations.Migration):

    dependencies = [
        ("channels_pool", "0002_channel_health_recent_success"),
    ]

    operations = [
        migrations.AlterField(
            model_name="channel",
            name="secret",
            field=models.TextField(help_text=HELP),
        ),
        migrations.RunPython(encrypt_secrets, decrypt_secrets),
        migrations.AlterField(
            model_name="channel",
            name="secret",
            field=core.encryption.EncryptedTextField(help_text=HELP, validators=[MaxLengthValidator(500)]),
        ),
    ]
