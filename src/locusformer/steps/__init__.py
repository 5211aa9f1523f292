"""One module per CLI subcommand: read the workflow's files, call the library, write."""
