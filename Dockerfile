# dpproxy: the PostgreSQL-fronting DP proxy. Build: docker build -t dpproxy .
# Run against your PostgreSQL with a config.yaml that has a backend section (docs/deploy.md):
#   docker run -v $PWD/config.yaml:/etc/dpproxy/config.yaml -p 6432:6432 dpproxy
FROM python:3.11-slim

RUN pip install --no-cache-dir uv==0.* \
    && useradd --create-home --uid 1000 dpproxy
WORKDIR /app
COPY pyproject.toml uv.lock README.md ./
COPY proxy ./proxy
COPY sqlmap ./sqlmap
COPY config.yaml ./
RUN uv sync --frozen --no-dev && chown -R dpproxy /app

USER dpproxy
ENV PATH=/app/.venv/bin:$PATH \
    DPPROXY_CONFIG=/etc/dpproxy/config.yaml \
    PYTHONUNBUFFERED=1
EXPOSE 6432
# dpproxy stops in stages on SIGTERM (docker stop): idle sessions first, then running ones
STOPSIGNAL SIGTERM
ENTRYPOINT ["dpproxy"]
CMD ["serve", "--host", "0.0.0.0"]
