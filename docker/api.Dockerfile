# FisherAtlas API (CPU). Same command as the documented non-docker one: `fisher-atlas serve`.
FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 HF_HUB_OFFLINE=1
WORKDIR /app
# CPU build of torch first, so that the package's torch range is already satisfied.
ARG TORCH_INDEX_URL=https://download.pytorch.org/whl/cpu
RUN pip install "torch==2.13.0" --index-url "$TORCH_INDEX_URL"
COPY pyproject.toml README.md alembic.ini LICENSE THIRD_PARTY_NOTICES.md ./
COPY fishersketch ./fishersketch
COPY atlas ./atlas
COPY workers ./workers
COPY service ./service
COPY fisher_atlas ./fisher_atlas
COPY migrations ./migrations
RUN pip install ".[scale]"
EXPOSE 8000
CMD ["fisher-atlas", "serve", "--host", "0.0.0.0", "--port", "8000"]
