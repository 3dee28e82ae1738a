#!/bin/sh
# The container's entry point:
#   web                  migrate (unless GPUPOOL_MIGRATE_ON_START=0), then uvicorn
#   webhook              uvicorn over HTTPS on 8443 with the pod webhook's certificate
#                        (deploy/webhook/; the Secret mounted at /var/run/gpupool-webhook)
#   worker | beat        Celery (WORKER_CONCURRENCY: worker processes, default one per CPU)
#   migrate              apply the migrations and exit (the Kubernetes Job)
#   wait-for-migrations  return once the database is reachable and fully migrated
#                        (the init container of the portal, worker and beat on Kubernetes)
#   anything else        run as given, e.g. `python -m clusters.agent ...`
set -e
case "$1" in
  web)
    if [ "${GPUPOOL_MIGRATE_ON_START:-1}" != 0 ]; then
      python manage.py migrate --noinput
    fi
    exec uvicorn portal.asgi:application --host 0.0.0.0 --port "${PORT:-8000}" \
      --workers "${WEB_WORKERS:-2}" --proxy-headers
    ;;
  webhook)
    tls="${GPUPOOL_WEBHOOK_TLS_DIR:-/var/run/gpupool-webhook}"
    exec uvicorn portal.asgi:application --host 0.0.0.0 --port "${WEBHOOK_PORT:-8443}" \
      --workers "${WEB_WORKERS:-2}" --ssl-keyfile "$tls/tls.key" --ssl-certfile "$tls/tls.crt"
    ;;
  worker) exec celery -A portal worker --loglevel "${LOG_LEVEL:-INFO}" \
      ${WORKER_CONCURRENCY:+--concurrency "$WORKER_CONCURRENCY"} ;;
  beat) exec celery -A portal beat --loglevel "${LOG_LEVEL:-INFO}" \
      --schedule "${GPUPOOL_VAR_DIR:-/var/lib/gpupool}/celerybeat-schedule" ;;
  migrate) exec python manage.py migrate --noinput ;;
  wait-for-migrations)
    # `migrate --check` fails while a migration is unapplied or the database is away.
    until python manage.py migrate --check --noinput >/dev/null; do
      echo "waiting for the database and its migrations"
      sleep 5
    done
    ;;
  *) exec "$@" ;;
esac
