#!/bin/sh
# slurm.conf: EpilogSlurmctld=/etc/faultline/slurm/epilog_slurmctld.sh
# Ends the job in faultline: finished when it exited 0 (SLURM_JOB_EXIT_CODE), else failed; periodic diagnosis
# then passes it by. Never fails: an epilog's exit code would only drain the controller's view of nothing.
set -a
# shellcheck disable=SC1090
[ -r "${FAULTLINE_HOOKS_ENV:-/etc/faultline/slurm-hooks.env}" ] && . "${FAULTLINE_HOOKS_ENV:-/etc/faultline/slurm-hooks.env}"
set +a
"${FAULTLINE_BIN:-/opt/faultline/bin/faultline}" slurm epilog \
    --token-file "${FAULTLINE_TOKEN_FILE:-/etc/faultline/scheduler.token}" || true
exit 0
