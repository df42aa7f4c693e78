"""The Kubernetes backend: a training attempt as a Job, supervised by watch, its evidence frozen.

`api` is the one module that imports the `kubernetes` client (an import-linter contract keeps it
so); `errors` is its error tree; `watch` resumes watches. `manifests` writes the Job and its
Secret, `zipapp` puts the entrypoint archive into the ConfigMap the pods run it from; for several nodes,
`indexed` makes the Job an Indexed Job behind a headless Service, `pytorchjob` makes it a Kubeflow
PyTorchJob instead, `kinds` tells the two kinds apart wherever they are read, and `placement`
relaxes one pod per node when the cluster cannot give it. `supervise` follows an attempt to its
end, `supervise_nodes` one of several pods, `podstate` reads a pod's states and what it still
waits for. `evidence`, `scene`, `describe` (with `gotext`, Go's
text formatting kubectl's output depends on) and `volume` freeze what the cluster knows, the
volume's files through the `collector` pod, which runs `collector_program` and is read back by
`collector_output`; `nodes` maps and keeps each pod of a multi-node attempt; `localdir` is the
private folder on the flow's machine where the triage facts and the nodes' files are kept, and
`kept` reads them back, once, for triage; the `lister` pod lists a run's checkpoints and checks the
newest against their acknowledgements; `drain` waits for an ended attempt's pods to stop. `backend`
puts it together behind `trainguard.core.backends.base.Backend`.
"""
