"""The pool view's free capacity is counted in the units quotas charge (a MIG slice is its
dominant share of its GPU)."""

from fractions import Fraction

import pytest

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.model import Gpu, MigInstance

A100 = default_catalog().model("A100-80GB")


def mig_gpu(*held: tuple[str, int], free: tuple[tuple[str, int], ...] = ()) -> Gpu:
    instances = [MigInstance(p, s, lease="L") for p, s in held]
    instances += [MigInstance(p, s) for p, s in free]
    return Gpu("GPU-1", 0, A100, mig_enabled=True, instances=instances)


@pytest.mark.parametrize(
    ("gpu", "free"),
    [
        (mig_gpu(), Fraction(1)),
        (mig_gpu(*[("1g.10gb", s) for s in range(6)], free=(("1g.10gb", 6),)), Fraction(1, 7)),
        (mig_gpu(("3g.40gb", 0)), Fraction(1, 2)),  # 3g.40gb is charged 1/2
        (mig_gpu(("1g.10gb", 0), ("2g.20gb", 2)), 1 - Fraction(1, 7) - Fraction(2, 7)),
        (mig_gpu(("4g.40gb", 0), ("3g.40gb", 4)), Fraction(0)),  # 4/7 + 1/2 > 1: full
    ],
)
def test_mig_free_units_are_one_less_the_held_dominant_shares(gpu, free):
    assert gpu.free_units() == pytest.approx(float(free))


def test_plain_and_unschedulable_gpus():
    h100 = default_catalog().model("H100-80GB")
    assert Gpu("GPU-2", 0, h100).free_units() == 1.0
    assert Gpu("GPU-3", 0, h100, cordoned=True).free_units() == 0.0
    assert Gpu("GPU-4", 0, A100, mig_enabled=True, healthy=False).free_units() == 0.0
