"""The Kubernetes backend: a training attempt as a Job, supervised by watch, its evidence frozen.

`api` is the one module that imports the `kubernetes` client (an import-linter contract keeps it
so); `errors` is its error tree; `watch` resumes watches; `manifests` writes the Job and its
Secret; `supervise` follows an attempt to its end; `evidence`, `scene`, `describe` and `volume`
freeze what the cluster knows, the volume's files through the `collector` pod, which runs
`collector_program` and is read back by `collector_output`; `backend` puts it together behind
`trainguard.core.backends.base.Backend`.
"""
