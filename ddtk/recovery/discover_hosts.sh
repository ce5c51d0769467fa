#!/bin/sh
# Host discovery for horovodrun --host-discovery-script: print one "host:slots" a line.
# The list is read from the file named by $DDTK_HOSTS_FILE, so a host can be added or
# removed while the job runs by rewriting that file (atomically: write, then rename).
# On a real cluster print the live nodes instead (a scheduler query, a cloud API call).
set -eu
exec cat "${DDTK_HOSTS_FILE:?set DDTK_HOSTS_FILE to a file of host:slots lines}"
