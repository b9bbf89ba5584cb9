"""The core: pure bookkeeping with no I/O.

Every module here takes plain values (and ``now`` where time matters) and
returns plain values or actions. The engine drives them and does the I/O, so
these are tested without a server, a mock or a sleep.
"""
