"""CPython's ``random.Random`` draws, bit for bit, as numba functions.

Google's ``create_pretraining_data.py`` (and therefore MLPerf's seed-12345 data) is defined by
the exact sequence of calls it makes on a ``random.Random``.  To reproduce it quickly we run
the same Mersenne Twister (MT19937) inside compiled code, starting from the state that
``random.Random(seed).getstate()`` reports, and re-implement the three derived draws the
reference uses with CPython's algorithms:

* ``random()``: two 32-bit outputs ``a, b`` → ``((a >> 5) * 2**26 + (b >> 6)) / 2**53``;
* ``_randbelow(n)``: ``k = n.bit_length()``; draw ``getrandbits(k)`` (one output ``>> (32-k)``)
  until it is ``< n`` (so ``randint(a, b) = a + _randbelow(b - a + 1)``);
* ``shuffle(x)``: for ``i`` from ``len(x) - 1`` down to 1 swap ``x[i]`` with
  ``x[_randbelow(i + 1)]``.

:func:`check_against_stdlib` compares these with the running interpreter's ``random`` so a
Python whose algorithms differ is caught before any data is written.

State is an ``int64[625]`` array: the 624 MT words followed by the position, exactly the
layout of ``getstate()[1]``.
"""

from __future__ import annotations

import random

import numpy as np
from numba import njit

_N = 624
_M = 397


def state_from_seed(seed: int) -> np.ndarray:
    """The generator state of ``random.Random(seed)`` as an ``int64[625]`` array."""
    return np.array(random.Random(seed).getstate()[1], dtype=np.int64)


@njit(cache=True)
def next_u32(state: np.ndarray) -> int:
    """The next 32-bit output of MT19937 (CPython's ``genrand_uint32``)."""
    i = state[_N]
    if i >= _N:
        for kk in range(_N):
            y = (state[kk] & 0x80000000) | (state[(kk + 1) % _N] & 0x7FFFFFFF)
            v = state[(kk + _M) % _N] ^ (y >> 1)
            if y & 1:
                v ^= 0x9908B0DF
            state[kk] = v
        i = 0
    y = state[i]
    state[_N] = i + 1
    y ^= y >> 11
    y ^= (y << 7) & 0x9D2C5680
    y ^= (y << 15) & 0xEFC60000
    y ^= y >> 18
    return y


@njit(cache=True)
def random_float(state: np.ndarray) -> float:
    """``random.Random.random()``."""
    a = next_u32(state) >> 5
    b = next_u32(state) >> 6
    return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0)


@njit(cache=True)
def randbelow(state: np.ndarray, n: int) -> int:
    """``random.Random._randbelow(n)`` for ``1 <= n < 2**32``."""
    k = 0
    while (n >> k) != 0:
        k += 1
    shift = 32 - k
    r = next_u32(state) >> shift
    while r >= n:
        r = next_u32(state) >> shift
    return r


@njit(cache=True)
def randint(state: np.ndarray, a: int, b: int) -> int:
    """``random.Random.randint(a, b)``."""
    return a + randbelow(state, b - a + 1)


@njit(cache=True)
def shuffle_inplace(state: np.ndarray, x: np.ndarray) -> None:
    """``random.Random.shuffle(x)`` on a 1-d array."""
    for i in range(x.shape[0] - 1, 0, -1):
        j = randbelow(state, i + 1)
        tmp = x[i]
        x[i] = x[j]
        x[j] = tmp


@njit(cache=True)
def _exercise(
    state: np.ndarray, out_float: np.ndarray, out_int: np.ndarray, perm: np.ndarray
) -> None:
    for i in range(out_float.shape[0]):
        out_float[i] = random_float(state)
        out_int[i] = randint(state, 0, i)
    shuffle_inplace(state, perm)


def check_against_stdlib(seed: int = 12345, draws: int = 257) -> None:
    """Raise ``RuntimeError`` if these draws differ from this interpreter's ``random``."""
    rng = random.Random(seed)
    expected_float = []
    expected_int = []
    for i in range(draws):
        expected_float.append(rng.random())
        expected_int.append(rng.randint(0, i))
    expected_perm = list(range(draws))
    rng.shuffle(expected_perm)
    state = state_from_seed(seed)
    out_float = np.empty(draws, dtype=np.float64)
    out_int = np.empty(draws, dtype=np.int64)
    perm = np.arange(draws, dtype=np.int64)
    _exercise(state, out_float, out_int, perm)
    same = (
        out_float.tolist() == expected_float
        and out_int.tolist() == expected_int
        and perm.tolist() == expected_perm
        and tuple(state.tolist()) == rng.getstate()[1]
    )
    if not same:
        raise RuntimeError(
            "this Python's random module draws differently from omnibert's compiled copy of "
            "CPython's algorithms, so reference-exact data cannot be produced; use CPython 3.10-3.13."
        )
