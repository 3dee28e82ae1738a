"""The organisation's pages: sign-in, overview, departments, projects, users, audit log."""

from django.contrib.auth import views as auth_views
from django.urls import path

from portal.forms import InvitedUsersPasswordResetForm
from portal.throttles import sign_in_throttled
from portal.views import home, people, profile
from portal.views import organisation as org

auth = [
    path("accounts/login/", sign_in_throttled(auth_views.LoginView.as_view()), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path(
        "accounts/password-reset/",
        # Each POST may send a mail: counted with the sign-in attempts of its address.
        sign_in_throttled(
            auth_views.PasswordResetView.as_view(form_class=InvitedUsersPasswordResetForm)
        ),
        name="password_reset",
    ),
    path(
        "accounts/password-reset/sent/",
        auth_views.PasswordResetDoneView.as_view(),
        name="password_reset_done",
    ),
    path(
        "accounts/reset/<uidb64>/<token>/",
        auth_views.PasswordResetConfirmView.as_view(),
        name="password_reset_confirm",
    ),
    path(
        "accounts/reset/done/",
        auth_views.PasswordResetCompleteView.as_view(),
        name="password_reset_complete",
    ),
]

organisation = [
    path("", home.home, name="home"),
    path("home/fragment/", home.home_live, name="home_live"),
    path("departments/", org.department_list, name="department_list"),
    path("departments/new/", org.department_create, name="department_create"),
    path("departments/<int:pk>/", org.department_edit, name="department_edit"),
    path("departments/<int:pk>/quotas/", org.department_quotas, name="department_quotas"),
    path("departments/<int:pk>/delete/", org.department_delete, name="department_delete"),
    path("projects/", org.project_list, name="project_list"),
    path("projects/new/", org.project_create, name="project_create"),
    path("projects/<int:pk>/", org.project_detail, name="project_detail"),
    path("projects/<int:pk>/edit/", org.project_edit, name="project_edit"),
    path("projects/<int:pk>/quotas/", org.project_quotas, name="project_quotas"),
    path("projects/<int:pk>/delete/", org.project_delete, name="project_delete"),
    path("node-pools/", org.node_pool_list, name="node_pool_list"),
    path("node-pools/new/", org.node_pool_form, name="node_pool_create"),
    path("node-pools/<int:pk>/", org.node_pool_form, name="node_pool_edit"),
]

people_urls = [
    path("users/", people.user_list, name="user_list"),
    path("users/invite/", people.user_invite, name="user_invite"),
    path("users/<int:pk>/", people.user_edit, name="user_edit"),
    path("users/<int:pk>/memberships/", people.membership_add, name="membership_add"),
    path(
        "users/<int:pk>/memberships/<int:membership_pk>/remove/",
        people.membership_remove,
        name="membership_remove",
    ),
    path("users/<int:pk>/deactivate/", people.user_deactivate, name="user_deactivate"),
    path("users/<int:pk>/reactivate/", people.user_reactivate, name="user_reactivate"),
    path("audit/", people.audit_log, name="audit_log"),
    path("accounts/profile/", profile.profile, name="profile"),
    path(
        "accounts/profile/ssh-keys/<int:pk>/delete/", profile.ssh_key_delete, name="ssh_key_delete"
    ),
]

urlpatterns = auth + organisation + people_urls
