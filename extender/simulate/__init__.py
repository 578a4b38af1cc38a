"""`mpsched simulate`: trace readers, the replay engine (through the packing core's ledger, fit
and policies), reports, plots."""
