"""Unit tests of pytest_vramleak.reporting: what the reports say and how the HTML page renders it."""
