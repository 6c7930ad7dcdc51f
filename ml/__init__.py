"""Pure detection methods: plain data in, findings out (pandas, numpy, scikit-learn; no database)."""
