"""The benchmark's processes: the children it starts (simulator, gateway, py-spy) and what /proc says of them."""

from __future__ import annotations

import collections
import contextlib
import ctypes
import os
import re
import resource
import secrets
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psycopg
import redis

ROOT = Path(__file__).resolve().parent.parent
CLK_TCK = os.sysconf("SC_CLK_TCK")
START_TIMEOUT = 60.0  # a child process becoming ready


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _die_with_parent() -> None:
    """In the child: get SIGTERM if the benchmark itself is killed outright."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class Child:
    def __init__(self, name: str, args: list[str], env: dict[str, str], logdir: Path, cwd: Path = ROOT,
                 pass_fds: tuple[int, ...] = ()) -> None:
        self.name = name
        self.args = args
        self.log_path = logdir / f"{name}.log"
        self._log = open(self.log_path, "wb")
        self.process = subprocess.Popen(
            args, cwd=cwd, env=env, stdout=self._log, stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL, start_new_session=True, preexec_fn=_die_with_parent, pass_fds=pass_fds,
        )
        self.pid = self.process.pid

    def wait_ready(self, url: str, within: float = START_TIMEOUT) -> None:
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.process.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(httpx.HTTPError):
                if httpx.get(url, timeout=5, trust_env=False).status_code == 200:
                    return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not answer {url} within {within:.0f} s:\n{self.log_tail()}")

    def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            return self.log_path.read_text(errors="replace")[-3000:]
        return ""

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)
        self._log.close()


_LIBC = ctypes.CDLL(None, use_errno=True)


def cpu_seconds(pid: int) -> float:
    """CPU time of every thread of a process, in seconds: from the kernel's
    clock for that process (to the nanosecond) where it gives one, else
    utime + stime from /proc (in ticks of 10 ms: 2-5 % of a round's CPU)."""
    clock = ctypes.c_int()
    if _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) == 0:
        with contextlib.suppress(OSError):
            return time.clock_gettime(clock.value)
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK_TCK


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def open_sockets(pid: int) -> int:
    count = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        with contextlib.suppress(OSError):
            count += os.readlink(f"/proc/{pid}/fd/{fd}").startswith("socket:")
    return count


def raise_fd_limit() -> tuple[int, int]:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and soft < hard:
        resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    return resource.getrlimit(resource.RLIMIT_NOFILE)


def gateway_env(database_url: str, **settings: str) -> dict[str, str]:
    """This process's environment for a gateway on the settings' defaults:
    embedded mode (no ``REDIS_URL``), none of the caller's ``HOPBASE_``
    settings, warnings only in its log, a secret key of the run's own unless
    one is set; then ``settings``."""
    env = {name: value for name, value in os.environ.items()
           if name not in ("REDIS_URL", "DJANGO_SETTINGS_MODULE") and not name.startswith("HOPBASE_")}
    env.update({"DATABASE_URL": database_url, "HOPBASE_LOG_LEVEL": "WARNING",
                "DJANGO_SETTINGS_MODULE": "hopbase.settings", "PYTHONUNBUFFERED": "1"})
    env.setdefault("SECRET_KEY", secrets.token_urlsafe(50))  # required
    env.update(settings)
    return env


def manage(args: list[str], env: dict[str, str], cwd: Path = ROOT) -> str:
    done = subprocess.run(
        [sys.executable, "manage.py", *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=300,
        stdin=subprocess.DEVNULL,
    )
    if done.returncode != 0:
        raise RuntimeError(f"manage.py {' '.join(args)} failed ({done.returncode}):\n{done.stdout}\n{done.stderr}")
    return done.stdout


# --------------------------------------------------------------------------- py-spy


class Profiler:
    def __init__(self, py_spy: str, pid: int, out: Path) -> None:
        self.out = out
        self.process = subprocess.Popen(
            [py_spy, "record", "--pid", str(pid), "--rate", "200", "--format", "raw", "--gil",
             "--output", str(out)],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )
        time.sleep(1.0)  # let it attach before the burst starts

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)  # py-spy writes its output on SIGINT
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(10)

    def report(self, top: int = 25) -> str:
        if not self.out.exists():
            return f"py-spy wrote nothing ({self.process.stderr.read().decode(errors='replace')[-500:] if self.process.stderr else ''})"
        own: collections.Counter = collections.Counter()
        inclusive: collections.Counter = collections.Counter()
        total = 0
        for line in self.out.read_text(errors="replace").splitlines():
            stack, _, count = line.rpartition(" ")
            if not stack or not count.isdigit():
                continue
            n = int(count)
            frames = [f for f in stack.split(";") if not f.startswith("process ") and not f.startswith("thread ")]
            if not frames:
                continue
            total += n
            own[_short(frames[-1])] += n
            for name in {_short(f) for f in frames}:
                inclusive[name] += n
        lines = [f"py-spy --gil: {total} samples of the gateway (whichever thread holds the GIL, so ~ its Python CPU) during the burst rounds; raw stacks in {self.out}",
                 "", "| self % | function |", "|---:|---|"]
        lines += [f"| {100 * n / total:.1f} | `{name}` |" for name, n in own.most_common(top)]
        lines += ["", "| inclusive % | function |", "|---:|---|"]
        lines += [f"| {100 * n / total:.1f} | `{name}` |" for name, n in inclusive.most_common(top * 2)]
        return "\n".join(lines)


def _short(frame: str) -> str:
    """'func (path/to/site-packages/pkg/mod.py:12)' -> 'func (pkg/mod.py:12)'."""
    frame = re.sub(r"\(.*?site-packages/", "(", frame)
    frame = frame.replace(str(ROOT) + "/", "")
    return re.sub(r":\d+\)$", ")", frame)  # group by function, not by line



# --------------------------------------------------------------------------- the production shape

PRODUCTION_POSTGRES = "postgres://postgres@127.0.0.1:5432"
PRODUCTION_REDIS = "redis://127.0.0.1:6379/15"  # emptied before and after the run


class ProductionStores:
    """A PostgreSQL database of the run's own (made, then dropped) and a Redis
    database emptied before and after: the stores ``serve`` runs on in
    docker-compose.yml, for ``bench/run.py --production-shape``."""

    def __init__(self, server: str = PRODUCTION_POSTGRES, redis_url: str = PRODUCTION_REDIS) -> None:
        self.server = server
        self.name = f"hopbase_bench_{os.getpid()}"
        self.database_url = f"{server}/{self.name}"
        self.redis_url = redis_url

    def make(self) -> ProductionStores:
        redis.Redis.from_url(self.redis_url).flushdb()  # first: nothing is made if Redis is not there
        with psycopg.connect(f"{self.server}/postgres", autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{self.name}"')
        return self

    def remove(self) -> None:
        """Best effort: a store gone by now must not hide the run's own outcome."""
        try:
            with psycopg.connect(f"{self.server}/postgres", autocommit=True) as connection:
                connection.execute(f'DROP DATABASE IF EXISTS "{self.name}" WITH (FORCE)')
        except psycopg.Error as error:
            print(f"could not drop the database {self.name}: {error}", file=sys.stderr)
        try:
            redis.Redis.from_url(self.redis_url).flushdb()
        except redis.RedisError as error:
            print(f"could not empty {self.redis_url}: {error}", file=sys.stderr)
