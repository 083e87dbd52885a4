"""The control plane side of the file backends (transfer, S3), uploads and kept artifacts."""
