"""podium.job's implementation: the job base and its state file (base.py), local workers
(local.py, worker_process.py), SLURM (slurm.py)."""
