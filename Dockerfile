# tierpoint service image: `tierpoint api`, `tierpoint worker [--node N]`, `tierpoint migrate`.
# Built with uv from the committed lock file. (Not built on the project's build machines, which
# have no Docker engine; kept deliberately plain.)
FROM python:3.11-slim AS build
# Pinned so that an image built later resolves the lock file the same way.
RUN pip install --no-cache-dir uv==0.13.9
ENV UV_COMPILE_BYTECODE=1 \
    UV_LINK_MODE=copy \
    UV_PYTHON_DOWNLOADS=never \
    UV_PROJECT_ENVIRONMENT=/app/.venv
WORKDIR /app
# Dependencies first (cached while only the code changes); the client is a path dependency.
COPY pyproject.toml uv.lock README.md ./
COPY client ./client
# The runtime set only: no development tools (--no-dev) and not the `dev` extra's servers.
RUN uv sync --frozen --no-dev --no-install-project
COPY tierpoint ./tierpoint
COPY api ./api
COPY apps ./apps
COPY workflows ./workflows
COPY activities ./activities
COPY migrations ./migrations
RUN uv sync --frozen --no-dev

FROM python:3.11-slim
RUN groupadd --system --gid 10001 tierpoint \
    && useradd --system --uid 10001 --gid 10001 --home /app tierpoint \
    # Mount points of the tiers in docker-compose.yml: named volumes take this ownership.
    && mkdir -p /mnt/ssd/node-1 /mnt/lustre && chown -R tierpoint /mnt/ssd /mnt/lustre
COPY --from=build /app /app
WORKDIR /app
ENV PATH=/app/.venv/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    TIERPOINT_LOG_JSON=true
# Numeric, so that Kubernetes' runAsNonRoot can verify it without reading /etc/passwd.
USER 10001:10001
EXPOSE 8080
ENTRYPOINT ["tierpoint"]
CMD ["api", "--host", "0.0.0.0"]
