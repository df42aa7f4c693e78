"""The local backend: a training attempt as a child process on the flow's own machine.

`backend` puts it behind the seam; `runner` starts the entrypoint, enforces the deadline and stall
window and stops it; `orphans` stops a process whose supervisor died.
"""
