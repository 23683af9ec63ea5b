# The operator image: `tandem operator` (kopf, the Kubernetes client) and `tandem top`, without torch.
# Build from the repository root:  docker build -f images/operator.Dockerfile -t tandem-operator:0.1.0 .
FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY tandem/ tandem/
COPY operator/ operator/
COPY worker/ worker/
COPY protos/ protos/
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
LABEL org.opencontainers.image.title="tandem-operator" \
      org.opencontainers.image.description="The tandem Kubernetes operator" \
      org.opencontainers.image.licenses="Apache-2.0"
# The project without its declared dependencies (torch is the data plane's), then what the operator's
# modules import, with the ranges pyproject.toml declares (a test keeps the two in step).
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir --no-deps /wheels/*.whl && rm -rf /wheels \
 && pip install --no-cache-dir \
      "kopf>=1.37,<2" "kubernetes>=30,<36" "pydantic>=2.7,<3" "PyYAML>=6,<7" "httpx>=0.27,<1" \
      "rich>=13,<16" "prometheus-client>=0.20,<1" "urllib3>=1.26,<3" "cryptography>=42" "numpy>=1.26,<3"
# uid/gid 1000: what the chart's pod securityContext runs as (runAsNonRoot, read-only root filesystem)
RUN groupadd --gid 1000 tandem && useradd --uid 1000 --gid 1000 --no-create-home --shell /usr/sbin/nologin tandem
USER 1000:1000
ENV PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1 HOME=/tmp
ENTRYPOINT ["tandem"]
CMD ["operator"]
