"""`explorer.replay.mt19937`: a jump of n draws equals the CPU generator after really drawing n."""

from __future__ import annotations

import pytest
import torch

from explorer.replay import mt19937
from explorer.replay.mt19937 import (
    DEGREE,
    _engine_draws_one_word_per_float,
    _jumped,
    _modulus,
    berlekamp_massey,
    extend,
    jump_state,
    seeded_words,
)

SIZES = (0, 1, 15, 16, 17, 623, 624, 625, 1023, 1248, 4096 + 3, 64 * 624 + 5, 100_003, 3_000_017)
ALREADY_DRAWN = (0, 1, 5, 623, 624, 1000)


def state_after_draws(seed: int, already: int, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(state after `already` draws, state after `already + n`), by really drawing float32 uniforms
    (one 32-bit draw each)."""
    generator = torch.Generator().manual_seed(seed)
    torch.empty(already).uniform_(generator=generator)
    before = generator.get_state()
    torch.empty(n).uniform_(generator=generator)
    return before, generator.get_state()


@pytest.mark.parametrize("already", ALREADY_DRAWN)
@pytest.mark.parametrize("n", SIZES)
def test_jump_equals_the_state_after_drawing(already: int, n: int) -> None:
    before, after = state_after_draws(11, already, n)
    jumped = jump_state(before, n)
    if n == 0:
        assert jumped.equal(before)
    else:
        assert jumped.equal(after)


@pytest.mark.parametrize("already", ALREADY_DRAWN)
@pytest.mark.parametrize("n", SIZES)
def test_the_words_jump_equals_the_state_after_drawing_at_every_distance(already: int, n: int) -> None:
    # jump_state draws short distances with the engine itself; the words path is checked here too
    before, after = state_after_draws(11, already, n)
    assert _jumped(before, n).equal(after if n else before)


def test_short_jumps_draw_only_where_the_engine_takes_one_word_per_float(monkeypatch) -> None:
    assert _engine_draws_one_word_per_float()  # this torch's float32 uniform_: one word per element
    before, after = state_after_draws(5, 100, 1000)

    def one_word_too_many(state: torch.Tensor, draws: int) -> torch.Tensor:
        generator = torch.Generator()
        generator.set_state(state)
        torch.empty(draws + 1).uniform_(generator=generator)
        return generator.get_state()

    monkeypatch.setattr(mt19937, "_drawn", one_word_too_many)
    _engine_draws_one_word_per_float.cache_clear()
    try:
        assert not _engine_draws_one_word_per_float()
        assert jump_state(before, 1000).equal(after)  # the words path, not the wrong engine
    finally:
        _engine_draws_one_word_per_float.cache_clear()


def test_jumps_compose_and_the_next_values_are_eager_ones() -> None:
    before, _ = state_after_draws(3, 17, 0)
    far = 10**9 + 12345
    generator = torch.Generator()
    generator.set_state(jump_state(jump_state(before, far - 700_001), 700_001))
    direct = torch.Generator()
    direct.set_state(jump_state(before, far))
    assert torch.equal(torch.rand(1000, generator=generator), torch.rand(1000, generator=direct))


def test_a_long_jump_lands_where_drawing_lands() -> None:
    # 2 * 10^8 float64 uniforms would need 1.6 GB; draw 5 * 10^7 float32 in 10 chunks instead
    before, _ = state_after_draws(5, 9, 0)
    generator = torch.Generator()
    generator.set_state(before)
    chunk = torch.empty(5_000_000)
    for _ in range(10):
        chunk.uniform_(generator=generator)
    assert jump_state(before, 50_000_000).equal(generator.get_state())


def test_the_cached_normal_sample_travels_unchanged() -> None:
    generator = torch.Generator().manual_seed(8)
    torch.empty(3).normal_(generator=generator)  # scalar path: leaves a cached sample
    before = generator.get_state()
    torch.empty(10_000).uniform_(generator=generator)
    after = generator.get_state()
    assert not before[5016:].equal(torch.zeros_like(before[5016:]))
    assert jump_state(before, 10_000).equal(after)


def test_the_characteristic_polynomial_is_the_twisters() -> None:
    modulus = _modulus()
    assert len(modulus.terms) == 135  # MT19937's characteristic polynomial has 135 terms
    assert modulus.terms[0] == 0 and modulus.terms[-1] == DEGREE
    # a second bit of the sequence has the same minimal polynomial
    sequence = extend(seeded_words(1), 624 + 2 * DEGREE)
    connection = berlekamp_massey((sequence[624:] >> 7 & 1).tolist())
    assert sorted(DEGREE - i for i in range(DEGREE + 1) if connection >> i & 1) == modulus.terms


def test_seeded_words_are_manual_seeds() -> None:
    torch.manual_seed(123)
    words = torch.get_rng_state()[24:24 + 8 * 624].view(torch.int64).numpy().astype("uint32")
    assert (words == seeded_words(123)).all()


def test_bad_input_is_refused() -> None:
    with pytest.raises(ValueError, match="cannot jump the generator back"):
        jump_state(torch.get_rng_state(), -1)
    with pytest.raises(ValueError, match="not a CPU generator state"):
        jump_state(torch.zeros(16, dtype=torch.uint8), 5)
