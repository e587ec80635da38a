"""Exit codes of `compare run`, shared by the command line, the runner and the Ray cells (whose worst code is
the run's)."""

EXIT_OK = 0  # every load point ran
EXIT_FAILED = 1  # a backend could not be started or reached, or no request succeeded
EXIT_USAGE = 2  # the options are wrong (checked before any work starts)
EXIT_INTERRUPTED = (
    130  # Ctrl-C or SIGTERM: in-flight requests recorded as cancelled, a partial report written
)
