"""Measuring kernels: the timers, copy bandwidth and run environment every measurement shares, and the decode
kernel registry (inputs, bytes moved) that the tests, the benches and first-use tuning all time from."""
