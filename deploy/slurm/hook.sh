#!/bin/sh
# The body of prolog_slurmctld.sh and epilog_slurmctld.sh: `hook.sh prolog|epilog`. slurmctld runs them as
# SlurmUser with a bare environment, so the settings come from the hooks' environment file.
# It never fails: a PrologSlurmctld that exits non-zero holds the job, and faultline being down must not stop
# training. What went wrong goes to slurmctld's log (stderr).
set -a
# shellcheck disable=SC1090
[ -r "${FAULTLINE_HOOKS_ENV:-/etc/faultline/slurm-hooks.env}" ] && . "${FAULTLINE_HOOKS_ENV:-/etc/faultline/slurm-hooks.env}"
set +a
"${FAULTLINE_BIN:-/opt/faultline/bin/faultline}" slurm "$1" \
    --token-file "${FAULTLINE_TOKEN_FILE:-/etc/faultline/scheduler.token}" || true
exit 0
