"""Unit tests of pytest_vramleak.tracking: what is watched around a test."""
