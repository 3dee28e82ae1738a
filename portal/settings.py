"""GPUPool settings, read from the environment (see portal/env.py).

Defaults form the embedded mode: SQLite under var/, Celery over a queue in a SQLite
file (portal/broker.py), a file-based cache; nothing to install. Production sets
DATABASE_URL (PostgreSQL), REDIS_URL (Celery broker and cache) and SECRET_KEY.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import stat
import tempfile
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

from portal.env import env_bool, env_choice, env_int, env_list, env_secret, env_str, env_url
from portal.sso_mapping import parse_group_roles
from workspaces import ports_origin

BASE_DIR = Path(__file__).resolve().parent.parent
VAR_DIR = Path(env_str("GPUPOOL_VAR_DIR", str(BASE_DIR / "var")))


def _private(path: Path, *, folder: bool = False) -> Path:
    """var/ and its database files are for their owner alone: made 0700 (a folder) or 0600
    (an empty file, which SQLite takes as an empty database and whose mode it gives its
    -wal and -shm files). One that exists loses only the bits of other users: its group
    may be the web process's, when a root worker runs the local cluster (clusters/README.md)."""
    if folder:
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
    else:
        with contextlib.suppress(FileExistsError):
            os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    found = path.stat()
    if found.st_uid == os.getuid() and found.st_mode & 0o007:
        path.chmod(stat.S_IMODE(found.st_mode) & ~0o007)
    return path


_private(VAR_DIR, folder=True)

# Off unless set: `make demo` and development turn it on (DEBUG=1). Even then, only staff see
# Django's technical error pages; everyone else gets the styled ones (portal/errors.py).
DEBUG = env_bool("DEBUG", False)


def _secret_key_kept_in(path: Path) -> str:
    """A random key made once and kept (mode 0600) for every process sharing VAR_DIR.

    Written to a private temporary file and linked into place, so that the web server,
    worker and beat starting together all read the same, complete key.
    """
    if not path.exists():
        fd, temporary = tempfile.mkstemp(dir=path.parent)  # created with mode 0600
        with os.fdopen(fd, "w") as file:
            file.write(secrets.token_urlsafe(50))
        try:
            os.link(temporary, path)
        except FileExistsError:
            pass  # another process won the race: use its key
        finally:
            os.unlink(temporary)
    return path.read_text().strip()


# Never a well-known key: without SECRET_KEY (or SECRET_KEY_FILE) each installation makes its own.
SECRET_KEY = env_secret("SECRET_KEY") or _secret_key_kept_in(VAR_DIR / "secret_key")
ALLOWED_HOSTS = env_list("ALLOWED_HOSTS", ["localhost", "127.0.0.1", "[::1]", "testserver"])
# The links e-mailed with invitations start with it.
SITE_URL = (env_url("SITE_URL", ("http", "https")) or "http://127.0.0.1:8000").rstrip("/")
# Behind a TLS proxy the app may see http while browsers post from https://SITE_URL's host:
# trust that origin unless told otherwise, or every form would fail its CSRF check.
_site = urlsplit(SITE_URL)
CSRF_TRUSTED_ORIGINS = env_list("CSRF_TRUSTED_ORIGINS", [f"{_site.scheme}://{_site.netloc}"])
# Users' HTTP ports on an origin apart from the portal's: ":8001" (this host, another port)
# or an origin of their own; unset, they are served sandboxed (workspaces/ports_origin.py).
PORTS_ORIGIN = env_str("GPUPOOL_PORTS_ORIGIN", "")
ports_origin.parse(PORTS_ORIGIN)  # a wrong value stops the start, saying what to give
# HTTPS: production (DEBUG off) and a site served over https (SITE_URL) send the session and
# CSRF cookies over https only; a plain-http production deployment turns them off with
# SESSION_COOKIE_SECURE=0 CSRF_COOKIE_SECURE=0. Behind a TLS-terminating proxy, set
# GPUPOOL_BEHIND_TLS_PROXY=1 so that Django trusts its X-Forwarded-Proto header.
_https = _site.scheme == "https"
SESSION_COOKIE_SECURE = env_bool("SESSION_COOKIE_SECURE", _https or not DEBUG)
CSRF_COOKIE_SECURE = env_bool("CSRF_COOKIE_SECURE", _https or not DEBUG)
SESSION_COOKIE_HTTPONLY = True
# Set to the parent domain (".example.com") when users' ports have a host of their own
# (GPUPOOL_PORTS_ORIGIN): the proxy there must see who asks. The CSRF cookie stays the portal's.
SESSION_COOKIE_DOMAIN = env_str("SESSION_COOKIE_DOMAIN", "") or None
SESSION_COOKIE_SAMESITE = "Lax"
SECURE_SSL_REDIRECT = env_bool("SECURE_SSL_REDIRECT", False)
SECURE_HSTS_SECONDS = env_int("SECURE_HSTS_SECONDS", 0, minimum=0)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("SECURE_HSTS_INCLUDE_SUBDOMAINS", False)
if env_bool("GPUPOOL_BEHIND_TLS_PROXY", False):
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")
if SECURE_SSL_REDIRECT and not _https:
    raise ImproperlyConfigured("SECURE_SSL_REDIRECT needs an https:// SITE_URL")

INSTALLED_APPS = [
    "portal.admin_config.PortalAdminConfig",  # django.contrib.admin, for platform admins
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django.contrib.humanize",
    "rest_framework",
    "knox",
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
    "portal.errors.StyledErrorsUnderDebugMiddleware",
    "portal.api_schema.EnforceSchemaEnumsMiddleware",
    "portal.middleware.RefuseNullCharactersMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "portal.urls"
CSRF_FAILURE_VIEW = "portal.errors.csrf_failure"
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
            "NAME": _private(VAR_DIR / "gpupool.sqlite3"),
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
    CELERY_BROKER_TRANSPORT_OPTIONS = {"path": str(_private(VAR_DIR / "celery-broker.sqlite3"))}
    CELERY_RESULT_BACKEND = None
    CELERY_TASK_IGNORE_RESULT = True
# Sign-in attempt counts (portal/throttles.py), apart so that tests can give each their own.
CACHES["sign-in"] = {**CACHES["default"], "KEY_PREFIX": "sign-in"}
CELERY_TASK_ALWAYS_EAGER = env_bool("CELERY_TASK_ALWAYS_EAGER", False)
CELERY_TASK_EAGER_PROPAGATES = True
CELERY_TASK_ACKS_LATE = True
# A task whose pool child was killed (SIGKILL, the OOM killer) goes back to its queue and
# runs again, instead of being acked as failed; the embedded broker sets aside one put
# back too often (portal/broker.py, MAX_RESTORES), so a task that kills its child each
# time cannot loop for good.
CELERY_TASK_REJECT_ON_WORKER_LOST = True
CELERY_WORKER_PREFETCH_MULTIPLIER = 1
CELERY_TIMEZONE = "UTC"
# The cycle's own queue (portal/celery.py): a worker started without -Q consumes both.
CELERY_TASK_DEFAULT_QUEUE = "celery"
CELERY_TASK_QUEUES = {"celery": {}, "cycle": {}}
CELERY_TASK_ROUTES = {"scheduling.tasks.run_cycle": {"queue": "cycle"}}
CELERY_BEAT_SCHEDULE_FILENAME = str(VAR_DIR / "celerybeat-schedule")

# --- GPUPool ---------------------------------------------------------------------------------
GPUPOOL_CYCLE_INTERVAL_S = env_int("GPUPOOL_CYCLE_INTERVAL_S", 10, minimum=1)
GPUPOOL_RECONCILE_INTERVAL_S = env_int("GPUPOOL_RECONCILE_INTERVAL_S", 5, minimum=1)
# Reconcile passes compare and act on what changed; every this often (per cluster) one is a
# full pass that rebuilds every pod's spec, the safety net (clusters.reconcile). 0: always.
GPUPOOL_RECONCILE_FULL_EVERY_S = env_int("GPUPOOL_RECONCILE_FULL_EVERY_S", 600, minimum=0)
GPUPOOL_KUBECONFIG_KEY = env_secret("GPUPOOL_KUBECONFIG_KEY")
GPUPOOL_METRICS_TOKEN = env_secret("GPUPOOL_METRICS_TOKEN")
GPUPOOL_NODE_POOL_LABEL = env_str("GPUPOOL_NODE_POOL_LABEL", "gpupool.io/node-pool")
# What `gpupool submit -f` and the "From YAML" form may create, as "apiVersion kind": the
# platform admin's ceiling; each project allows some of these (Project.manifest_kinds,
# Pod and Job by default). The default is every kind GPUPool can create
# (clusters/manifest_kinds.py; tests/clusters/test_manifest_kinds.py keeps the two equal).
GPUPOOL_MANIFEST_KINDS = env_list(
    "GPUPOOL_MANIFEST_KINDS",
    [
        "v1 Pod",
        "batch/v1 Job",
        "batch/v1 CronJob",
        "apps/v1 Deployment",
        "apps/v1 StatefulSet",
        "jobset.x-k8s.io/v1alpha2 JobSet",
        "kubeflow.org/v1 PyTorchJob",
        "kubeflow.org/v1 MPIJob",
        "kubeflow.org/v1 TFJob",
        "kubeflow.org/v1 XGBoostJob",
        "kubeflow.org/v1 JAXJob",
        "ray.io/v1 RayCluster",
        "ray.io/v1 RayJob",
        "leaderworkerset.x-k8s.io/v1 LeaderWorkerSet",
    ],
)
# The pod webhook (deploy/webhook/): when kube-apiserver cannot call it, Ignore creates the
# pod unchanged (for the default scheduler), Fail refuses the create. `manage.py
# webhook_cert` writes it into the MutatingWebhookConfiguration.
GPUPOOL_WEBHOOK_FAILURE_POLICY = env_choice(
    "GPUPOOL_WEBHOOK_FAILURE_POLICY", "Ignore", ("Ignore", "Fail")
)

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

# --- Single sign-on: OpenID Connect (docs/sso.md) --------------------------------------------
# Off unless GPUPOOL_OIDC_ISSUER is set. Local passwords keep working beside it (break-glass).
# The provider's endpoints are read from its discovery document on first use, not at start-up.
AUTHENTICATION_BACKENDS = ["django.contrib.auth.backends.ModelBackend", "portal.sso.SsoBackend"]
GPUPOOL_OIDC_ISSUER = env_url("GPUPOOL_OIDC_ISSUER", ("http", "https")).rstrip("/")
GPUPOOL_OIDC_DISCOVERY_URL = env_url("GPUPOOL_OIDC_DISCOVERY_URL", ("http", "https")) or (
    f"{GPUPOOL_OIDC_ISSUER}/.well-known/openid-configuration" if GPUPOOL_OIDC_ISSUER else ""
)
GPUPOOL_OIDC_PROVIDER_NAME = env_str("GPUPOOL_OIDC_PROVIDER_NAME", "single sign-on")[:60]
GPUPOOL_OIDC_CREATE_USERS = env_bool("GPUPOOL_OIDC_CREATE_USERS", False)
GPUPOOL_OIDC_REQUIRE_VERIFIED_EMAIL = env_bool("GPUPOOL_OIDC_REQUIRE_VERIFIED_EMAIL", True)
GPUPOOL_OIDC_GROUPS_CLAIM = env_str("GPUPOOL_OIDC_GROUPS_CLAIM", "").strip()
GPUPOOL_OIDC_GROUP_ROLES = parse_group_roles(
    env_str("GPUPOOL_OIDC_GROUP_ROLES"), variable="GPUPOOL_OIDC_GROUP_ROLES"
)
OIDC_RP_CLIENT_ID = env_str("GPUPOOL_OIDC_CLIENT_ID").strip()
OIDC_RP_CLIENT_SECRET = env_secret("GPUPOOL_OIDC_CLIENT_SECRET")
OIDC_RP_SCOPES = " ".join(env_list("GPUPOOL_OIDC_SCOPES", ["openid", "email", "profile"]))
OIDC_RP_SIGN_ALGO = env_choice("GPUPOOL_OIDC_SIGN_ALGO", "RS256", ("RS256", "ES256", "PS256"))
OIDC_USE_PKCE = True
OIDC_TIMEOUT = env_int("GPUPOOL_OIDC_TIMEOUT_S", 10, minimum=1)
OIDC_CALLBACK_CLASS = "portal.sso.SsoCallbackView"
OIDC_AUTHENTICATE_CLASS = "portal.sso.SsoAuthenticateView"
OIDC_CREATE_USER = GPUPOOL_OIDC_CREATE_USERS
if GPUPOOL_OIDC_ISSUER:
    if not (OIDC_RP_CLIENT_ID and OIDC_RP_CLIENT_SECRET):
        raise ImproperlyConfigured(
            "GPUPOOL_OIDC_ISSUER is set: set GPUPOOL_OIDC_CLIENT_ID and GPUPOOL_OIDC_CLIENT_SECRET "
            "(or GPUPOOL_OIDC_CLIENT_SECRET_FILE) too"
        )
    if "openid" not in OIDC_RP_SCOPES.split():
        raise ImproperlyConfigured(
            f"GPUPOOL_OIDC_SCOPES must include openid, got {OIDC_RP_SCOPES!r}"
        )
    if GPUPOOL_OIDC_GROUP_ROLES and not GPUPOOL_OIDC_GROUPS_CLAIM:
        raise ImproperlyConfigured(
            "GPUPOOL_OIDC_GROUP_ROLES needs GPUPOOL_OIDC_GROUPS_CLAIM (e.g. groups)"
        )
elif OIDC_RP_CLIENT_ID or GPUPOOL_OIDC_GROUP_ROLES:
    raise ImproperlyConfigured("GPUPOOL_OIDC_* is set but GPUPOOL_OIDC_ISSUER is not")
# --- End of single sign-on --------------------------------------------------------------------

# Sign-in attempts (login page, Django admin login, API token): per client address and per
# username, DRF's rate format. Past either, 429 with Retry-After.
GPUPOOL_SIGN_IN_RATES = {
    "sign-in": env_str("GPUPOOL_SIGN_IN_RATE", "20/min"),
    "sign-in-username": env_str("GPUPOOL_SIGN_IN_USERNAME_RATE", "30/hour"),
}
for _name, _rate in GPUPOOL_SIGN_IN_RATES.items():
    _count, _, _period = _rate.partition("/")
    if not (_count.isdigit() and _period[:1] in {"s", "m", "h", "d"}):
        raise ImproperlyConfigured(f"The {_name} rate must be like 20/min, not {_rate!r}")

# --- REST API --------------------------------------------------------------------------------
REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "portal.tokens.ApiTokenAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.IsAuthenticated"],
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    "DEFAULT_PAGINATION_CLASS": "portal.pagination.BoundedPagination",
    # JSON with a nesting limit (a deep body is a 400, not a RecursionError), forms as before.
    "DEFAULT_PARSER_CLASSES": [
        "portal.parsers.BoundedJSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "PAGE_SIZE": 100,
    # Every 404 of the API has one body, an object the caller may not see as one that is not.
    "EXCEPTION_HANDLER": "portal.errors.api_exception_handler",
}
# API tokens (portal/tokens.py): hashed at rest, valid for GPUPOOL_API_TOKEN_TTL_DAYS, and at
# most GPUPOOL_API_TOKENS_PER_USER per user (a new login drops the oldest).
REST_KNOX = {
    "TOKEN_TTL": timedelta(days=env_int("GPUPOOL_API_TOKEN_TTL_DAYS", 30, minimum=1)),
    "AUTO_REFRESH": False,
}
GPUPOOL_API_TOKENS_PER_USER = env_int("GPUPOOL_API_TOKENS_PER_USER", 10, minimum=1)
SPECTACULAR_SETTINGS = {
    "TITLE": "GPUPool API",
    "DESCRIPTION": "Pool GPUs across Kubernetes clusters and share them fairly among teams.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    # The docs page's Swagger UI from this server (drf-spectacular-sidecar), asking no
    # other host for anything (no validator badge): air-gapped installations are common.
    "SWAGGER_UI_DIST": "SIDECAR",
    "SWAGGER_UI_FAVICON_HREF": "SIDECAR",
    "SWAGGER_UI_SETTINGS": {"validatorUrl": None, "deepLinking": True},
    # The schema and its docs page are for signed-in users (session or token) only.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.IsAuthenticated"],
    "ENUM_NAME_OVERRIDES": {"WorkloadKindEnum": "scheduling.models.WorkloadKind"},
    # Every operation's error answers (400/401/403/404/429), documented in one place.
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "portal.api_schema.document_errors",
    ],
}

# --- Static files, i18n ----------------------------------------------------------------------
STATIC_URL = "/static/"
# The image collects them at build time outside var/, which a volume may cover at run time.
STATIC_ROOT = Path(env_str("GPUPOOL_STATIC_ROOT", str(VAR_DIR / "staticfiles")))
STATIC_ROOT.mkdir(parents=True, exist_ok=True)
STATICFILES_DIRS = [BASE_DIR / "static"]
# Collected (the image at build time, `make demo` at start): collectstatic has written
# hashed names and gzip + brotli copies of every file, which WhiteNoise serves to browsers
# that accept them, with a year's caching for the hashed names. Otherwise (tests, a bare
# `manage.py runserver`) files are served straight from their folders.
STATIC_COLLECTED = env_bool("GPUPOOL_STATIC_COLLECTED", False)
WHITENOISE_USE_FINDERS = not STATIC_COLLECTED
# Source maps are fetched by a browser's developer tools only: not worth compressing.
WHITENOISE_SKIP_COMPRESS_EXTENSIONS = [
    *("jpg", "jpeg", "png", "gif", "webp", "ico", "zip", "gz", "tgz", "bz2", "xz", "br"),
    *("woff", "woff2", "mp4", "webm", "map"),
]
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {
        "BACKEND": "whitenoise.storage.CompressedManifestStaticFilesStorage"
        if STATIC_COLLECTED
        else "django.contrib.staticfiles.storage.StaticFilesStorage"
    },
}
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
