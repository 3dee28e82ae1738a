"""The signed-in user's own profile: their SSH public keys."""

from __future__ import annotations

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import get_object_or_404, redirect, render
from django.views.decorators.http import require_POST

from portal.services.ssh_keys import NAME_MAX, ssh_key_add, ssh_key_remove
from portal.ssh_keys import KEY_TEXT_MAX
from portal.views.common import form_saved, posted


class SshKeyForm(forms.Form):
    name = forms.CharField(
        max_length=NAME_MAX, required=False, help_text="Default: the key's comment."
    )
    public_key = forms.CharField(
        max_length=KEY_TEXT_MAX,
        widget=forms.Textarea(attrs={"rows": 3, "placeholder": "ssh-ed25519 AAAA... you@laptop"}),
        help_text="The contents of your ~/.ssh/id_ed25519.pub (or another .pub file).",
    )


@login_required
def profile(request: HttpRequest) -> HttpResponse:
    form = SshKeyForm(posted(request))
    done = form_saved(
        request,
        form,
        lambda: ssh_key_add(actor=request.user, user=request.user, **form.cleaned_data),
        message=lambda key: f"SSH key {key.name} added ({key.fingerprint}).",
        then=lambda _: redirect("profile"),
    )
    keys = request.user.ssh_keys.all()
    return done or render(request, "portal/profile.html", {"form": form, "keys": keys})


@login_required
@require_POST
def ssh_key_delete(request: HttpRequest, pk: int) -> HttpResponse:
    key = get_object_or_404(request.user.ssh_keys, pk=pk)
    ssh_key_remove(actor=request.user, key=key)
    messages.success(request, f"SSH key {key.name} removed.")
    return redirect("profile")
