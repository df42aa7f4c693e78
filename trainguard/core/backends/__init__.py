"""Where training attempts run: the seam every backend implements, and one wing per platform.

`base` holds the `Backend` protocol and the values that cross it; `capabilities` the optional
capabilities beside it, as protocols a caller tests with `isinstance`. `workspace` lays out the
attempt folder every backend's entrypoint fills (the names inside it are the entrypoint's
`trainguard_entrypoint.paths`, re-exported there), `entrypoint_archive` packs that entrypoint
into the one archive a pod or a compute node runs, and `workspace_evidence` collects that
folder into a store, through `jobfiles` (the job's files masked or byte for byte, within budget,
safely named); `torchrun` and `rankstacks` read what torchrun and the entrypoint's stack capture
left there, as triage reads it; `forensics` is what every backend tells the entrypoint about a hang;
`processes` tells whether a recorded process still runs; `waits` says, on a schedule, what a
long wait is for; `stopreason` says why the supervisor stops an attempt (a cancel, Ctrl-C). The wings `local`, `kubernetes` and
`slurm` know nothing of each other.
"""
