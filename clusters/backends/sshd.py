"""The SSH server a workload started with SSH runs beside its command, on every backend.

The pod's command becomes `sh -c SCRIPT gpupool-ssh COMMAND...`: the script writes the keys
GPUPool hands the pod (GPUPOOL_SSH_AUTHORIZED_KEYS: the owner's, and the project members'
when shared) to an authorized_keys file, makes a host key on first start (kept in the pod's
home, so a restarted workspace keeps it), and runs the image's own OpenSSH `sshd` as the
pod's user: in the foreground when there is no command, else in the background before
exec'ing the command. Keys only: no password, no PAM.

sshd listens on GPUPOOL_PORT_SSH at GPUPOOL_BIND_HOST: loopback on the local backend, where
the portal's tunnel dials it; the pod's address on Kubernetes, behind a ClusterIP Service
that only the portal's tunnel reaches from outside. It is never published on a node.

The script has no `$(`: both backends expand `$(VAR)` in a command themselves.
"""

from __future__ import annotations

from clusters.backends.sandbox import POD_USER

SSH_ENV = "GPUPOOL_SSH_AUTHORIZED_KEYS"
# The login name on the local backend (the sandbox names the pod's user so); on Kubernetes
# an SSH environment's image has a user of this name with the pods' uid (1000).
SSH_USER = POD_USER
SCRIPT = """set -eu
dir="${GPUPOOL_SSH_DIR:-${HOME:-/tmp}/.gpupool-ssh}"
mkdir -p "$dir"
chmod 700 "$dir"
[ -f "$dir/host_key" ] || ssh-keygen -q -t ed25519 -N '' -f "$dir/host_key"
printf '%s\\n' "${GPUPOOL_SSH_AUTHORIZED_KEYS:-}" > "$dir/authorized_keys"
chmod 600 "$dir/authorized_keys"
cat > "$dir/sshd_config" <<CONFIG
Port ${GPUPOOL_PORT_SSH:-2222}
ListenAddress ${GPUPOOL_BIND_HOST:-0.0.0.0}
HostKey $dir/host_key
AuthorizedKeysFile $dir/authorized_keys
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
UsePAM no
StrictModes no
PidFile $dir/sshd.pid
Subsystem sftp internal-sftp
CONFIG
sshd=/usr/sbin/sshd
[ -x "$sshd" ] || sshd=sshd
if [ "$#" -eq 0 ]; then exec "$sshd" -D -e -f "$dir/sshd_config"; fi
"$sshd" -D -e -f "$dir/sshd_config" &
exec "$@"
"""


def with_ssh_server(command: tuple[str, ...]) -> tuple[str, ...]:
    """The pod's command (command and args together) with the SSH server started first."""
    return ("sh", "-c", SCRIPT, "gpupool-ssh", *command)
