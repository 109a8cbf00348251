# FisherAtlas GPU worker: CUDA base and torch's CUDA build. Same command as the documented one: `fisher-atlas worker`.
# No faiss-gpu: a worker builds no index (the API replicas search; `FISHER_ATLAS_INDEX_GPU` is for an embedded
# `serve` on a GPU machine, with the `gpu` extra).
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
RUN pip install "torch==2.13.0"
COPY pyproject.toml README.md alembic.ini LICENSE THIRD_PARTY_NOTICES.md ./
COPY fishersketch ./fishersketch
COPY atlas ./atlas
COPY workers ./workers
COPY service ./service
COPY fisher_atlas ./fisher_atlas
COPY migrations ./migrations
RUN pip install ".[scale]"
CMD ["fisher-atlas", "worker"]
