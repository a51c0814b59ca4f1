"""The admin log written by the operator commands (core.audit): each command that changes money, keys, channels or staff
leaves one row, the admin's kind of row, in the change's own transaction,
by the operating-system user (a Django user ``os:<login>``, inactive, that
can never sign in), naming what changed and never a secret; a refused
command leaves none (and so does every refusal in tests/*/test_commands_*.py,
whose ``assert_refused`` counts log rows and users too)."""

from __future__ import annotations

import io
import os
import pwd

import pytest
from cryptography.fernet import Fernet
from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection

from billing.ledger import topped_up
from billing.models import Budget, LedgerEntry, ModelPrice
from channels_pool.models import Channel
from console.models import TenantMembership
from core import audit
from tenants.models import ApiKey, Tenant
from tests.support.command_checks import assert_refused, run
from tests.support.factories import make_channel, make_tenant

pytestmark = pytest.mark.django_db

CHANNEL_SECRET = "sk-audit-channel-secret-5b1d"
PASSWORD = "a staff password nobody guesses 93"
KEY_A, KEY_B = Fernet.generate_key().decode(), Fernet.generate_key().decode()


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def os_actor() -> str:
    return "os:" + pwd.getpwuid(os.geteuid()).pw_name


class Trail:
    """The admin log's rows from here on."""

    def __init__(self) -> None:
        self.before = set(LogEntry.objects.values_list("pk", flat=True))

    def new(self) -> list[LogEntry]:
        return list(LogEntry.objects.exclude(pk__in=self.before).select_related("user", "content_type").order_by("pk"))

    def one(self, model: type, obj_pk: int, flag: int) -> LogEntry:
        rows = self.new()
        assert len(rows) == 1, [(r.object_repr, r.change_message) for r in rows]
        row = rows[0]
        assert row.content_type == ContentType.objects.get_for_model(model)
        assert row.object_id == str(obj_pk)
        assert row.action_flag == flag
        assert row.user.get_username() == os_actor()
        assert not row.user.is_active and not row.user.is_staff and not row.user.has_usable_password()
        return row


def text_of(row: LogEntry) -> str:
    """Everything a row says, as stored and as shown."""
    return " ".join((row.object_repr, row.change_message, row.get_change_message()))


def assert_no_secret(*secrets: str) -> None:
    for row in LogEntry.objects.all():
        for secret in secrets:
            assert secret not in text_of(row), (secret, text_of(row))


# -- one row each, by the OS user, naming what changed ----------------------------------


def test_topup_logs_the_admins_own_top_up_row():
    tenant = make_tenant("acme")
    trail = Trail()
    run("topup", "acme", "12.5")
    row = trail.one(Tenant, tenant.pk, CHANGE)
    entry = LedgerEntry.objects.get(tenant=tenant)
    assert row.get_change_message() == topped_up(entry) == f"Topped up 12.50 USD (ledger entry #{entry.pk})."


@pytest.mark.parametrize("balance", [None, "10"])
def test_createtenant_logs_the_tenant_and_its_opening_balance(balance):
    trail = Trail()
    run("createtenant", "newco", *(["--balance", balance] if balance else []))
    tenant = Tenant.objects.get(name="newco")
    row = trail.one(Tenant, tenant.pk, ADDITION)
    if balance:
        entry = LedgerEntry.objects.get(tenant=tenant)
        assert row.get_change_message() == f"Added. Added ledger entry “#{entry.pk}: 10.00 USD opening balance”."
    else:
        assert row.get_change_message() == "Added."


def test_createapikey_logs_the_key_and_its_budget_never_the_secret():
    make_tenant("acme")
    trail = Trail()
    printed = run("createapikey", "acme", "--name", "ci", "--budget-usd", "10", "--budget-period", "1mo")
    secret = printed.splitlines()[-1]
    key = ApiKey.objects.get()
    row = trail.one(ApiKey, key.pk, ADDITION)
    assert row.object_repr == str(key)
    assert row.get_change_message() == f"Added. Added budget “{Budget.objects.get()}”."
    # The display prefix (shown everywhere) is all of the secret a row holds.
    assert_no_secret(secret, secret[: len(key.prefix) + 1], key.key_hash)


def test_addchannel_logs_the_channel_never_its_secret():
    trail = Trail()
    run("addchannel", "up-a", "--protocol", "openai", "--base-url", "http://upstream.example/v1",
        "--api-key", CHANNEL_SECRET, "--models", "gpt-a")
    channel = Channel.objects.get(name="up-a")
    row = trail.one(Channel, channel.pk, ADDITION)
    assert (row.object_repr, row.get_change_message()) == ("up-a", "Added.")
    assert_no_secret(CHANNEL_SECRET)


def test_setprice_logs_the_new_price_row():
    trail = Trail()
    run("setprice", "gpt-a", "--input", "1", "--output", "2")
    price = ModelPrice.objects.get(model="gpt-a")
    row = trail.one(ModelPrice, price.pk, ADDITION)
    assert (row.object_repr, row.get_change_message()) == (str(price), "Added.")


def test_createstaff_logs_the_user_and_role_never_the_password():
    trail = Trail()
    call_command("createstaff", "ann", "--role", "finance", "--password-stdin", stdin=io.StringIO(PASSWORD + "\n"),
                 stdout=io.StringIO())
    ann = get_user_model().objects.get(username="ann")
    row = trail.one(get_user_model(), ann.pk, ADDITION)
    assert (row.object_repr, row.get_change_message()) == ("ann", "Added. Added group “finance”.")
    assert_no_secret(PASSWORD)


def test_createtenantuser_logs_the_membership_never_the_password():
    make_tenant("acme")
    trail = Trail()
    call_command("createtenantuser", "acme", "Owner@Example.com", "--role", "owner", "--password-stdin",
                 stdin=io.StringIO(PASSWORD + "\n"), stdout=io.StringIO())
    membership = TenantMembership.objects.get()
    row = trail.one(TenantMembership, membership.pk, ADDITION)
    assert (row.object_repr, row.get_change_message()) == ("owner@example.com (owner of acme)", "Added.")
    assert_no_secret(PASSWORD)


def test_setbudget_logs_an_addition_the_fields_a_change_changed_and_a_deletion_never_the_webhook_secret():
    tenant = make_tenant("acme")
    trail = Trail()
    run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1mo")
    budget = Budget.objects.get()
    assert trail.one(Budget, budget.pk, ADDITION).get_change_message() == "Added."

    trail = Trail()
    run("setbudget", "--tenant", "acme", "--usd", "10", "--period", "1mo", "--alert-at", "80")
    assert trail.one(Budget, budget.pk, CHANGE).get_change_message() == "Changed Alert at (%)."

    trail = Trail()
    first = run("setbudget", "--tenant", "acme", "--usd", "20", "--period", "1mo",
                "--webhook", "https://hooks.example/budget").splitlines()[-1]
    row = trail.one(Budget, budget.pk, CHANGE)
    assert row.get_change_message() == "Changed Limit (USD), Webhook URL and Webhook secret."

    trail = Trail()  # the same URL again: a fresh secret, the only change
    second = run("setbudget", "--tenant", "acme", "--usd", "20", "--period", "1mo",
                 "--webhook", "https://hooks.example/budget").splitlines()[-1]
    assert trail.one(Budget, budget.pk, CHANGE).get_change_message() == "Changed Webhook secret."

    trail = Trail()
    run("setbudget", "--tenant", "acme", "--usd", "0", "--period", "1mo")
    row = trail.one(Budget, budget.pk, DELETION)
    assert row.object_repr == f"tenant {tenant.name} 1mo budget of 20 USD"
    assert not Budget.objects.exists()
    assert_no_secret(first, second)


def test_rotatekeys_logs_each_channel_whose_secret_it_encrypted_never_the_secret(settings):
    settings.HOPBASE_ENCRYPTION_KEYS = (KEY_B,)
    old = make_channel("old-key", secret=CHANNEL_SECRET)
    plain = make_channel("plaintext", secret="sk-plain")
    lost = make_channel("lost-key", secret="sk-lost")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE channels_pool_channel SET secret = %s WHERE id = %s", ["sk-plain", plain.pk])
        cursor.execute("UPDATE channels_pool_channel SET secret = %s WHERE id = %s",
                       [Fernet(Fernet.generate_key()).encrypt(b"sk-lost").decode(), lost.pk])
    settings.HOPBASE_ENCRYPTION_KEYS = (KEY_A, KEY_B)
    trail = Trail()
    with pytest.raises(Exception, match="lost-key"):
        run("rotatekeys")
    rows = {row.object_repr: row for row in trail.new()}
    # What it changed is logged (and committed); the channel it could not read is not.
    assert set(rows) == {"old-key", "plaintext"}
    assert rows["old-key"].get_change_message() == "Secret re-encrypted with the first key of HOPBASE_ENCRYPTION_KEYS."
    assert rows["plaintext"].get_change_message() == (
        "Secret, stored in plaintext, encrypted with the first key of HOPBASE_ENCRYPTION_KEYS.")
    assert {row.object_id for row in rows.values()} == {str(old.pk), str(plain.pk)}
    assert all(row.user.get_username() == os_actor() and row.action_flag == CHANGE for row in rows.values())
    assert_no_secret(CHANNEL_SECRET, "sk-plain", KEY_A, KEY_B)


def test_rotatekeys_derived_key_changes_nothing_and_logs_nothing():
    trail = Trail()
    run("rotatekeys", "--derived-key")
    assert trail.new() == []


# -- a refused command leaves no row ----------------------------------------------------


@pytest.mark.parametrize(
    ("args", "match"),
    [
        (["topup", "nobody", "5"], "unknown tenant"),
        (["topup", "acme", "0"], "more than zero"),
        (["createtenant", "acme"], "already exists"),
        (["createapikey", "nobody"], "unknown tenant"),
        (["createapikey", "acme", "--budget-usd", "10"], "--budget-period"),
        (["addchannel", "up-b", "--protocol", "nope", "--base-url", "http://x", "--models", "m"], "--protocol"),
        (["setprice", "gpt-a", "--input", "-1", "--output", "1"], "--input"),
        (["setbudget", "--tenant", "acme", "--usd", "0", "--period", "1d"], "no 1d budget"),
        (["setbudget", "--tenant", "acme", "--usd", "5", "--period", "fortnight"], "--period"),
        (["createstaff", "ann", "--role", "janitor", "--password-stdin"], "--role"),
        (["createtenantuser", "acme", "a@example.com", "--role", "janitor", "--password-stdin"], "--role"),
    ],
)
def test_a_refused_command_leaves_no_row(args, match):
    make_tenant("acme")
    assert_refused(*args, match=match)  # counts log rows and users too
    assert not LogEntry.objects.exists()


def test_rotatekeys_that_can_read_nothing_logs_nothing(settings):
    lost = make_channel("lost-key")
    with connection.cursor() as cursor:
        cursor.execute("UPDATE channels_pool_channel SET secret = %s WHERE id = %s",
                       [Fernet(Fernet.generate_key()).encrypt(b"sk-lost").decode(), lost.pk])
    with pytest.raises(Exception, match="lost-key"):
        run("rotatekeys")
    assert not LogEntry.objects.exists()


# -- the actor ------------------------------------------------------------------------


def test_the_actor_is_the_os_user_from_the_password_database_not_the_environment(monkeypatch):
    monkeypatch.setenv("USER", "mallory")
    monkeypatch.setenv("LOGNAME", "mallory")
    make_tenant("acme")
    run("topup", "acme", "1")
    run("topup", "acme", "2")
    assert {row.user.get_username() for row in LogEntry.objects.select_related("user")} == {os_actor()}
    assert get_user_model().objects.filter(username__startswith=audit.ACTOR_PREFIX).count() == 1  # made once


def test_a_user_id_with_no_login_is_named_by_its_number(monkeypatch):
    def unknown(uid: int):
        raise KeyError(uid)

    monkeypatch.setattr(audit.pwd, "getpwuid", unknown)
    make_tenant("acme")
    run("topup", "acme", "1")
    assert LogEntry.objects.get().user.get_username() == f"os:uid-{os.geteuid()}"


def test_no_staff_user_can_take_an_actors_name():
    assert_refused("createstaff", os_actor(), "--role", "operator", "--password-stdin", match="username")


def test_a_change_whose_row_cannot_be_written_is_not_made(monkeypatch):
    """The row is written in the change's own transaction."""
    make_tenant("acme")

    def failing(*args, **kwargs):
        raise RuntimeError("the log could not be written")

    monkeypatch.setattr(audit.LogEntry.objects, "log_actions", failing)
    with pytest.raises(RuntimeError):
        run("topup", "acme", "5")
    assert not LedgerEntry.objects.exists()
    assert Tenant.objects.get(name="acme").balance_usd == 0
