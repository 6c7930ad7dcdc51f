#!/bin/sh
# slurm.conf (every node):
#   Prolog=/etc/faultline/slurm/prolog_preflight.sh
#   PrologFlags=Alloc                         # run on every node of the allocation at once, when it is allocated
#   PrologEpilogTimeout=300                   # more than the preflight's deadline (FAULTLINE_PREFLIGHT_DEADLINE_S)
#   SchedulerParameters=nohold_on_prolog_fail # a requeued job starts again elsewhere rather than held
# slurmd runs it as root on each node of the job with SLURM_JOB_ID, SLURM_JOB_NODELIST and SLURMD_NODENAME: every
# node runs `faultline preflight`, the first node of the list coordinates, and the nodes check each other.
# It fails only on a node the preflight named bad: slurmd drains that node and requeues the job, which starts on
# other nodes. Anything else (all passed, another node named, faultline down, a preflight that could not run) is
# exit 0: the job is never held for faultline. What happened goes to slurmd's log (stderr).
set -a
# shellcheck disable=SC1090
[ -r "${FAULTLINE_PREFLIGHT_ENV:-/etc/faultline/preflight.env}" ] && . "${FAULTLINE_PREFLIGHT_ENV:-/etc/faultline/preflight.env}"
set +a
# shellcheck disable=SC2086
"${FAULTLINE_BIN:-/opt/faultline/bin/faultline}" preflight \
    --token-file "${FAULTLINE_TOKEN_FILE:-/etc/faultline/preflight.token}" ${FAULTLINE_PREFLIGHT_ARGS:-} >&2
code=$?
if [ "$code" -eq 1 ]; then
    echo "faultline preflight: $(hostname) is named bad: draining it, the job is requeued" >&2
    exit 1
fi
exit 0
