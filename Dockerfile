# acp-proxy as a container image: a small, non-root image whose entrypoint is `acp-proxy`.
#
#   docker build -t acp-proxy .
#   docker run --rm acp-proxy                 # prints the help (the default CMD)
#   docker run --rm -i acp-proxy demo         # the embedded demo: bundled rules, scripted client
#                                             # and agent, no editor or real agent needed
#
# acp-proxy is a sidecar: it spawns the agent and sits on its stdio. Two ways to deploy it.
#
# 1. Same container: derive an image that also holds the agent, and start the proxy in front of
#    it. The editor (or whatever speaks ACP on the container's stdio) runs the container with -i:
#
#      FROM acp-proxy
#      USER root
#      RUN pip install --no-cache-dir my-agent      # or COPY the agent binary in
#      COPY rules.yaml /etc/acp-proxy/rules.yaml
#      USER 10001:10001
#      CMD ["--config", "/etc/acp-proxy/rules.yaml", "--", "my-agent", "--acp"]
#
#    which runs `acp-proxy --config /etc/acp-proxy/rules.yaml -- my-agent --acp`. The rules can
#    also be mounted at run time (-v ./rules.yaml:/etc/acp-proxy/rules.yaml:ro) or named by the
#    ACP_PROXY_CONFIG environment variable. Logs go to stderr (`docker logs`), never to stdout,
#    which carries the protocol.
#
# 2. Per-pod sidecar (Kubernetes, deploy/kubernetes.yaml): run this image in the client's pod,
#    listening on a Unix socket in a volume shared with the client's container:
#
#      args: ["--config", "/etc/acp-proxy/rules.yaml", "--listen", "unix:///run/acp/acp.sock",
#             "--metrics", "tcp://0.0.0.0:9464", "--metrics-allow-remote", "--", "my-agent", "--acp"]
#
#    /run/acp is created here and owned by the image's user, so a named volume or an emptyDir
#    mounted there is writable by it. The containers of a pod share the loopback interface, so
#    `--listen tcp://127.0.0.1:7777` works as well; never 0.0.0.0 for the ACP port unless
#    something in front authenticates (ACP carries no authentication; --allow-remote is
#    required for it). The metrics port above is bound on all interfaces (its own consent,
#    --metrics-allow-remote) so that a published port reaches it; it serves only metrics and
#    health.
#    The agent binary must be in this container (derive the image as in 1.); mount the rules
#    from a ConfigMap at /etc/acp-proxy/. The image runs as UID 10001, so
#    `securityContext: {runAsNonRoot: true}` works as is.
#
# Health: with `--metrics URL` on the command line, HEALTHCHECK asks URL/healthz (the probe,
# python -m acp_proxy.shell.telemetry.probe, reads the arguments of PID 1, or of PID 1's acp-proxy child
# under `docker run --init`); without --metrics there is nothing to ask and the check passes
# while the proxy's process is alive. ACP_PROXY_HEALTHCHECK_URL=tcp://127.0.0.1:9464 names the endpoint
# when `metrics:` is set in the config file instead.

# ---- build: install the project and its dependencies into /install (pip stays here) ----
# gcc (build stage only) compiles the optional C block scanner (acp_proxy/wire/raw/_scan.c, README
# "Dependencies"); the check after the install fails the build if it fell back to pure Python.
FROM python:3.11-slim AS build
RUN apt-get update \
    && apt-get install -y --no-install-recommends gcc libc6-dev \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /src
COPY pyproject.toml setup.py README.md ./
COPY acp_proxy ./acp_proxy
# With the otel extra, so that `tracing: {enabled: true}` works in the image (OTEL_* variables
# configure the exporter); the check fails the build without the C scanner or the tracing SDK.
RUN pip install --no-cache-dir --no-warn-script-location --prefix=/install '.[otel]' \
    && cd / && PYTHONPATH=/install/lib/python3.11/site-packages python -c \
       "from acp_proxy.wire.raw.block_scan import SCANNER; assert SCANNER == 'C', SCANNER; \
import opentelemetry.sdk.trace, opentelemetry.exporter.otlp.proto.http.trace_exporter"

# ---- runtime: the installed files only ----
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin acp \
    && mkdir -p /etc/acp-proxy /work /run/acp \
    && chown acp:acp /work /run/acp
WORKDIR /work
USER 10001:10001
# The metrics and health endpoints (--metrics), by convention on 9464 (Prometheus exporters).
EXPOSE 9464
HEALTHCHECK --interval=30s --timeout=5s --start-period=10s --retries=3 \
    CMD ["python", "-m", "acp_proxy.shell.telemetry.probe"]
ENTRYPOINT ["acp-proxy"]
CMD ["--help"]
