"""The Slurm backend: a training attempt as a batch job on an HPC cluster.

`client` is the one module that runs Slurm's commands (sbatch, squeue, scontrol, sacct, scancel)
and its error tree; `job` describes the job (options, batch script, how it ended) as pure
functions; `backend` submits or adopts it behind the seam; `supervise` follows it to its end and
says how it ended; `tail` streams its log;
`evidence` freezes what Slurm knows; `nodes` reads each task's folder of a multi-node attempt as
triage does; `continuation` keeps the job record and continues a job an earlier attempt lost
track of.
"""
