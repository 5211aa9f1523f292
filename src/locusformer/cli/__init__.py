"""The ``locusformer`` command line: parse the arguments and dispatch to a step."""
