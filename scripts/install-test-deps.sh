#!/usr/bin/env bash
# Installs the Debian packages the test suite needs, where missing: PostgreSQL and Redis
# servers (started by tests/services.py on free loopback ports) and Chromium (driven by
# Playwright for the browser tests; never a downloaded browser), and bubblewrap, the sandbox
# of local pods (tests/clusters/test_local_sandbox.py; setpriv comes with util-linux), and
# OpenSSH's server and client: a workload's SSH server in the sandbox, reached by `gpupool ssh`
# (tests/workspaces/test_ports_ssh_local.py), and slirp4netns, the way out of a local gang's
# network namespace when its cluster allows egress (tests/clusters/test_local_netns.py).
set -euo pipefail
need=()
compgen -G "/usr/lib/postgresql/*/bin/initdb" > /dev/null || need+=(postgresql)
command -v redis-server > /dev/null || need+=(redis-server)
command -v chromium > /dev/null || need+=(chromium)
command -v bwrap > /dev/null || need+=(bubblewrap)
[ -x /usr/sbin/sshd ] || need+=(openssh-server)
command -v ssh > /dev/null || need+=(openssh-client)
command -v slirp4netns > /dev/null || need+=(slirp4netns)
if [ ${#need[@]} -eq 0 ]; then
  exit 0
fi
sudo=()
if [ "$(id -u)" -ne 0 ]; then sudo=(sudo); fi
echo "Installing Debian packages: ${need[*]}"
"${sudo[@]}" apt-get update -qq
"${sudo[@]}" env DEBIAN_FRONTEND=noninteractive \
  apt-get install -y -qq --no-install-recommends "${need[@]}"
