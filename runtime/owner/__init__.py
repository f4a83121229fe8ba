"""The GPU owner: the actor that runs the scheduler's plans on the engine, one token
boundary at a time, and the client agents reach it through."""
