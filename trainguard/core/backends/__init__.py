"""Where training attempts run: the seam every backend implements, and one wing per platform.

`base` holds the `Backend` protocol, the values that cross it and its optional capabilities;
`workspace` owns the paths of the attempt folder every backend's entrypoint fills, and
`workspace_evidence` collects that folder into a store; `processes` tells whether a recorded
process still runs. The wings `local`, `kubernetes` and `slurm` know nothing of each other.
"""
