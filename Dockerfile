# One image for every process: `web` (uvicorn, ASGI), `worker` and `beat` (Celery).
#   docker run -e DATABASE_URL=... -e REDIS_URL=... -e SECRET_KEY=... \
#       -e ALLOWED_HOSTS=gpupool.example.org -e SITE_URL=https://gpupool.example.org gpupool web
#   docker run ...the same environment... gpupool worker   (and: gpupool beat)
# On Kubernetes: deploy/ and docs/deploy.md. The user is numeric so that a pod's
# runAsNonRoot can be checked against the image.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1 DEBUG=0 GPUPOOL_VAR_DIR=/var/lib/gpupool \
    GPUPOOL_STATIC_ROOT=/app/staticfiles GPUPOOL_STATIC_COLLECTED=1
WORKDIR /app

COPY requirements.txt ./
RUN pip install --no-cache-dir -r requirements.txt

COPY . .
RUN pip install --no-cache-dir --no-deps -e . \
    && SECRET_KEY=build-only python manage.py collectstatic --noinput \
    && groupadd --system --gid 10001 gpupool \
    && useradd --system --uid 10001 --gid 10001 --home /var/lib/gpupool --create-home gpupool \
    && chown -R 10001:10001 /var/lib/gpupool

USER 10001:10001
EXPOSE 8000
ENTRYPOINT ["scripts/docker-entrypoint.sh"]
CMD ["web"]
