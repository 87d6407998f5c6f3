# The EDL controller's image: `edl-controller` (the kopf operator), serving /metrics and
# /healthz on port 8080. Build from the repository root:
#
#     docker build -t ghcr.io/edl-project/edl-controller:0.1.0 .
#
# manifests/base/deployment.yaml runs it as user 65532 with a read-only root filesystem;
# docs/deploy.md has the rest.

FROM python:3.11-slim AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY edl_scheduler ./edl_scheduler
# The gradient statistics' rule, shared by the planner and the runtime (edl_gradients).
COPY edl_gradients ./edl_gradients
# The controller speaks the runtime's coordinator protocol (trainer_runtime.protocol).
COPY trainer_runtime ./trainer_runtime
# Wheels of the project and of the `k8s` extra only: no torch, Paddle or simulator.
RUN pip wheel --wheel-dir /wheels '.[k8s]'

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels 'edl[k8s]' \
    && edl-controller --help >/dev/null
USER 65532:65532
EXPOSE 8080
ENTRYPOINT ["edl-controller"]
