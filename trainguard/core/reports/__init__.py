"""What people read about attempts and runs, as text: no Prefect, no backend, no store.

`attempt` renders one attempt's report and the attempts table's rows; `run` the run's timeline
with its progress chart (the points `trainguard.core.progress` reads from the log); `livelog` masks
and rate-limits the training output streamed to the flow's logger.
"""
