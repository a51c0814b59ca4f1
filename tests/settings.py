"""The settings of a test run: the production settings (hopbase.settings),
given the one value production must be handed, SECRET_KEY, when the
environment has none. Set in the environment, so that every gateway, worker
and command the tests start as a process (they inherit it) has it too."""

import os

os.environ.setdefault("SECRET_KEY", "hopbase-tests-only-not-a-secret-3e1f0c9a7b5d4e2f8a6c1b0d9e7f5a3c")

from hopbase.settings import *  # noqa: E402, F403
