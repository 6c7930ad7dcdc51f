"""faultline service: ingest API, storage, diagnosis workers and policy."""
