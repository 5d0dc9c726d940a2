# One image for both tessera components: `tessera kubelet-plugin` (DaemonSet) and
# `tessera controller` (Deployment). Build from the repository root:
#   docker build -t tessera:0.1.0 .
#
# Stage 1 installs the project and its dependencies into a virtual environment; stage 2 copies
# only that environment onto a clean base, so no pip, build cache or sources ship.

ARG PYTHON_IMAGE=python:3.11-slim-bookworm

FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN python -m venv /opt/tessera
WORKDIR /src
# Metadata first: the dependency layer is rebuilt only when pyproject.toml changes.
COPY pyproject.toml README.md ./
COPY driver/ driver/
COPY kubeletplugin/ kubeletplugin/
COPY controller/ controller/
COPY proto/ proto/
COPY tessera/ tessera/
# Non-editable install; pip byte-compiles everything now, so nothing is written at run time on
# the read-only root filesystem the chart sets.
RUN /opt/tessera/bin/pip install . \
 && /opt/tessera/bin/tessera --help > /dev/null

FROM ${PYTHON_IMAGE}
LABEL org.opencontainers.image.title="tessera" \
      org.opencontainers.image.description="Kubernetes DRA driver for NVIDIA GPUs (kubelet plugin and admission webhook)" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /opt/tessera /opt/tessera
ENV PATH=/opt/tessera/bin:$PATH \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
# Non-root by default (the controller needs nothing more). The kubelet plugin's pod spec sets
# runAsUser 0 because it writes kubelet's and the container runtime's root-owned host directories.
USER 65532:65532
ENTRYPOINT ["tessera"]
CMD ["--help"]
