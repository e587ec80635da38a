"""Test instruments: a scripted HTTP server whose timings are known exactly (`scripted_server`, its stream
shapes in `scripted_formats`) and the load generator's accuracy harness (`accuracy`), for the tests and the
benchmarks that check our measurements against a known truth. They may import `workloads` and `adapters`;
no production package (`compare`, `workloads`, `adapters`, `reference_engine`) ever imports them."""
