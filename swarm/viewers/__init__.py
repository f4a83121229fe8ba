"""The viewers of a swarm's events: `swarm tail`, `swarm plot` and the live page
(`swarm watch`)."""
