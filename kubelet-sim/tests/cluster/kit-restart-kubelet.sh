#!/bin/sh
# Restarts the kit's kubelet (../shared/kit) with its own command line and returns once the new one answers
# its healthz: conform's --kubelet-restart-command on the kit (KIT_RUN as up.sh had it).
set -e
R=${KIT_RUN:-/tmp/inlet-kit}/run
pid=$(cat $R/pids/kubelet.pid)
args=$(tr '\0' ' ' < /proc/$pid/cmdline)
port=$(awk '/^healthzPort:/ {print $2}' $R/kubelet-config.yaml)
kill $pid
while kill -0 $pid 2>/dev/null; do sleep 0.1; done
setsid $args >> $R/logs/kubelet.log 2>&1 < /dev/null &
echo $! > $R/pids/kubelet.pid
until curl -sf http://127.0.0.1:$port/healthz >/dev/null; do sleep 0.2; done
