"""What each page shows, read with a bounded number of queries whatever the cluster's size."""
