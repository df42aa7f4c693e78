"""Evidence stores: where the frozen crime scene outlives the machine it was collected on.

`base` is the seam every store implements, its values and errors, `validate_key`, and every
optional capability as a protocol; `folder` keeps evidence in a local or mounted folder; `s3`
keeps it in an S3 bucket. What goes into a store, and under which keys, is ``evidence``'s business.
"""
