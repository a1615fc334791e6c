"""The server layer: sockets, the client's session and its pass-through connection.

`listener` accepts clients and runs start-up and shutdown; `connection` wraps a socket for both
ends of a session; `handshake` takes a session from its first bytes to ReadyForQuery; `session`
runs the query loop and the fast relay; `extended` speaks the extended query protocol; `upstream`
is the session's pass-through connection to PostgreSQL; `loops` picks the event loop.
"""
