# syntax=docker/dockerfile:1
# Threadline and one project (its langgraph.json and code) in a small image that runs as a non-root user.
#
#   docker build -t threadline .                                    # the bundled example project
#   docker build -t my-agents --build-context project=../my-agents .   # your project (a folder with langgraph.json)
#
#   docker run -p 8000:8000 -v threadline-data:/var/lib/threadline -e THREADLINE_API_KEYS=me=<a long key> threadline
#
# The project's langgraph.json `dependencies` are installed as `langgraph build` installs them
# (deploy/docker/install_deps.py). The same image runs every role: `serve` (the default), `worker`, `migrate`.
ARG PYTHON_VERSION=3.12

# The project folder; replace it with `--build-context project=<folder>`.
FROM scratch AS project
COPY threadline/example/ /

FROM python:${PYTHON_VERSION}-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PYTHONDONTWRITEBYTECODE=1
RUN python -m venv /opt/threadline
ENV PATH=/opt/threadline/bin:$PATH
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY threadline ./threadline
# This checkout, whose own dependencies pyproject.toml bounds (no pin to add here).
# hadolint ignore=DL3013
RUN pip install ".[otel]"
COPY --from=project / /deps/project
COPY deploy/docker/install_deps.py /tmp/install_deps.py
RUN python /tmp/install_deps.py /deps/project/langgraph.json

FROM python:${PYTHON_VERSION}-slim
RUN groupadd --system --gid 10001 threadline \
 && useradd --system --uid 10001 --gid threadline --no-create-home --home-dir /nonexistent threadline \
 && mkdir -p /var/lib/threadline && chown threadline:threadline /var/lib/threadline
COPY --from=build /opt/threadline /opt/threadline
COPY --from=build /deps/project /deps/project
ENV PATH=/opt/threadline/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    THREADLINE_CONFIG=/deps/project/langgraph.json \
    THREADLINE_HOST=0.0.0.0 \
    THREADLINE_PORT=8000 \
    THREADLINE_LOG_FORMAT=json \
    THREADLINE_DATABASE_URL=sqlite:////var/lib/threadline/threadline.db
# The embedded database, when no PostgreSQL URL replaces the one above (one container, one volume).
VOLUME /var/lib/threadline
WORKDIR /deps/project
USER 10001:10001
EXPOSE 8000
# Liveness: /ok answers without credentials and without touching the database (readiness: /ok?check_db=1).
HEALTHCHECK --interval=10s --timeout=3s --start-period=30s --retries=3 \
  CMD ["python", "-c", "import os, urllib.request; urllib.request.urlopen('http://127.0.0.1:%s/ok' % os.environ.get('THREADLINE_PORT', '8000'), timeout=2)"]
ENTRYPOINT ["threadline"]
CMD ["serve"]
