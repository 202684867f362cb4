"""Load profiles, the locustfile and the runner that turns raw samples into latency figures."""
