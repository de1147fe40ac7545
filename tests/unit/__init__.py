"""Unit tests, in folders that mirror the package: one module's functions each, no pytest run inside."""
