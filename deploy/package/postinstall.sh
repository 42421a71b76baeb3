#!/bin/sh
# After installing the spillway package: the system user the broker runs
# as, its state and config dirs. The units are installed but not enabled:
# fill in /etc/spillway/spillway.yaml first (docs/operations.md).
set -e
if ! getent passwd spillway >/dev/null; then
  useradd --system --home /var/lib/spillway --shell /usr/sbin/nologin spillway
fi
install -d -o spillway -g spillway -m 0750 /var/lib/spillway
install -d -m 0750 -g spillway /etc/spillway
if [ ! -e /etc/spillway/spillway.yaml ]; then
  install -m 0640 -g spillway /usr/share/doc/spillway/examples/spillway.example.yaml /etc/spillway/spillway.yaml
fi
if command -v systemctl >/dev/null 2>&1 && [ -d /run/systemd/system ]; then
  systemctl daemon-reload || true
fi
echo "spillway: edit /etc/spillway/spillway.yaml (spillway token create; spillway config check), then: systemctl enable --now spillway-server"
