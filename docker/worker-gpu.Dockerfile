# FisherAtlas GPU worker: CUDA base, faiss-gpu. Same command as the documented one: `fisher-atlas worker`.
FROM nvidia/cuda:12.4.1-cudnn-runtime-ubuntu22.04
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DEBIAN_FRONTEND=noninteractive
RUN apt-get update && apt-get install -y --no-install-recommends python3.11 python3.11-venv python3-pip \
    && rm -rf /var/lib/apt/lists/* && python3.11 -m venv /opt/venv
ENV PATH=/opt/venv/bin:$PATH
WORKDIR /app
RUN pip install "torch==2.13.0"
COPY pyproject.toml README.md alembic.ini ./
COPY fishersketch ./fishersketch
COPY atlas ./atlas
COPY workers ./workers
COPY service ./service
COPY fisher_atlas ./fisher_atlas
COPY migrations ./migrations
# faiss-cpu (a base dependency) and faiss-gpu both install the `faiss` module: whichever went in last owned its
# files. Remove both, then put the GPU build back alone.
RUN pip install ".[scale,gpu]" && pip uninstall -y faiss-cpu faiss-gpu && pip install --no-deps "faiss-gpu>=1.8,<2"
CMD ["fisher-atlas", "worker"]
