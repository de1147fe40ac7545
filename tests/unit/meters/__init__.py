"""Unit tests of pytest_vramleak.meters: measuring a device, its allocator's history and its cache."""
