#!/bin/sh
# The container's entry point: web | worker | beat | migrate | any other command.
set -e
case "$1" in
  web)
    python manage.py migrate --noinput
    exec uvicorn portal.asgi:application --host 0.0.0.0 --port "${PORT:-8000}" \
      --workers "${WEB_WORKERS:-2}" --proxy-headers
    ;;
  worker) exec celery -A portal worker --loglevel "${LOG_LEVEL:-INFO}" ;;
  beat) exec celery -A portal beat --loglevel "${LOG_LEVEL:-INFO}" \
      --schedule /var/lib/gpupool/celerybeat-schedule ;;
  migrate) exec python manage.py migrate --noinput ;;
  *) exec "$@" ;;
esac
