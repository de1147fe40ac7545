"""Unit tests of pytest_vramleak.holders: holder search, paths and their names."""
