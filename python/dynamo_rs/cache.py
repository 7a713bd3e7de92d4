"""The persistent capture cache (`dynamo_rs.config.capture_cache`): what one process
captured, bound again to the frames of a later one instead of tracing them. See
`dynamo_rs._persist` for what is stored and how an entry is checked before it is used.

    dynamo_rs.config.capture_cache = True     # or DYNAMO_RS_CAPTURE_CACHE=1
    dynamo_rs.cache.directory()                # DYNAMO_RS_CACHE_DIR, or under ~/.cache
    dynamo_rs.cache.clear()
"""

from __future__ import annotations


def directory() -> str:
    """Where entries are kept."""
    from dynamo_rs import _persist

    return _persist.directory()


def clear() -> None:
    """Deletes every entry."""
    from dynamo_rs import _persist

    _persist.clear()


def stats() -> dict:
    """What the cache did in this process: hits, misses, saved, not_portable, rejected."""
    from dynamo_rs import _persist

    return dict(_persist.counters)
