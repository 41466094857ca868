"""Jumping PyTorch's CPU generator ahead by n draws without drawing them.

The CPU generator is a Mersenne Twister (mt19937): a linear recurrence over GF(2) on a 19937-bit
state, x[k+624] = x[k+397] ^ twist(x[k], x[k+1]). Advancing it by J steps is multiplying the state by
T^J, and since T is a root of its characteristic polynomial phi, T^J = p(T) with p = x^J mod phi
(Haramoto, Matsumoto, Nishimura, Panneton, L'Ecuyer, "Efficient Jump Ahead for F2-Linear Random
Number Generators", 2008). So the words after the jump are an XOR of words of the *current* sequence,
selected by the coefficients of p: the cost depends on log2(J) squarings, not on J.

Measured here (2-CPU VM, numpy FFT for the dense products): a jump of 10^12 draws takes ~30 ms, the
one-time setup (phi by Berlekamp-Massey, the Barrett constant) ~70 ms. `galois` would do the same
polynomial arithmetic but compiles with numba on first use (seconds), past the 250 ms budget for a
first jump; Python integers as GF(2) polynomials plus one FFT product per squaring need nothing new.

The state's byte layout (note [CPU generator state layout]) is read from
explorer/_torch_compat/generators.py, which checks it against the running torch; the engine
(aten/src/ATen/core/MT19937RNGEngine.h) regenerates all 624 words when `--left == 0`, then returns
`state[next++]` tempered, which is mirrored here and must be re-checked on PyTorch upgrades
(tests/explorer/replay/test_mt19937.py compares every jump with the state after really drawing).
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from .._torch_compat.generators import cpu_state_layout

N, M = 624, 397  # words of state; the recurrence's middle offset
DEGREE = 19937  # bits of state: the degree of the characteristic polynomial
_UPPER, _LOWER, _MATRIX_A = np.uint32(0x80000000), np.uint32(0x7FFFFFFF), np.uint32(0x9908B0DF)
STATE_BYTES = 5056  # the size of a CPU generator state (checked by cpu_state_layout)
# Below this many words the sequence is simply generated (a few microseconds per 624 words).
_DIRECT_LIMIT = 64 * N
_FFT_SIZE = 1 << 16  # > 2 * DEGREE: the length of the FFT products
_GATHER_CHUNK = 512  # windows XORed at once: 1.3 MB of scratch instead of 25 MB


def extend(words: np.ndarray, count: int) -> np.ndarray:
    """The first `count` words of the mt19937 sequence whose first 624 words are `words`."""
    out = np.empty(max(count, len(words)), dtype=np.uint32)
    out[: len(words)] = words
    filled = len(words)
    while filled < count:
        # word k depends on words k-624, k-623 and k-227: 227 words at a time are independent
        step = min(N - M, count - filled)
        base = filled - N
        head, after, middle = out[base : base + step], out[base + 1 : base + 1 + step], out[base + M : base + M + step]
        mixed = (head & _UPPER) | (after & _LOWER)
        out[filled : filled + step] = middle ^ (mixed >> 1) ^ ((after & 1) * _MATRIX_A)
        filled += step
    return out[:count]


def seeded_words(seed: int) -> np.ndarray:
    """The 624 words `manual_seed(seed)` leaves (MT19937RNGEngine::init_with_uint32)."""
    words = [seed & 0xFFFFFFFF]
    for index in range(1, N):
        previous = words[-1]
        words.append((1812433253 * (previous ^ (previous >> 30)) + index) & 0xFFFFFFFF)
    return np.array(words, dtype=np.uint32)


# -- GF(2) polynomials as Python ints (bit i = coefficient of x^i) -------------------------------
def berlekamp_massey(bits: list[int]) -> int:
    """The connection polynomial C (C[0] = 1) of the shortest linear recurrence making `bits`."""
    connection, previous, length, gap, window = 1, 1, 0, 1, 0
    for n, bit in enumerate(bits):
        window = (window << 1) | bit  # bit i of window = bits[n - i]
        if (connection & window).bit_count() & 1:
            before = connection
            connection ^= previous << gap
            if 2 * length <= n:
                length, previous, gap = n + 1 - length, before, 1
                continue
        gap += 1
    return connection


def _bits(poly: int, count: int) -> np.ndarray:
    raw = np.frombuffer(poly.to_bytes((count + 7) // 8, "little"), dtype=np.uint8)
    return np.unpackbits(raw, bitorder="little")[:count]


def _from_bits(bits: np.ndarray) -> int:
    return int.from_bytes(np.packbits(bits, bitorder="little").tobytes(), "little")


_SPREAD = np.array([sum(((byte >> i) & 1) << (2 * i) for i in range(8)) for byte in range(256)], dtype=np.uint16)


def _square(poly: int) -> int:
    """poly(x)^2 over GF(2): every coefficient moves from i to 2i."""
    raw = np.frombuffer(poly.to_bytes(max(1, (poly.bit_length() + 7) // 8), "little"), dtype=np.uint8)
    return int.from_bytes(_SPREAD[raw].tobytes(), "little")


class _Modulus:
    """Reduction modulo phi, the characteristic polynomial: Barrett's method, one FFT product each."""

    def __init__(self) -> None:
        sequence = extend(seeded_words(5489), N + 2 * DEGREE + 8)
        connection = berlekamp_massey((sequence[N:] >> 31 & 1).tolist())
        if connection.bit_length() != DEGREE + 1:
            raise AssertionError("mt19937: the characteristic polynomial does not have degree 19937")
        self.terms = sorted(DEGREE - i for i in range(DEGREE + 1) if connection >> i & 1)  # 135 terms
        self.phi = sum(1 << t for t in self.terms)
        quotient, remainder = 0, 1 << (2 * DEGREE)  # mu = floor(x^(2*DEGREE) / phi)
        while remainder.bit_length() > DEGREE:
            shift = remainder.bit_length() - 1 - DEGREE
            quotient |= 1 << shift
            remainder ^= self.phi << shift
        self.mu_spectrum = np.fft.rfft(_bits(quotient, DEGREE + 1).astype(np.float64), _FFT_SIZE)
        self.mask = (1 << DEGREE) - 1

    def reduce(self, poly: int) -> int:
        """poly mod phi, for deg(poly) < 2 * DEGREE."""
        high = poly >> DEGREE
        if not high:
            return poly
        product = np.fft.irfft(
            np.fft.rfft(_bits(high, DEGREE).astype(np.float64), _FFT_SIZE) * self.mu_spectrum, _FFT_SIZE
        )
        quotient = _from_bits((np.rint(product).astype(np.int64) & 1).astype(np.uint8)) >> DEGREE
        for term in self.terms:  # phi is sparse: quotient * phi is 135 shifted copies
            poly ^= quotient << term
        return poly & self.mask

    def x_power(self, exponent: int) -> int:
        """x^exponent mod phi, by squaring and shifting along the exponent's bits."""
        poly = 1
        for bit in bin(exponent)[2:]:
            poly = self.reduce(_square(poly))
            if bit == "1":
                poly <<= 1
                if poly >> DEGREE:
                    poly ^= self.phi
        return poly


@functools.lru_cache(maxsize=1)
def _modulus() -> _Modulus:
    return _Modulus()


@functools.lru_cache(maxsize=256)
def _jump_terms(steps: int) -> np.ndarray:
    """The exponents i of x^(steps-1) mod phi. Cached: models repeat their shapes, so the same
    distances recur (layer after layer, rank after rank); ~80 kB each."""
    terms = np.flatnonzero(_bits(_modulus().x_power(steps - 1), DEGREE))
    terms.flags.writeable = False
    return terms


def words_after(words: np.ndarray, steps: int) -> np.ndarray:
    """Words [steps, steps + 624) of the sequence that starts with `words` (steps >= 1)."""
    if steps <= _DIRECT_LIMIT:
        return extend(words, steps + N)[steps:]
    # Every word x[t + k], k >= 1, is the same linear function of the state at t, so with
    # p = x^(steps-1) mod phi: x[steps - 1 + k] = XOR of x[i + k] over the terms i of p.
    terms = _jump_terms(steps)
    sequence = extend(words, int(terms[-1]) + 1 + N)
    windows = np.lib.stride_tricks.sliding_window_view(sequence, N)
    words = np.zeros(N, dtype=np.uint32)
    for chunk in range(0, len(terms), _GATHER_CHUNK):  # ~10^4 windows: gathered a few at a time
        words ^= np.bitwise_xor.reduce(windows[terms[chunk : chunk + _GATHER_CHUNK] + 1], axis=0)
    return words


def jump_state(state: torch.Tensor, draws: int) -> torch.Tensor:
    """The CPU generator state after `draws` more 32-bit draws from `state` (a new tensor).

    Raises ValueError for a state that is not a CPU generator state or a negative count.
    """
    if draws < 0:
        raise ValueError(f"cannot jump the generator back ({draws} draws)")
    if state.dtype != torch.uint8 or state.numel() != STATE_BYTES:
        raise ValueError(f"not a CPU generator state: {state.numel()} {state.dtype} values (want {STATE_BYTES} uint8)")
    if 0 < draws <= _DRAWN_LIMIT and _engine_draws_one_word_per_float():
        return _drawn(state, draws)
    return _jumped(state, draws)


# Up to this many draws, running the engine is cheaper than the polynomial jump (measured on the
# 2-core VM: 20,000 draws 61 µs against 445 µs, 100,000 draws 310 µs against 965 µs; they meet
# near 400,000). A model's small tensors make most jumps this short.
_DRAWN_LIMIT = 1 << 18


def _drawn(state: torch.Tensor, draws: int) -> torch.Tensor:
    """`state` after the engine itself took `draws` words: a float32 `uniform_` of that many
    elements on a private generator (one word each, `_engine_draws_one_word_per_float`)."""
    generator = torch.Generator()
    generator.set_state(state)
    torch.empty(draws, dtype=torch.float32).uniform_(generator=generator)
    return generator.get_state()


@functools.cache
def _engine_draws_one_word_per_float() -> bool:
    """Whether float32 `uniform_` takes exactly one 32-bit word per element from this torch's CPU
    generator, which `_drawn` relies on: checked once per process against the jump itself, from a
    state in the middle of a block, across block boundaries. False sends every jump the long way."""
    generator = torch.Generator()
    generator.manual_seed(20261127)
    torch.empty(311, dtype=torch.float32).uniform_(generator=generator)
    start = generator.get_state()
    return all(torch.equal(_drawn(start, draws), _jumped(start, draws)) for draws in (1, 313, 624, 625, 1900, 41000))


def _jumped(state: torch.Tensor, draws: int) -> torch.Tensor:
    """`state` after `draws` words, from the words of the sequence (note at the top)."""
    jumped = state.clone()
    if draws == 0:
        return jumped
    layout = cpu_state_layout()
    raw = jumped.numpy()
    left = int(raw[layout.left].view(np.int32)[0])
    consumed = N + 1 - left  # words of the current block already returned (624 right after seeding)
    total = consumed + draws
    if total > N:
        steps = N * ((total - 1) // N)  # the start of the block holding the last draw
        words = raw[layout.words].view(np.uint64).astype(np.uint32)
        raw[layout.words].view(np.uint64)[:] = words_after(words, steps)
        total -= steps
    raw[layout.left].view(np.int32)[0] = N + 1 - total
    raw[layout.next].view(np.uint64)[0] = total
    return jumped


def draws_between(before: torch.Tensor, after: torch.Tensor, limit: int) -> int | None:
    """How many 32-bit draws lead from CPU generator state `before` to `after`: None when `after`
    is not reached within `limit` draws, or when the cached normal samples differ (draws alone do
    not explain the change). Costs a few microseconds per 624 draws of distance."""
    layout = cpu_state_layout()
    first, last = before.numpy(), after.numpy()
    if not np.array_equal(first[layout.normal_cache], last[layout.normal_cache]):
        return None
    consumed_before = N + 1 - int(first[layout.left].view(np.int32)[0])
    consumed_after = N + 1 - int(last[layout.left].view(np.int32)[0])
    block = first[layout.words].view(np.uint64).astype(np.uint32)
    target = last[layout.words].view(np.uint64).astype(np.uint32)
    for blocks in range(limit // N + 2):
        if np.array_equal(block, target):
            distance = N * blocks + consumed_after - consumed_before
            return distance if 0 <= distance <= limit else None
        block = extend(block, 2 * N)[N:]
    return None
