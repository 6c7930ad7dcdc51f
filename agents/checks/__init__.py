"""Stop-time checks of a drained node: each a small module that measures one thing and says pass, fail or not
available, with the figure measured, the figure expected and its evidence (see suite.py for the levels)."""
