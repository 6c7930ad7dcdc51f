#!/bin/sh
# slurm.conf: EpilogSlurmctld=/etc/faultline/slurm/epilog_slurmctld.sh
# Ends the job in faultline: finished when it exited 0 (SLURM_JOB_EXIT_CODE), else failed.
exec /bin/sh "$(dirname "$0")/hook.sh" epilog
