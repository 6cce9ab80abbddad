"""numba typed lists built through cached compiled code.

`typed.List(items)` from Python compiles the list's methods for the item type on every run
(not cached: ~3.5 s for a tuple of uniform matrices); these cached kernels build the same list.
"""

from __future__ import annotations

from collections.abc import Sequence

from numba import njit, typed


@njit(cache=True)
def _list_of(item):
    lst = typed.List()
    lst.append(item)
    return lst


@njit(cache=True)
def _push(lst, item):
    lst.append(item)


def typed_list(items: Sequence) -> typed.List:
    """A numba typed list of `items` (all of one numba type; at least one)."""
    lst = _list_of(items[0])
    for item in items[1:]:
        _push(lst, item)
    return lst
