"""Storage backends: what the engine needs from storage, and its implementations.

The engine talks only to :class:`~streamsub._backends.base.Backend`. Each
implementation translates its own errors to streamsub's at this boundary.
"""
