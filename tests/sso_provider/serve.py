"""Run the test identity provider: python -m tests.sso_provider.serve PORT SETUP_JSON

SETUP_JSON names the client ({"client_id", "client_secret", "redirect_uri"}) and the users
({"username", "password", "email", "last_name", "groups"}). The database is made fresh.
"""

import json
import os
import sys
from pathlib import Path


def main() -> None:
    port, setup_file = sys.argv[1], sys.argv[2]
    os.environ["DJANGO_SETTINGS_MODULE"] = "tests.sso_provider.settings"
    import django

    django.setup()
    from django.contrib.auth.models import Group, User
    from django.core.management import call_command
    from oauth2_provider.models import Application

    call_command("migrate", verbosity=0)
    setup = json.loads(Path(setup_file).read_text())
    for person in setup["users"]:
        user = User.objects.create_user(
            person["username"],
            email=person["email"],
            password=person["password"],
            last_name=person.get("last_name", ""),
        )
        for name in person.get("groups", []):
            user.groups.add(Group.objects.get_or_create(name=name)[0])
    client = setup["client"]
    Application.objects.create(
        name="GPUPool",
        client_id=client["client_id"],
        client_secret=client["client_secret"],
        client_type=Application.CLIENT_CONFIDENTIAL,
        authorization_grant_type=Application.GRANT_AUTHORIZATION_CODE,
        redirect_uris=client["redirect_uri"],
        algorithm=Application.RS256_ALGORITHM,
        skip_authorization=True,
    )
    call_command("runserver", f"127.0.0.1:{port}", use_reloader=False, use_threading=True)


if __name__ == "__main__":
    main()
