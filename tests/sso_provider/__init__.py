"""A real OpenID Connect provider for the SSO tests: django-oauth-toolkit with OIDC on, run as
its own small Django process (serve.py) with its own settings and database."""
