# The worker image: `tandem worker` (prefill, decode, colocated) on CUDA with torch; the router pods run
# `tandem router` from the same image. Build from the repository root:
#   docker build -f images/worker.Dockerfile -t tandem-worker:0.1.0 .
ARG CUDA_IMAGE=nvidia/cuda:12.8.1-cudnn-runtime-ubuntu24.04
FROM ${CUDA_IMAGE}
LABEL org.opencontainers.image.title="tandem-worker" \
      org.opencontainers.image.description="tandem prefill/decode workers and router (CUDA, torch)" \
      org.opencontainers.image.licenses="Apache-2.0"
ARG TORCH_INDEX=https://download.pytorch.org/whl/cu128
RUN apt-get update && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && python3 -m venv /opt/tandem
ENV PATH=/opt/tandem/bin:$PATH PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
# torch built for this CUDA first (the project's own range), then the project and its dependencies
# (huggingface_hub among them: `tandem fetch-model` is the operator's model-download init container).
RUN pip install --no-cache-dir --index-url "$TORCH_INDEX" "torch>=2.9,<3"
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tandem/ tandem/
COPY operator/ operator/
COPY worker/ worker/
COPY protos/ protos/
RUN pip install --no-cache-dir . && rm -rf /src
WORKDIR /
# uid/gid 1000: what the operator's rendered pods run as (runAsNonRoot, read-only root filesystem); the
# CUDA base's own uid-1000 user makes way for it.
RUN (userdel --remove ubuntu 2>/dev/null || true) \
 && groupadd --gid 1000 tandem && useradd --uid 1000 --gid 1000 --no-create-home --shell /usr/sbin/nologin tandem
USER 1000:1000
EXPOSE 8000 9090 50051
ENTRYPOINT ["tandem"]
CMD ["--help"]
