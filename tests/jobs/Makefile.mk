# tests/jobs: the PBS job scripts under bash with PBS's variables (the Slurm
# scripts run against a real Slurm in jobs/slurm/selftest.sh, from jobs/check.sh),
# the scaling sweep and its report
TESTS += tests/jobs/pbs.sh tests/jobs/sweep.sh
EXTRA_DIST += tests/jobs/pbs.sh tests/jobs/sweep.sh
# jobs/gpu/check.sh where there is no GPU: the reason, a skip JSON, exit 77
TESTS += tests/jobs/gpu_check.sh
EXTRA_DIST += tests/jobs/gpu_check.sh
