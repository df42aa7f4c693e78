"""Real services the tests start on loopback and stop again: PostgreSQL, a Prefect server, a faulty proxy.

Each is a context manager that owns its processes and temporary folders. Nothing here touches a
system database, a system service or a folder outside its own temporary one.
"""
