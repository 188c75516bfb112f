#!/usr/bin/env bash
# Installs nginx and haproxy for scripts/bench_proxies.sh (router versus nginx and haproxy), from
# the distribution's packages (Debian 12: nginx 1.22, haproxy 2.6). Idempotent: does nothing when
# both commands are already on PATH. Runs apt-get directly as root, through sudo otherwise;
# fails with a message saying what to install when neither is possible. Never starts, enables
# or configures the system services: the benchmark runs its own instances from its own
# configuration in a temporary directory.
#
# usage: scripts/setup_bench_proxies.sh

set -euo pipefail

# Debian installs both under /usr/sbin, which a non-root PATH may lack.
PATH=$PATH:/usr/sbin:/sbin

if command -v nginx >/dev/null && command -v haproxy >/dev/null; then
    exit 0
fi

if [[ $(id -u) == 0 ]]; then
    as_root=()
elif command -v sudo >/dev/null; then
    as_root=(sudo)
else
    echo "error: nginx and haproxy are needed by scripts/bench_proxies.sh; install them as root" \
        "(apt-get install -y --no-install-recommends nginx haproxy) or run this script with sudo available" >&2
    exit 1
fi
if ! command -v apt-get >/dev/null; then
    echo "error: nginx and haproxy are needed by scripts/bench_proxies.sh and this machine has no apt-get;" \
        "install them with its package manager" >&2
    exit 1
fi

echo "==> installing nginx and haproxy (distribution packages)" >&2
# Package installs must not start the system services (they would bind ports 80 and friends);
# policy-rc.d answering 101 tells invoke-rc.d not to start anything during this install.
policy=/usr/sbin/policy-rc.d
created_policy=
if [[ ! -e $policy ]]; then
    printf '#!/bin/sh\nexit 101\n' | "${as_root[@]}" tee "$policy" >/dev/null
    "${as_root[@]}" chmod 755 "$policy"
    created_policy=1
fi
status=0
{
    "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get update -q &&
        "${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends nginx haproxy
} >&2 || status=$?
if [[ -n $created_policy ]]; then
    "${as_root[@]}" rm -f "$policy"
fi
if ((status != 0)) || ! command -v nginx >/dev/null || ! command -v haproxy >/dev/null; then
    echo "error: installing nginx and haproxy failed (apt-get exit status $status)" >&2
    exit 1
fi
