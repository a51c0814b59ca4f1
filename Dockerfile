# syntax=docker/dockerfile:1
# The HopBase image: the gateway (`manage.py serve`), the Celery worker and
# beat all run from it (docker-compose.yml). Everything is installed here, at
# build time; nothing is installed when a container starts.
FROM python:3.11-slim-bookworm

ENV PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    HOPBASE_SPOOL_DIR=/app/var/spool

WORKDIR /app

# Dependencies first, so that a code change does not reinstall them; from the
# hash-pinned lock (bin/lock makes it), so a substituted package fails.
COPY requirements.lock ./
RUN pip install --require-hashes -r requirements.lock

COPY . .

# Bytecode compiled now: the code is read-only to the user that runs it.
# No collectstatic: Django's ASGIStaticFilesHandler (serving/handler.py) serves
# the admin's few static files straight from the installed apps.
# var/ (the request spool, HOPBASE_SPOOL_DIR) is the only place written to.
RUN python -m compileall -q manage.py hopbase serving gateway channels_pool billing providers tenants console core \
 && useradd --system --uid 10001 --home-dir /app --no-create-home --shell /usr/sbin/nologin hopbase \
 && mkdir -p var/spool \
 && chown -R hopbase:hopbase var

USER hopbase
EXPOSE 8000

# Liveness. docker-compose.yml checks the gateway's /readyz instead, and the
# worker and beat in their own ways (bin/healthcheck).
HEALTHCHECK --interval=10s --timeout=5s --start-period=60s --retries=3 \
    CMD ["python", "bin/healthcheck", "http", "http://127.0.0.1:8000/healthz"]

# serve passes SIGTERM on to its worker processes (uvicorn), which drain; give the
# container HOPBASE_DRAIN_TIMEOUT (30 s) + a few seconds before SIGKILL.
STOPSIGNAL SIGTERM
CMD ["python", "manage.py", "serve", "--host", "0.0.0.0", "--port", "8000"]
