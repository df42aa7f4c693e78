"""The evidence bundle's format, above any store: what an attempt's evidence is, not where it lives.

`manifest` lists what was kept (with digests) and what is missing and why; `bundles` lists a
store's bundles and verifies them; `retention` tags outcomes and expires or prunes bundles;
`afterupload` sends a held store's writes up after the verdict, so judging never waits on S3;
`index` keeps one compact record per judged attempt, which the fleet view reads; `verdicts` keeps an
attempt's verdict beside its evidence (listed, tagged, indexed) and reads it back, for whoever judged it.
"""
