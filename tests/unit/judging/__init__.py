"""Unit tests of pytest_vramleak.judging: the pure rules that decide budgets, growth and runs."""
