"""A job's preflight: its nodes checked before it starts (agents/preflight/), the bad ones decided on."""
