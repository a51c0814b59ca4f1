"""The admin log (Django's ``LogEntry``, read in the admin through
hopbase.audit) as the operator commands write it: a
change of money, keys, channels or staff made from a shell is in the same
trail, in the same shape, as one made in the admin.

The actor is the operating-system user running the command. A log entry
needs a Django user, so each OS login gets one, ``os:<login>``: the login of
the process's effective user id, from the password database (not ``$USER``,
which anyone can set), or ``os:uid-<N>`` where the id has none (some
containers). It is made on that login's first change, inactive, not staff,
with no usable password: it names who acted and can never sign in. No staff
user can take such a name: Django's username rule, which the admin and
``createstaff`` apply, refuses the colon. (Run through ``sudo -u``, the
login is the account the command ran as; sudo's own log says who ran it.)

Each row is written inside the change's own transaction, so a change never
lands without its row nor a row without its change, and a refused command
writes none. Messages say what changed the way the admin's do: Django's
structured messages ("Added.", "Added budget “…”.", "Changed Limit (USD)
and Webhook secret.") or an admin action's sentence ("Topped up 5 USD
(ledger entry #3)."). A secret field is named, never its value.
"""

from __future__ import annotations

import os
import pwd
from collections.abc import Sequence

from django.contrib.admin.models import ADDITION, CHANGE, DELETION, LogEntry
from django.contrib.auth import get_user_model
from django.contrib.auth.hashers import make_password
from django.contrib.auth.models import AbstractBaseUser
from django.db.models import Model

ACTOR_PREFIX = "os:"


def os_login() -> str:
    """The login of this process's effective user."""
    uid = os.geteuid()
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid-{uid}"


def actor() -> AbstractBaseUser:
    """The Django user standing for the OS user running this command, made
    (inactive, no usable password) the first time."""
    User = get_user_model()
    user, _ = User._default_manager.get_or_create(
        **{User.USERNAME_FIELD: ACTOR_PREFIX + os_login()},
        defaults={"is_active": False, "is_staff": False, "is_superuser": False, "password": make_password(None)},
    )
    return user


def added(obj: Model, with_it: Sequence[tuple[str, str]] = (), by: AbstractBaseUser | None = None) -> LogEntry:
    """``obj`` added, as the admin's add form logs it; ``with_it``: (what,
    which) made in the same change, as the admin logs an inline's rows."""
    message = [{"added": {}}] + [{"added": {"name": what, "object": which}} for what, which in with_it]
    return record(obj, ADDITION, message, by)


def changed(obj: Model, fields: Sequence[str], by: AbstractBaseUser | None = None) -> LogEntry:
    """These fields of ``obj`` changed (their labels, as the admin's change
    form names them): names only, never values."""
    return record(obj, CHANGE, [{"changed": {"fields": list(fields)}}] if fields else [], by)


def acted(objs: Sequence[Model], sentence: str, by: AbstractBaseUser | None = None) -> None:
    """What an admin action logs for each of ``objs``: one sentence, the same for each."""
    if objs:
        LogEntry.objects.log_actions((by or actor()).pk, objs, CHANGE, sentence)


def deleted(obj: Model, by: AbstractBaseUser | None = None) -> LogEntry:
    """``obj`` about to be deleted (so it still has its id), as the admin logs it."""
    return record(obj, DELETION, "", by)


def record(obj: Model, flag: int, message: str | list, by: AbstractBaseUser | None = None) -> LogEntry:
    return LogEntry.objects.log_actions((by or actor()).pk, [obj], flag, message, single_object=True)
