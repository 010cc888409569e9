"""What the tests and the benchmarks put into a hub, in their own process (Django set up): the
sensitive tier's corpora (`sensitivity_corpus`), a history made in bulk (`history`), a race of
workers claiming one task (`claim_race`).

Outside the product, beside `hub_topology` (which starts hubs as processes): the tests and the
benchmarks import it, and neither imports the other (tests/test_layers.py)."""
