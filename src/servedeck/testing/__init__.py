"""Measuring instruments, not engines: what servedeck's own accuracy is checked against.

Nothing here stands in for vLLM, SGLang or llama.cpp. `instrument` is a ruler: a server that streams
OpenAI-style SSE at known times and records when it really wrote each token, so a client's
timestamps can be judged (tests/loadgen, bench/loadgen_accuracy.py). `instrument_process` runs it
in a process group of its own. `hostile` is the other side: clients that pipeline without reading or
send one huge header, and a bystander timing the server meanwhile (the door's limits: tests/door,
bench/door_limits.py). The runtime packages (loadgen, campaign, deck) never import this.

Import from the modules (`servedeck.testing.instrument_process.InstrumentProcess`): the package
itself imports nothing, so `python -m servedeck.testing.instrument` runs cleanly.
"""

