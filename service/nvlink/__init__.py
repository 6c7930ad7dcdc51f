"""NVLink domains (GB200 NVL72): which nodes share one, its health, its domain incident; /api/v1/nvlink-domains."""
