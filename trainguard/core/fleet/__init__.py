"""The fleet view: the verdicts of many runs together, by node and by root cause, and the nodes to avoid.

`analysis` tallies the verdict index's records (``trainguard.core.evidence.index``) per node and per
fingerprint; `suspects` decides which nodes fail on hardware well above the fleet; `avoid` is the
shared avoid list's entries and how a launch applies them; `render` writes the view as JSON and
Markdown. Reading the index and publishing are the callers' business; nothing here needs Prefect.
"""
