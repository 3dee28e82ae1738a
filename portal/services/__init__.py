"""Every write to the organisation, named <noun>_<verb>, each taking the acting user as
`actor=` and writing an audit row in its own transaction."""

from portal.services.organisation import (
    default_namespace,
    department_create,
    department_delete,
    department_update,
    node_pool_create,
    node_pool_update,
    project_create,
    project_delete,
    project_update,
)
from portal.services.quotas import quota_set
from portal.services.users import (
    membership_add,
    membership_remove,
    set_password_link,
    user_deactivate,
    user_invite,
    user_reactivate,
    user_update,
)

__all__ = [
    "default_namespace",
    "department_create",
    "department_delete",
    "department_update",
    "membership_add",
    "membership_remove",
    "node_pool_create",
    "node_pool_update",
    "project_create",
    "project_delete",
    "project_update",
    "quota_set",
    "set_password_link",
    "user_deactivate",
    "user_invite",
    "user_reactivate",
    "user_update",
]
