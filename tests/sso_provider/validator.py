"""The claims the test provider sends: e-mail (verified unless the user's last name says
"unverified", a switch the tests use) and the Django groups of the user as `groups`."""

from oauth2_provider.oauth2_validators import OAuth2Validator


class ClaimsValidator(OAuth2Validator):
    oidc_claim_scope = {
        **OAuth2Validator.oidc_claim_scope,
        "email_verified": "email",
        "groups": "profile",
    }

    def get_additional_claims(self, request):
        user = request.user
        return {
            "email": user.email,
            "email_verified": user.last_name != "unverified",
            "given_name": user.first_name,
            "groups": sorted(user.groups.values_list("name", flat=True)),
        }
