"""Step checks (the vramleak fixture): the loop catalogues, short and noisy loops, and their reports."""
