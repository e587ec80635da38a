"""One module per serving backend: how to start it, talk to it, and read its stream, logs and metrics."""
