"""One naming style for audit actions, `noun.verb` (`workload.submit`, like
`department.create`): rows written under the old snake_case names are renamed."""

from django.db import migrations

RENAMED = {
    "cluster_register": "cluster.register",
    "cluster_sync_inventory": "cluster.sync_inventory",
    "cluster_update": "cluster.update",
    "environment_save": "environment.save",
    "gpu_price_delete": "gpu_price.delete",
    "gpu_price_set": "gpu_price.set",
    "idle_policy_set": "idle_policy.set",
    "node_token_issue": "node_token.issue",
    "node_token_revoke": "node_token.revoke",
    "policy_set": "policy.set",
    "ssh_key_add": "ssh_key.add",
    "ssh_key_remove": "ssh_key.remove",
    "workload_delete": "workload.delete",
    "workload_quarantine": "workload.quarantine",
    "workload_stop": "workload.stop",
    "workload_submit": "workload.submit",
    "workspace_cull": "workspace.cull",
    "workspace_keep_alive": "workspace.keep_alive",
    "workspace_launch": "workspace.launch",
    "workspace_share_set": "workspace.share",
    "workspace_template_save": "workspace_template.save",
}


def rename(apps, schema_editor, mapping=RENAMED):
    AuditLog = apps.get_model("portal", "AuditLog")
    for old, new in mapping.items():
        AuditLog.objects.filter(action=old).update(action=new)


def rename_back(apps, schema_editor):
    rename(apps, schema_editor, {new: old for old, new in RENAMED.items()})


class Migration(migrations.Migration):
    dependencies = [("portal", "0004_ssh_keys_build")]

    operations = [migrations.RunPython(rename, rename_back)]
