"""Object storage shared by the broker and the pipeline: `file://` and `s3://` URLs through pyarrow.fs."""
