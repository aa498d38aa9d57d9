# The image of the pool service, the node agent and the reclaimer (one image, three commands),
# built from the project's wheel:
#
#   docker build -t ghcr.io/jupyterhub-gpupool/jupyterhub-gpupool:0.1.0.dev0 .
#
# The Helm chart (helm/jupyterhub-gpupool) runs it as user 1000 with a read-only root file
# system; its default image is this one (pool.image, agent.image, reclaimer.image).

# -- build the wheel ------------------------------------------------------------------------
FROM python:3.12-slim AS wheel
WORKDIR /src
COPY . .
RUN pip install --no-cache-dir build \
 && python -m build --wheel --outdir /wheels

# -- the image ------------------------------------------------------------------------------
FROM python:3.12-slim
LABEL org.opencontainers.image.title="jupyterhub-gpupool" \
      org.opencontainers.image.description="GPU pool service, node agent and reclaimer for JupyterHub" \
      org.opencontainers.image.source="https://github.com/jupyterhub-gpupool/jupyterhub-gpupool" \
      org.opencontainers.image.licenses="BSD-3-Clause"
# postgres: psycopg for PostgreSQL; nvml: nvidia-ml-py for the agent (the driver's
# libnvidia-ml comes from the node through the NVIDIA container runtime); kubelet: grpcio for
# the agent's reads of the kubelet's PodResources API (agent.podResources)
COPY --from=wheel /wheels /wheels
RUN pip install --no-cache-dir "$(ls /wheels/jupyterhub_gpupool-*.whl)[postgres,nvml,kubelet]" \
 && rm -rf /wheels \
 && useradd --uid 1000 --user-group --no-create-home --home-dir /tmp gpupool
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1
WORKDIR /tmp
USER 1000:1000
EXPOSE 10101
ENTRYPOINT []
CMD ["jupyterhub-gpupool", "service", "--ip=0.0.0.0", "--port=10101"]
