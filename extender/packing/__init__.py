"""The pure packing core: GPU model, share requests, the budget ledger, fit, scoring policies and
annotation codecs. Nothing here does I/O; import-linter enforces it."""
