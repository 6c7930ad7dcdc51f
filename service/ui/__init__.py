"""The on-call web UI: server-rendered pages over the same service functions as the API."""
