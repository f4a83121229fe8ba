"""Events and streaming: the event kinds, the bus, the JSON-lines files, the live
event socket, and the latency figures read from a turn's events."""
