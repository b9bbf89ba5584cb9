"""The engine: asyncio tasks that drive the core and do the I/O through a backend."""
