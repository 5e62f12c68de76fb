#!/usr/bin/env bash
# As the official image does (it is built with protected mode off): other containers may
# connect without a password unless the command says otherwise.
set -euo pipefail
if [ "${1:-}" = redis-server ] && [[ " $* " != *" --protected-mode "* ]]; then
    set -- "$@" --protected-mode no
fi
exec "$@"
