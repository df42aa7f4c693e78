"""The S3 store: `bucket` is the one module that imports boto3 (an import-linter contract keeps it so)
and its error tree; `store` is the evidence-store seam over a bucket; `direct` sends a file's parts
straight from disk; `spool` keeps on local disk what S3 did not take; `resume` uploads it later,
part by part.
"""
