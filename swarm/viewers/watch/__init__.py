"""`swarm watch`: the live swarm in a browser.

One static page (static/, plain JavaScript, shipped as package data) fed by
server-sent events. Three pieces, each usable alone:

- `WatchHub`: one source's events, served to any number of pages (hub.py);
- `follow_bus`, `follow_socket`, `load_file`: where the events come from (sources.py);
- `watch_routes`, `create_app`, `bind_loopback`, `serve_http`: the page on Starlette, served on
  loopback by uvicorn (app.py); `trusted_hosts`, its Host header check against DNS rebinding.

To serve the page at `/` of another Starlette app (as `swarm serve` does):

    hub = WatchHub(source="swarm serve")
    app = Starlette(routes=[*api_routes, *watch_routes(hub)])
    ...
    await tg.start(follow_bus, hub, swarm.bus)    # before the swarm starts
"""

from swarm.viewers.watch.app import DEFAULT_PORT, bind_loopback, create_app, listen, serve_http, trusted_hosts, watch_routes
from swarm.viewers.watch.hub import WatchHub
from swarm.viewers.watch.sources import follow_bus, follow_socket, load_file

__all__ = [
    "DEFAULT_PORT",
    "WatchHub",
    "bind_loopback",
    "listen",
    "create_app",
    "follow_bus",
    "follow_socket",
    "load_file",
    "serve_http",
    "trusted_hosts",
    "watch_routes",
]
