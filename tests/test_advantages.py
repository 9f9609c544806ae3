"""Group advantages against hand-computed values and an independent per-group loop."""

import math

import pytest
import torch

from stabledrl_bench.core.advantages import (
    ADVANTAGES,
    group_mean_advantage,
    group_zscore_advantage,
    leave_one_out_advantage,
    reward_zscore_advantage,
)

# Non-contiguous, unordered ids: group 3 = {0, 2, 4}, group 9 = {1, 3}, group 42 = {5} (a singleton).
IDS = torch.tensor([3, 9, 3, 9, 3, 42])
REWARDS = torch.tensor([1.0, 2.0, 0.0, 4.0, 2.0, 7.0])


def test_group_mean_hand_values() -> None:
    # group 3: mean 1 -> 0, -1, 1; group 9: mean 3 -> -1, 1; singleton -> 0
    expected = torch.tensor([0.0, -1.0, -1.0, 1.0, 1.0, 0.0])
    torch.testing.assert_close(group_mean_advantage(REWARDS, IDS), expected)


def test_leave_one_out_hand_values() -> None:
    # group 3: 1 - (0+2)/2 = 0, 0 - (1+2)/2 = -1.5, 2 - (1+0)/2 = 1.5; group 9: 2 - 4, 4 - 2; singleton -> 0
    expected = torch.tensor([0.0, -2.0, -1.5, 2.0, 1.5, 0.0])
    torch.testing.assert_close(leave_one_out_advantage(REWARDS, IDS), expected)


def test_leave_one_out_is_the_official_lines_to_the_bit() -> None:
    """``coupled_grpo.py`` lines 557-561 (ESPO's 706-710 are the same), transcribed: baseline = (sum - r) / (G - 1),
    A = r - baseline. Eighths (Sudoku's cell fractions) keep the group sum exact in any summation order, while
    (G r - S) / (G - 1), the same number algebraically, rounds differently in 3 of these 10 entries: the check can
    fail."""
    rewards = torch.tensor([8, 2, 8, 2, 8, 5, 7, 8, 6, 0], dtype=torch.float32) / 8
    grouped = rewards.view(-1, 10)
    baseline = (grouped.sum(dim=1, keepdim=True) - grouped) / (10 - 1)
    official = (grouped - baseline).view(-1)
    ours = leave_one_out_advantage(rewards, torch.zeros(10, dtype=torch.long))
    assert ours.dtype == torch.float32 and torch.equal(ours, official)
    algebraic = (10 * rewards - rewards.sum()) / 9
    assert not torch.equal(algebraic, official)


def _loop_advantages(rewards: list[float], ids: list[int]) -> tuple[list[float], list[float]]:
    mean_adv, loo_adv = [], []
    for i, g in enumerate(ids):
        members = [rewards[j] for j in range(len(ids)) if ids[j] == g]
        others = [rewards[j] for j in range(len(ids)) if ids[j] == g and j != i]
        mean_adv.append(rewards[i] - sum(members) / len(members))
        loo_adv.append(rewards[i] - sum(others) / len(others) if others else 0.0)
    return mean_adv, loo_adv


def test_against_loop_on_random_groups() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        ids = torch.randint(-5, 5, (12,), generator=gen)
        rewards = torch.randn(12, generator=gen, dtype=torch.float64)
        mean_adv, loo_adv = _loop_advantages(rewards.tolist(), ids.tolist())
        torch.testing.assert_close(group_mean_advantage(rewards, ids), torch.tensor(mean_adv, dtype=torch.float64))
        torch.testing.assert_close(leave_one_out_advantage(rewards, ids), torch.tensor(loo_adv, dtype=torch.float64))


def test_zscore_hand_values_and_accuracy_filter() -> None:
    correct = torch.tensor(
        [1, 0, 0, 0, 0]  # p = 0.2 (kept, bound inclusive), std 0.4: 0.8/0.4 = 2, -0.2/0.4 = -0.5
        + [1, 1, 1, 1]  # p = 1: all equal -> 0, dropped
        + [1, 1, 1, 1, 0]  # p = 0.8 (kept): 0.2/0.4 = 0.5, -0.8/0.4 = -2
        + [1, 0, 0]  # p = 1/3, std sqrt(2)/3: sqrt(2), -1/sqrt(2)
        + [1]
        + [0] * 9,  # p = 0.1: dropped although its std > 0
        dtype=torch.bool,
    )
    ids = torch.tensor([0] * 5 + [1] * 4 + [2] * 5 + [3] * 3 + [4] * 10)
    adv, keep = group_zscore_advantage(correct, ids)
    s2 = math.sqrt(2)
    expected = [2, -0.5, -0.5, -0.5, -0.5] + [0] * 4 + [0.5] * 4 + [-2] + [s2, -1 / s2, -1 / s2] + [3] + [-1 / 3] * 9
    torch.testing.assert_close(adv, torch.tensor(expected, dtype=torch.float32))
    assert keep.tolist() == [True] * 5 + [False] * 4 + [True] * 5 + [True] * 3 + [False] * 10


def test_zscore_custom_range_and_bad_input() -> None:
    _, keep = group_zscore_advantage(torch.tensor([1.0, 1.0]), torch.tensor([0, 0]), keep_range=(0.0, 1.0))
    assert keep.all()
    with pytest.raises(ValueError, match="binary"):
        group_zscore_advantage(torch.tensor([0.5, 1.0]), torch.tensor([0, 0]))
    with pytest.raises(ValueError, match="equal length"):
        group_mean_advantage(torch.zeros(3), torch.zeros(2, dtype=torch.long))


@pytest.mark.parametrize("rule", [group_mean_advantage, leave_one_out_advantage])
@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.bfloat16, torch.float32),
        (torch.float16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
        (torch.int64, torch.float32),
    ],
)
def test_advantages_compute_in_at_least_the_input_precision(rule, dtype: torch.dtype, expected: torch.dtype) -> None:
    """promote_types(dtype, float32): half precision and integer rewards are upcast before the group means (integer
    rewards 1, 2 give -0.5, 0.5, not a truncated integer mean), float64 stays float64."""
    rewards = torch.tensor([1, 2, 0, 4, 2, 7, 1, 2]).to(dtype)
    ids = torch.cat([IDS, torch.tensor([11, 11])])
    out = rule(rewards, ids)
    assert out.dtype == expected
    assert torch.equal(out, rule(rewards.to(expected), ids))
    assert out[-2:].tolist() == ([-0.5, 0.5] if rule is group_mean_advantage else [-1.0, 1.0])


@pytest.mark.parametrize(
    ("dtype", "expected"),
    [
        (torch.bool, torch.float32),
        (torch.bfloat16, torch.float32),
        (torch.float32, torch.float32),
        (torch.float64, torch.float64),
    ],
)
def test_zscore_returns_at_least_the_input_precision(dtype: torch.dtype, expected: torch.dtype) -> None:
    correct, ids = torch.tensor([1, 0, 0, 1, 1]).to(dtype), torch.tensor([0, 0, 0, 1, 1])
    adv, _ = group_zscore_advantage(correct, ids)
    assert adv.dtype == expected
    torch.testing.assert_close(
        adv, torch.tensor([math.sqrt(2), -1 / math.sqrt(2), -1 / math.sqrt(2), 0, 0]).to(expected)
    )


def test_reward_zscore_hand_values() -> None:
    # group 0: [1, 0, 0], mean 1/3, sample std sqrt((4/9 + 1/9 + 1/9) / 2) = sqrt(1/3) = 0.5773503
    #          -> (2/3) / 0.5774503 = 1.1544999, (-1/3) / 0.5774503 = -0.5772500
    # group 1: [1, 2], std sqrt(0.5) = 0.7071068 -> -+0.5 / 0.7072068 = -+0.7070068; group 2 (equal) -> 0;
    # group 3 (a singleton) -> 0
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 2.0, 3.0, 3.0, 5.0])
    ids = torch.tensor([0, 0, 0, 1, 1, 2, 2, 3])
    expected = [1.1544999, -0.5772500, -0.5772500, -0.7070068, 0.7070068, 0.0, 0.0, 0.0]
    adv = reward_zscore_advantage(rewards, ids)
    assert all(math.isclose(a, e, abs_tol=1e-6) for a, e in zip(adv.tolist(), expected, strict=True))
    # verl's epsilon, through the registered rule (every group kept)
    adv, keep = ADVANTAGES.get("reward_zscore")(rewards, ids, None, epsilon=1e-6)
    assert math.isclose(adv[0].item(), (2 / 3) / (math.sqrt(1 / 3) + 1e-6), rel_tol=1e-6) and bool(keep.all())


def test_reward_zscore_against_a_loop() -> None:
    gen = torch.Generator().manual_seed(0)
    for _ in range(10):
        ids = torch.randint(0, 4, (12,), generator=gen)
        rewards = torch.randn(12, generator=gen, dtype=torch.float64)
        expected = []
        for i, g in enumerate(ids.tolist()):
            members = [r for r, h in zip(rewards.tolist(), ids.tolist(), strict=True) if h == g]
            mean = sum(members) / len(members)
            std = math.sqrt(sum((m - mean) ** 2 for m in members) / (len(members) - 1)) if len(members) > 1 else 0
            expected.append((rewards[i].item() - mean) / (std + 1e-4) if len(members) > 1 else 0.0)
        torch.testing.assert_close(reward_zscore_advantage(rewards, ids), torch.tensor(expected, dtype=torch.float64))


def test_rules_that_compare_within_a_group_refuse_groups_of_one(monkeypatch) -> None:
    """Every built-in rule gives a singleton group 0 (checked on values), so it declares min_group_size 2 and a method
    using it refuses one completion per prompt, in `train` and before `reproduce` builds anything; a plugin rule that
    declares nothing is not refused on a guess."""
    import dataclasses

    from stabledrl_bench.core.advantages import ADVANTAGES, min_group_size
    from stabledrl_bench.core.baseline import build_baseline
    from stabledrl_bench.errors import UserError
    from stabledrl_bench.experiments import comparison as comparison_module

    singletons = torch.tensor([0, 1, 2])
    for rule in ADVANTAGES.values():
        advantages, _ = rule(torch.tensor([0.0, 1.0, 5.0]), singletons, torch.tensor([0.0, 1.0, 1.0]))
        assert torch.all(advantages == 0) and min_group_size(rule) == 2
    assert min_group_size(lambda rewards, group_ids, correct=None: (rewards, group_ids > 0)) == 1
    with pytest.raises(UserError, match=r"num_generations=1: trado .* rule 'group_zscore'\), which needs at least 2"):
        build_baseline("trado").require_groups(1)
    build_baseline("trado").require_groups(2)

    choose = comparison_module.choose_preset

    def one_completion(*args):
        preset = choose(*args)
        return dataclasses.replace(preset, budget=dataclasses.replace(preset.budget, num_generations=1))

    monkeypatch.setattr(comparison_module, "choose_preset", one_completion)
    with pytest.raises(UserError, match=r"budget\.num_generations=1: grpo compares"):
        comparison_module.comparison("table1", preset="smoke")
