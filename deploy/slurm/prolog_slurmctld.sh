#!/bin/sh
# slurm.conf: PrologSlurmctld=/etc/faultline/slurm/prolog_slurmctld.sh
# Registers the job with faultline: its id, its nodes (SLURM_JOB_NODELIST) and one rank per GPU in block order.
# It never fails the job: a PrologSlurmctld that exits non-zero holds the job, and faultline being down must not
# stop training. What went wrong goes to slurmctld's log (stderr).
set -a
# shellcheck disable=SC1090
[ -r "${FAULTLINE_HOOKS_ENV:-/etc/faultline/slurm-hooks.env}" ] && . "${FAULTLINE_HOOKS_ENV:-/etc/faultline/slurm-hooks.env}"
set +a
"${FAULTLINE_BIN:-/opt/faultline/bin/faultline}" slurm prolog \
    --token-file "${FAULTLINE_TOKEN_FILE:-/etc/faultline/scheduler.token}" || true
exit 0
