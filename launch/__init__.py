"""Launchers for multi-process lev-train runs (scripts, also importable for tests).

  launch/local.py   N CPU processes on this machine (the multi-process code path, no cluster)
  launch/tpu.py     a Cloud TPU VM pod slice through gcloud, with restart after preemption
  launch/slurm.py   an sbatch script for a multi-node GPU cluster, requeued after SIGTERM

Every launcher takes its own flags, then `--`, then the lev-train arguments, and has a
`--dry-run` that prints exactly what it would run. lev_jax/distributed.py explains how each
process finds the others.
"""
