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
# 2. Per-pod sidecar (Kubernetes): run this image in the agent's pod, listening on a socket,
#    and let the client connect to it (socket listeners come with the --listen option):
#
#      args: ["--config", "/etc/acp-proxy/rules.yaml",
#             "--listen", "tcp://0.0.0.0:7777", "--allow-remote", "--", "my-agent", "--acp"]
#
#    --allow-remote is required to listen on a non-loopback address: ACP carries no
#    authentication, so expose the port only inside the pod network or behind an authenticating
#    proxy. The agent binary must be in this container (derive the image as in 1.); mount the
#    rules from a ConfigMap at /etc/acp-proxy/. The image runs as UID 10001, so
#    `securityContext: {runAsNonRoot: true}` works as is.

# ---- build: install the project and its dependencies into /install (pip stays here) ----
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY acp_proxy ./acp_proxy
RUN pip install --no-cache-dir --no-warn-script-location --prefix=/install .

# ---- runtime: the installed files only ----
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
COPY --from=build /install /usr/local
RUN useradd --uid 10001 --user-group --no-create-home --shell /usr/sbin/nologin acp \
    && mkdir -p /etc/acp-proxy /work \
    && chown acp:acp /work
WORKDIR /work
USER 10001:10001
ENTRYPOINT ["acp-proxy"]
CMD ["--help"]
