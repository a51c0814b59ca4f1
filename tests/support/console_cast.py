"""The cast of the console's tests: alice owns tenant A, bob is a member of
A, charlie owns tenant B and must never see A's data. Emails are unique per
run, so login-failure counts in a shared cache never carry over."""

from __future__ import annotations

import itertools
import time
from dataclasses import dataclass

import pytest
from django.test import Client

from console.members import add_member
from console.models import TenantMembership
from tenants.models import Tenant
from tests.support.factories import make_tenant

PASSWORD = "correct horse battery staple 42"
_people = itertools.count(1)


def email(name: str) -> str:
    return f"{name}{next(_people)}-{time.monotonic_ns()}@example.com"


def person(tenant: Tenant, name: str, role: str) -> TenantMembership:
    return add_member(tenant, email(name), role, PASSWORD)


def signed_in(membership: TenantMembership, *, csrf_checks: bool = False) -> Client:
    client = Client(enforce_csrf_checks=csrf_checks)
    client.force_login(membership.user)
    return client


@dataclass
class Cast:
    tenant_a: Tenant
    tenant_b: Tenant
    alice: TenantMembership  # owner of A
    bob: TenantMembership  # member of A
    charlie: TenantMembership  # owner of B


def cast() -> Cast:
    a, b = make_tenant(), make_tenant()
    return Cast(a, b, person(a, "alice", "owner"), person(a, "bob", "member"), person(b, "charlie", "owner"))


@pytest.fixture(autouse=True)
def fast_passwords(settings):
    """Imported by each console test module: hashing at full cost is for production."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
