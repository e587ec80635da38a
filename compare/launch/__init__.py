"""Stage 2, launch: a backend's server started (a process or a container) or reached, timed, its start-up
log and declared settings read into its `SetupReport`, and stopped on every way out."""
