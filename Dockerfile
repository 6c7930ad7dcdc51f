FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1
WORKDIR /app
COPY pyproject.toml README.md alembic.ini ./
COPY faultline ./faultline
COPY agents ./agents
COPY service ./service
COPY ml ./ml
COPY migrations ./migrations
# The product only: the lab (lab/: simulator, evaluation, benchmarks, demo) stays out of the image.
RUN pip install '.[server,kubernetes]' && useradd --system --uid 10001 faultline
USER faultline
EXPOSE 8080
CMD ["faultline", "serve", "--host", "0.0.0.0", "--port", "8080"]
