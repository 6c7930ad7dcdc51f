#!/bin/sh
# slurm.conf: PrologSlurmctld=/etc/faultline/slurm/prolog_slurmctld.sh
# Registers the job with faultline: its id, its nodes (SLURM_JOB_NODELIST) and one rank per GPU in block order.
exec /bin/sh "$(dirname "$0")/hook.sh" prolog
