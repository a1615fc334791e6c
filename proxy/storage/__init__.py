"""Storage: what dpproxy keeps and reads in PostgreSQL, below the server and beside the engine.

- `proxy.storage.reader`: the privileged reader's pool, which runs only SQL dpproxy generates.
- `proxy.storage.ledger_store`: where released measurements and answers are recorded.
- `proxy.storage.provision`: the boundary's roles, databases, grants and stand-ins.
"""
