"""The Kubernetes backend: a training attempt as a Job, supervised by watch, its evidence frozen.

`api` is the one module that imports the `kubernetes` client (an import-linter contract keeps it
so); `errors` is its error tree; `watch` resumes watches; `manifests` writes the Job;
`supervise` follows an attempt to its end; `evidence` and `describe` freeze what the cluster
knows; `backend` puts it together behind `trainguard.core.backends.base.Backend`.
"""
