"""GPUPool settings, read from the environment (see portal/env.py).

Defaults form the embedded mode: SQLite under var/, Celery over a queue in a SQLite
file (portal/broker.py), a file-based cache; nothing to install. Production sets
DATABASE_URL (PostgreSQL), REDIS_URL (Celery broker and cache) and SECRET_KEY.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from portal.env import env_bool, env_choice, env_int, env_list, env_secret, env_str, env_url

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("GPUPOOL_VAR_DIR", str(BASE_DIR / "var")))
VAR_DIR.mkdir(parents=True, exist_ok=True)

DEBUG = env_bool("DEBUG", True)
SECRET_KEY = env_secret("SECRET_KEY")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured("SECRET_KEY must be set when DEBUG is off")
    SECRET_KEY = "gpupool-insecure-development-key-do-not-use-in-production"
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
# The links e-mailed with invitations start with it.
SITE_URL = (env_url("SITE_URL", ("http", "https")) or "http://127.0.0.1:8000").rstrip("/")
# Behind a TLS proxy the app may see http while browsers post from https://SITE_URL's host:
# trust that origin unless told otherwise, or every form would fail its CSRF check.
_site = urlsplit(SITE_URL)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [f"{_site.scheme}://{_site.netloc}"])
# HTTPS: production (DEBUG off) and a site served over https (SITE_URL) send the session and
# CSRF cookies over https only; a plain-http production deployment turns them off with
# SESSION_COOKIE_SECURE=0 CSRF_COOKIE_SECURE=0. Behind a TLS-terminating proxy, set
# GPUPOOL_BEHIND_TLS_PROXY=1 so that Django trusts its X-Forwarded-Proto header.
_https = _site.scheme == "https"
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", _https or not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", _https or not DEBUG)
SESSION_COOKIE_HTTPONLY = True
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
if env_bool("GPUPOOL_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if SECURE_SSL_REDIRECT and not _https:
    raise ImproperlyConfigured("SECURE_SSL_REDIRECT needs an https:// SITE_URL")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "rest_framework.authtoken",
    "drf_spectacular",
    "drf_spectacular_sidecar",
    "portal",
    "clusters",
    "clusters.metrics",
    "scheduling",
    "workspaces",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "portal.urls"
WSGI_APPLICATION = "portal.wsgi.application"
ASGI_APPLICATION = "portal.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "portal.context_processors.navigation",
            ],
        },
    },
]

# --- Database -------------------------------------------------------------------------------
DATABASE_URL = env_str("DATABASE_URL")
if DATABASE_URL:
    try:
        DATABASES = {"default": dj_database_url.parse(DATABASE_URL, conn_max_age=60)}
    except ValueError as exc:
        raise ImproperlyConfigured(f"DATABASE_URL is not a valid database URL: {exc}") from None
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.sqlite3",
            "NAME": VAR_DIR / "gpupool.sqlite3",
            # The web server, worker and beat share this file: wait for locks instead of
            # failing, and take the write lock up front so two writers never deadlock.
            "OPTIONS": {
                "timeout": 30,
                "transaction_mode": "IMMEDIATE",
                "init_command": "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL;",
            },
        }
    }
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
AUTH_USER_MODEL = "portal.User"

# --- Redis, cache, Celery ----------------------------------------------------------------------
REDIS_URL = env_url("REDIS_URL", ("redis", "rediss", "unix"))
if REDIS_URL:
    CACHES = {
        "default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}
    }
    CELERY_BROKER_URL = REDIS_URL
    CELERY_RESULT_BACKEND = REDIS_URL
    CELERY_BROKER_TRANSPORT_OPTIONS: dict[str, object] = {}
else:
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(VAR_DIR / "cache"),
        }
    }
    # Celery's embedded broker: portal/broker.py, a kombu transport on one SQLite file (WAL,
    # a 30 s busy timeout; a put is one INSERT, a take one UPDATE ... RETURNING, the ack a
    # DELETE; a killed worker's messages are delivered again), so no message is ever half
    # written, given to two consumers or dropped, and there is no server to install.
    # kombu's filesystem:// transport (used before) crashes the worker on a half-written
    # message (kombu issue 1551); its SQLAlchemy one drops a message on a locked write.
    # No result backend: nothing reads a task's result, and none is stored.
    CELERY_BROKER_URL = "gpupool-sqlite://localhost"  # the file is named below, not here
    CELERY_BROKER_TRANSPORT_OPTIONS = {"path": str(VAR_DIR / "celery-broker.sqlite3")}
    CELERY_RESULT_BACKEND = None
    CELERY_TASK_IGNORE_RESULT = True
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- GPUPool ---------------------------------------------------------------------------------
GPUPOOL_CYCLE_INTERVAL_S = env_int("GPUPOOL_CYCLE_INTERVAL_S", 10, minimum=1)
GPUPOOL_RECONCILE_INTERVAL_S = env_int("GPUPOOL_RECONCILE_INTERVAL_S", 5, minimum=1)
GPUPOOL_KUBECONFIG_KEY = env_secret("GPUPOOL_KUBECONFIG_KEY")
GPUPOOL_METRICS_TOKEN = env_secret("GPUPOOL_METRICS_TOKEN")
GPUPOOL_NODE_POOL_LABEL = env_str("GPUPOOL_NODE_POOL_LABEL", "gpupool.io/node-pool")

# --- Auth, e-mail ----------------------------------------------------------------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "home"
LOGOUT_REDIRECT_URL = "login"
EMAIL_BACKEND = env_str("EMAIL_BACKEND", "django.core.mail.backends.console.EmailBackend")
EMAIL_HOST = env_str("EMAIL_HOST", "localhost")
EMAIL_PORT = env_int("EMAIL_PORT", 25, minimum=1)
EMAIL_HOST_USER = env_str("EMAIL_HOST_USER")
EMAIL_HOST_PASSWORD = env_secret("EMAIL_HOST_PASSWORD")
EMAIL_USE_TLS = env_bool("EMAIL_USE_TLS", False)  # STARTTLS, usually port 587
EMAIL_USE_SSL = env_bool("EMAIL_USE_SSL", False)  # implicit TLS, usually port 465
if EMAIL_USE_TLS and EMAIL_USE_SSL:
    raise ImproperlyConfigured("Set EMAIL_USE_TLS or EMAIL_USE_SSL, not both")
DEFAULT_FROM_EMAIL = env_str("DEFAULT_FROM_EMAIL", "gpupool@localhost")

# --- REST API --------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "rest_framework.authentication.TokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "rest_framework.pagination.LimitOffsetPagination",
    "PAGE_SIZE": 100,
}
SPECTACULAR_SETTINGS = {
    "TITLE": "GPUPool API",
    "DESCRIPTION": "Pool GPUs across Kubernetes clusters and share them fairly among teams.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The schema and its docs page are for signed-in users (session or token) only.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
}

# --- Static files, i18n ----------------------------------------------------------------------
STATIC_URL = "/static/"
# The image collects them at build time outside var/, which a volume may cover at run time.
STATIC_ROOT = Path(env_str("GPUPOOL_STATIC_ROOT", str(VAR_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
# In development static files are served straight from their folders; production images
# run collectstatic at build time.
WHITENOISE_USE_FINDERS = DEBUG
STATICFILES_DIRS = [BASE_DIR / "static"]
try:  # plotly.js ships inside the plotly package: serve it locally, never from a CDN.
    import plotly

    STATICFILES_DIRS.append(("plotly", Path(plotly.__file__).parent / "package_data"))
except ImportError:  # pragma: no cover - plotly is a pinned requirement
    pass
LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL")
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"console": {"class": "logging.StreamHandler"}},
    "root": {"handlers": ["console"], "level": env_choice("LOG_LEVEL", "INFO", LOG_LEVELS)},
    # httpx logs every request at INFO: the workspace proxy would log each of Jupyter's.
    "loggers": {"django.db.backends": {"level": "WARNING"}, "httpx": {"level": "WARNING"}},
}
