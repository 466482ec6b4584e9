#!/usr/bin/env bash
# What tests/test_deploy_*.py run besides the venv's Python packages (kubectl, kubernetes-validate and yamllint
# come with the dev extra): Prometheus and promtool, redis-server and docker-compose, from Debian's packages.
# Idempotent: installs only what is missing (apt-get update first, as root); a machine where they are all
# present pays one `command -v` each. Not root: prints the command to run, and the deploy tests skip.
set -euo pipefail
declare -A pkg=([prometheus]=prometheus [promtool]=prometheus [redis-server]=redis-server [docker-compose]=docker-compose)
missing=()
for cmd in "${!pkg[@]}"; do
  command -v "$cmd" >/dev/null 2>&1 || missing+=("${pkg[$cmd]}")
done
[ ${#missing[@]} -eq 0 ] && exit 0
mapfile -t missing < <(printf '%s\n' "${missing[@]}" | sort -u)
if [ "$(id -u)" -ne 0 ]; then
  echo "deploy tools missing: run  sudo apt-get update && sudo apt-get install -y --no-install-recommends ${missing[*]}" >&2
  exit 0
fi
export DEBIAN_FRONTEND=noninteractive
apt-get update -q
# Debian's prometheus package starts no daemon in a container without systemd; the tests run their own
apt-get install -y -q --no-install-recommends "${missing[@]}"
