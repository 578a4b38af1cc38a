"""One module per mpsched subcommand: parse flags, build, run."""
