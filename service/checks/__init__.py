"""Stop-time check results: stored as the agents ship them, judged against the fleet, failures as findings."""
