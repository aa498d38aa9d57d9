"""NVIDIA's MIG combination rules, checked against ``validate_mig_layout`` and ``mig_new_starts``.

The expectations come from NVIDIA's own tables, not from the shipped JSON (see
``shared/reference/mig_facts.md`` §1.2-§1.4):

* 7 compute × 8 memory slice GPUs (A100, H100, H100 NVL, H200) share one ``-lgipp`` table::

      1g       {0,1,2,3,4,5,6}:1     1g+me    {0,1,2,3,4,5,6}:1
      1g.2x    {0,2,4,6}:2           2g       {0,2,4}:2
      3g       {0,4}:4               4g       {0}:4            7g  {0}:8

* A30 (4 × 4)::

      1g {0,1,2,3}:1   1g+me {0,1,2,3}:1   2g {0,2}:2   2g+me {0,2}:2   4g {0}:4

* No two instances may overlap on memory slices; per-profile caps (``-lgip`` "Instances Total");
  at most one media-extension (``+me``) instance per GPU; 4g + 3g is legal since R510.

Layouts below are written with *roles* (``"1g"``, ``"1g.2x"``, ``"3g"``, …) that each model
maps to its own profile names.
"""

from __future__ import annotations

import itertools

import pytest

from jupyterhub_gpupool.pool.catalog import default_catalog
from jupyterhub_gpupool.pool.errors import MigLayoutError, PoolError, UnknownProfile
from jupyterhub_gpupool.pool.miglayout import mig_new_starts, validate_mig_layout

CATALOG = default_catalog()

# Role -> profile name per model (MIG user guide tables, mig_facts.md §1.5).
ROLES_7x8 = {
    "A100-40GB": {
        "1g": "1g.5gb",
        "1g+me": "1g.5gb+me",
        "1g.2x": "1g.10gb",
        "2g": "2g.10gb",
        "3g": "3g.20gb",
        "4g": "4g.20gb",
        "7g": "7g.40gb",
    },
    "A100-80GB": {
        "1g": "1g.10gb",
        "1g+me": "1g.10gb+me",
        "1g.2x": "1g.20gb",
        "2g": "2g.20gb",
        "3g": "3g.40gb",
        "4g": "4g.40gb",
        "7g": "7g.80gb",
    },
    "H100-80GB": {
        "1g": "1g.10gb",
        "1g+me": "1g.10gb+me",
        "1g.2x": "1g.20gb",
        "2g": "2g.20gb",
        "3g": "3g.40gb",
        "4g": "4g.40gb",
        "7g": "7g.80gb",
    },
    "H100-NVL-94GB": {
        "1g": "1g.12gb",
        "1g+me": "1g.12gb+me",
        "1g.2x": "1g.24gb",
        "2g": "2g.24gb",
        "3g": "3g.47gb",
        "4g": "4g.47gb",
        "7g": "7g.94gb",
    },
    "H200-141GB": {
        "1g": "1g.18gb",
        "1g+me": "1g.18gb+me",
        "1g.2x": "1g.35gb",
        "2g": "2g.35gb",
        "3g": "3g.71gb",
        "4g": "4g.71gb",
        "7g": "7g.141gb",
    },
}
ROLES_A30 = {
    "A30-24GB": {
        "1g": "1g.6gb",
        "1g+me": "1g.6gb+me",
        "2g": "2g.12gb",
        "2g+me": "2g.12gb+me",
        "4g": "4g.24gb",
    }
}
ROLES = {**ROLES_7x8, **ROLES_A30}
MODELS_7x8 = list(ROLES_7x8)
ALL_MODELS = list(ROLES)

# NVIDIA's -lgipp tables: role -> (starts, size in memory slices, compute slices, max count).
TABLE_7x8 = {
    "1g": ((0, 1, 2, 3, 4, 5, 6), 1, 1, 7),
    "1g+me": ((0, 1, 2, 3, 4, 5, 6), 1, 1, 1),
    "1g.2x": ((0, 2, 4, 6), 2, 1, 4),
    "2g": ((0, 2, 4), 2, 2, 3),
    "3g": ((0, 4), 4, 3, 2),
    "4g": ((0,), 4, 4, 1),
    "7g": ((0,), 8, 7, 1),
}
TABLE_A30 = {
    "1g": ((0, 1, 2, 3), 1, 1, 4),
    "1g+me": ((0, 1, 2, 3), 1, 1, 1),
    "2g": ((0, 2), 2, 2, 2),
    "2g+me": ((0, 2), 2, 2, 1),
    "4g": ((0,), 4, 4, 1),
}


def table_for(model_name):
    return TABLE_A30 if model_name in ROLES_A30 else TABLE_7x8


def layout(model_name, roles):
    """``[(role, start), …]`` -> ``[(profile name, start), …]`` for that model."""
    names = ROLES[model_name]
    return [(names[role], start) for role, start in roles]


def is_valid(model, instances):
    try:
        validate_mig_layout(model, instances)
    except MigLayoutError:
        return False
    return True


# ---------------------------------------------------------------------------------------------
# The catalog agrees with NVIDIA's tables (otherwise every rule below tests the wrong data)


@pytest.mark.parametrize("model_name", ALL_MODELS)
def test_profile_names_and_geometry_match_nvidia_tables(model_name):
    model = CATALOG.model(model_name)
    table = table_for(model_name)
    assert set(model.profiles) == set(ROLES[model_name].values())
    assert (model.compute_slices, model.memory_slices) == (
        (4, 4) if model_name in ROLES_A30 else (7, 8)
    )
    for role, (starts, size, compute, max_count) in table.items():
        p = model.profile(ROLES[model_name][role])
        assert p.starts == starts, role
        assert p.size == p.memory_slices == size, role
        assert p.compute_slices == compute, role
        assert p.max_count == max_count, role
        assert p.media_extensions == role.endswith("+me"), role


# ---------------------------------------------------------------------------------------------
# Valid combinations

VALID_7x8 = {
    "7g alone": [("7g", 0)],
    "4g + 3g (R510+)": [("4g", 0), ("3g", 4)],
    "3g + 4g, 3g listed first": [("3g", 4), ("4g", 0)],
    "3g + 3g": [("3g", 0), ("3g", 4)],
    "7 x 1g": [("1g", s) for s in range(7)],
    "3-2-1-1 geometry (MIG guide example 2)": [("3g", 4), ("2g", 0), ("1g", 2), ("1g", 3)],
    "3-2-1-1 in the order the driver rejects without placements": [
        ("1g", 2),
        ("1g", 3),
        ("2g", 0),
        ("3g", 4),
    ],
    "3g@0 + 2g@4 + 1g@6 (slice 7 unused)": [("3g", 0), ("2g", 4), ("1g", 6)],
    "3g@0 + 2 x 1g.2x": [("3g", 0), ("1g.2x", 4), ("1g.2x", 6)],
    "3 x 2g + 1g.2x": [("2g", 0), ("2g", 2), ("2g", 4), ("1g.2x", 6)],
    "3 x 2g + 1g": [("2g", 0), ("2g", 2), ("2g", 4), ("1g", 6)],
    "2 x 2g + 3 x 1g": [("2g", 0), ("2g", 2), ("1g", 4), ("1g", 5), ("1g", 6)],
    "2g + 5 x 1g": [("2g", 0), ("1g", 2), ("1g", 3), ("1g", 4), ("1g", 5), ("1g", 6)],
    "2g@4 between 1g": [("1g", 0), ("1g", 1), ("1g", 2), ("1g", 3), ("2g", 4), ("1g", 6)],
    "4 x 1g.2x": [("1g.2x", 0), ("1g.2x", 2), ("1g.2x", 4), ("1g.2x", 6)],
    "1g.2x + 2g + 1g mix": [("1g.2x", 0), ("2g", 2), ("1g", 4), ("1g", 5), ("1g.2x", 6)],
    "4g + 2g + 1g.2x": [("4g", 0), ("2g", 4), ("1g.2x", 6)],
    "4g + 3 x 1g": [("4g", 0), ("1g", 4), ("1g", 5), ("1g", 6)],
    "4g + 2 x 1g.2x": [("4g", 0), ("1g.2x", 4), ("1g.2x", 6)],
    "1g+me + 6 x 1g": [("1g+me", 0), *[("1g", s) for s in range(1, 7)]],
    "6 x 1g + 1g+me at 6": [*[("1g", s) for s in range(6)], ("1g+me", 6)],
    "1g+me + 3g + 2g + 1g": [("1g+me", 3), ("3g", 4), ("2g", 0), ("1g", 2)],
    "4g + 2g + 1g+me": [("4g", 0), ("2g", 4), ("1g+me", 6)],
    "empty GPU": [],
}

VALID_A30 = {
    "4g alone": [("4g", 0)],
    "2g + 2g": [("2g", 0), ("2g", 2)],
    "2g + 1g + 1g": [("2g", 0), ("1g", 2), ("1g", 3)],
    "1g + 1g + 2g@2": [("1g", 0), ("1g", 1), ("2g", 2)],
    "4 x 1g": [("1g", s) for s in range(4)],
    "1g+me + 3 x 1g": [("1g+me", 0), ("1g", 1), ("1g", 2), ("1g", 3)],
    "2g+me + 2g": [("2g+me", 0), ("2g", 2)],
    "2g + 2g+me@2": [("2g", 0), ("2g+me", 2)],
    "2g+me + 1g + 1g": [("2g+me", 0), ("1g", 2), ("1g", 3)],
    "1g+me + 1g + 2g": [("1g+me", 2), ("1g", 3), ("2g", 0)],
    "empty GPU": [],
}


@pytest.mark.parametrize("model_name", MODELS_7x8)
@pytest.mark.parametrize("case", list(VALID_7x8))
def test_valid_7x8_layouts(model_name, case):
    model = CATALOG.model(model_name)
    validate_mig_layout(model, layout(model_name, VALID_7x8[case]))


@pytest.mark.parametrize("case", list(VALID_A30))
def test_valid_a30_layouts(case):
    model = CATALOG.model("A30-24GB")
    validate_mig_layout(model, layout("A30-24GB", VALID_A30[case]))


@pytest.mark.parametrize("model_name", ALL_MODELS)
def test_every_documented_placement_is_valid_alone(model_name):
    model = CATALOG.model(model_name)
    for role, (starts, *_) in table_for(model_name).items():
        for start in starts:
            validate_mig_layout(model, layout(model_name, [(role, start)]))


@pytest.mark.parametrize(
    "model_name,case",
    [(m, c) for m in MODELS_7x8 for c in ("3-2-1-1 geometry (MIG guide example 2)", "4 x 1g.2x")]
    + [("A30-24GB", "2g+me + 1g + 1g")],
)
def test_validity_does_not_depend_on_listing_order(model_name, case):
    # Explicit placements make creation order irrelevant (the MIG guide's "3g first" issue is
    # about the placement-less create call); every order of a valid layout is valid.
    model = CATALOG.model(model_name)
    cases = VALID_A30 if model_name in ROLES_A30 else VALID_7x8
    for order in itertools.permutations(layout(model_name, cases[case])):
        validate_mig_layout(model, list(order))


# ---------------------------------------------------------------------------------------------
# Invalid combinations

INVALID_7x8 = {
    "3g@0 overlaps 2g@2": [("3g", 0), ("2g", 2)],
    "2g@2 overlaps 3g@0 (other order)": [("2g", 2), ("3g", 0)],
    "2g cannot start at 6": [("2g", 6)],
    "2g cannot start at 1": [("2g", 1)],
    "1g cannot start at 7": [("1g", 7)],
    "1g+me cannot start at 7": [("1g+me", 7)],
    "1g.2x cannot start at 1": [("1g.2x", 1)],
    "1g.2x cannot start at 7": [("1g.2x", 7)],
    "3g cannot start at 2": [("3g", 2)],
    "4g cannot start at 4": [("4g", 4)],
    "7g cannot start at 1": [("7g", 1)],
    "8th 1g": [*[("1g", s) for s in range(7)], ("1g", 7)],
    "two 4g": [("4g", 0), ("4g", 0)],
    "three 3g": [("3g", 0), ("3g", 4), ("3g", 0)],
    "two 1g+me": [("1g+me", 0), ("1g+me", 1)],
    "1g+me twice beside 1g": [("1g", 0), ("1g+me", 1), ("1g+me", 2)],
    "4g@0 + 3g@0": [("4g", 0), ("3g", 0)],
    "3g@0 + 4g@0": [("3g", 0), ("4g", 0)],
    "4g + 2g@2": [("4g", 0), ("2g", 2)],
    "4g + 1g@3": [("4g", 0), ("1g", 3)],
    "4g + 3g + 1g": [("4g", 0), ("3g", 4), ("1g", 5)],
    "3g@4 + 1g.2x@6": [("3g", 4), ("1g.2x", 6)],
    "1g@6 + 1g.2x@6": [("1g", 6), ("1g.2x", 6)],
    "same 1g twice": [("1g", 3), ("1g", 3)],
    "2g@2 + 1g.2x@2": [("2g", 2), ("1g.2x", 2)],
    "3 x 2g + 1g.2x + 1g": [("2g", 0), ("2g", 2), ("2g", 4), ("1g.2x", 6), ("1g", 6)],
    **{
        f"7g + {role}@{starts[0]}": [("7g", 0), (role, starts[0])]
        for role, (starts, *_) in TABLE_7x8.items()
    },
    **{
        f"{role}@{starts[-1]} + 7g": [(role, starts[-1]), ("7g", 0)]
        for role, (starts, *_) in TABLE_7x8.items()
    },
}

INVALID_A30 = {
    "2g cannot start at 1": [("2g", 1)],
    "2g+me cannot start at 3": [("2g+me", 3)],
    "1g cannot start at 4": [("1g", 4)],
    "4g cannot start at 2": [("4g", 2)],
    "5th 1g": [*[("1g", s) for s in range(4)], ("1g", 4)],
    "2g+me twice": [("2g+me", 0), ("2g+me", 2)],
    "1g+me twice": [("1g+me", 0), ("1g+me", 1)],
    "1g+me and 2g+me together": [("1g+me", 0), ("2g+me", 2)],
    "2g+me and 1g+me together": [("2g+me", 0), ("1g+me", 3)],
    "2g@0 overlaps 1g@1": [("2g", 0), ("1g", 1)],
    "2g+me@2 overlaps 1g@3": [("1g", 3), ("2g+me", 2)],
    "two 4g": [("4g", 0), ("4g", 0)],
    **{f"4g + {role}@{s}": [("4g", 0), (role, s)] for role in ("1g", "1g+me") for s in range(4)},
    **{f"4g + {role}@{s}": [("4g", 0), (role, s)] for role in ("2g", "2g+me") for s in (0, 2)},
}


@pytest.mark.parametrize("model_name", MODELS_7x8)
@pytest.mark.parametrize("case", list(INVALID_7x8))
def test_invalid_7x8_layouts(model_name, case):
    model = CATALOG.model(model_name)
    with pytest.raises(MigLayoutError) as info:
        validate_mig_layout(model, layout(model_name, INVALID_7x8[case]))
    assert info.value.code == "invalid_mig_layout"
    assert info.value.field in ("start", "profile")


@pytest.mark.parametrize("case", list(INVALID_A30))
def test_invalid_a30_layouts(case):
    model = CATALOG.model("A30-24GB")
    with pytest.raises(MigLayoutError) as info:
        validate_mig_layout(model, layout("A30-24GB", INVALID_A30[case]))
    assert info.value.field in ("start", "profile")


@pytest.mark.parametrize("model_name", ALL_MODELS)
def test_only_one_media_extension_instance_per_gpu(model_name):
    model = CATALOG.model(model_name)
    me = [role for role in ROLES[model_name] if role.endswith("+me")]
    table = table_for(model_name)
    # Every pair of +me instances on disjoint slices is rejected, whatever the profiles.
    for a, b in itertools.product(me, repeat=2):
        for sa, sb in itertools.product(table[a][0], table[b][0]):
            if sa + table[a][1] <= sb:
                with pytest.raises(MigLayoutError) as info:
                    validate_mig_layout(model, layout(model_name, [(a, sa), (b, sb)]))
                assert info.value.field == "profile"


def test_max_count_is_enforced_apart_from_geometry():
    # On NVIDIA's tables geometry alone caps most profiles, so check the per-profile cap
    # itself on a model whose 1g cap is artificially low.
    from dataclasses import replace

    base = CATALOG.model("A100-80GB")
    capped = replace(
        base, profiles={**base.profiles, "1g.10gb": replace(base.profile("1g.10gb"), max_count=2)}
    )
    validate_mig_layout(capped, [("1g.10gb", 0), ("1g.10gb", 1)])
    with pytest.raises(MigLayoutError) as info:
        validate_mig_layout(capped, [("1g.10gb", 0), ("1g.10gb", 1), ("1g.10gb", 2)])
    assert info.value.field == "profile"
    assert mig_new_starts(capped, [("1g.10gb", 0), ("1g.10gb", 1)], "1g.10gb") == ()
    assert mig_new_starts(capped, [("1g.10gb", 0)], "1g.10gb") == (1, 2, 3, 4, 5, 6)


def test_non_mig_model_has_no_layout():
    with pytest.raises(MigLayoutError) as info:
        validate_mig_layout(CATALOG.model("T4"), [])
    assert info.value.field == "model"


def test_unknown_profile_in_a_layout_is_named():
    model = CATALOG.model("A100-80GB")
    with pytest.raises(UnknownProfile) as info:
        validate_mig_layout(model, [("5g.50gb", 0)])
    assert "1g.10gb" in info.value.allowed


# ---------------------------------------------------------------------------------------------
# Error shape


def test_invalid_start_error_lists_valid_starts():
    model = CATALOG.model("H100-80GB")
    with pytest.raises(MigLayoutError) as info:
        validate_mig_layout(model, [("2g.20gb", 6)])
    err = info.value
    assert err.code == "invalid_mig_layout"
    assert err.field == "start"
    assert err.allowed == [0, 2, 4]
    assert "2g.20gb" in str(err)
    body = err.to_dict()
    assert set(body) == {"error"}
    assert body["error"]["code"] == "invalid_mig_layout"
    assert body["error"]["field"] == "start"
    assert body["error"]["allowed"] == [0, 2, 4]
    assert "2g.20gb" in body["error"]["message"]


def test_overlap_error_shape():
    model = CATALOG.model("A30-24GB")
    with pytest.raises(MigLayoutError) as info:
        validate_mig_layout(model, [("4g.24gb", 0), ("1g.6gb", 3)])
    body = info.value.to_dict()["error"]
    assert body["code"] == "invalid_mig_layout"
    assert body["field"] == "start"
    assert "1g.6gb" in body["message"]
    assert isinstance(info.value, PoolError)


# ---------------------------------------------------------------------------------------------
# Exhaustive: every reachable layout, mig_new_starts == the starts validate_mig_layout accepts


def _explore(model):
    """All layouts reachable by adding one valid instance at a time (DFS), keyed as frozensets,
    each with the insertion order it was first reached in; plus the maximal ones."""
    candidates = [(p.name, s) for p in model.profiles.values() for s in p.starts]
    seen = {frozenset(): ()}
    stack = [()]
    maximal = []
    while stack:
        path = stack.pop()
        extended = False
        for cand in candidates:
            new = (*path, cand)
            if cand in path or not is_valid(model, list(new)):
                continue
            extended = True
            key = frozenset(new)
            if key not in seen:
                seen[key] = new
                stack.append(new)
        if not extended:
            maximal.append(frozenset(path))
    return seen, maximal


_EXPLORED: dict[str, tuple] = {}


def explored(model_name):
    if model_name not in _EXPLORED:
        _EXPLORED[model_name] = _explore(CATALOG.model(model_name))
    return _EXPLORED[model_name]


@pytest.mark.parametrize("model_name", ALL_MODELS)
def test_mig_new_starts_agrees_with_validate_on_every_reachable_layout(model_name):
    model = CATALOG.model(model_name)
    layouts, _ = explored(model_name)
    assert len(layouts) > 50  # the search really ran
    for path in layouts.values():
        current = list(path)
        for p in model.profiles.values():
            expected = tuple(s for s in p.starts if is_valid(model, [*current, (p.name, s)]))
            assert mig_new_starts(model, current, p.name) == expected, (current, p.name)


def _oracle_valid(table, roles):
    """NVIDIA's rules written out independently of the pool code: documented start, no two
    instances on one memory slice, per-profile cap, at most one +me instance."""
    used: set[int] = set()
    counts: dict[str, int] = {}
    media = 0
    for role, start in roles:
        starts, size, _, max_count = table[role]
        if start not in starts:
            return False
        slices = set(range(start, start + size))
        if used & slices:
            return False
        used |= slices
        counts[role] = counts.get(role, 0) + 1
        if counts[role] > max_count:
            return False
        media += role.endswith("+me")
    return media <= 1


def _oracle_layouts(table):
    candidates = [(role, s) for role, (starts, *_) in table.items() for s in starts]
    seen = {frozenset()}
    stack = [frozenset()]
    while stack:
        lay = stack.pop()
        for cand in candidates:
            new = lay | {cand}
            if cand not in lay and new not in seen and _oracle_valid(table, sorted(new)):
                seen.add(new)
                stack.append(new)
    return seen


@pytest.mark.parametrize("model_name", ALL_MODELS)
def test_reachable_layouts_are_exactly_nvidias(model_name):
    layouts, _ = explored(model_name)
    by_name = {name: role for role, name in ROLES[model_name].items()}
    got = {frozenset((by_name[n], s) for n, s in lay) for lay in layouts}
    assert got == _oracle_layouts(table_for(model_name))


def _shapes(model_name, layouts):
    by_name = {name: role for role, name in ROLES[model_name].items()}
    return {tuple(sorted(by_name[n] for n, _ in lay)) for lay in layouts}


@pytest.mark.parametrize("model_name", MODELS_7x8)
def test_maximal_7x8_layouts_include_nvidia_geometries(model_name):
    _, maximal = explored(model_name)
    shapes = _shapes(model_name, maximal)
    for known in (
        ("7g",),
        ("3g", "4g"),
        ("3g", "3g"),
        ("1g", "1g", "2g", "3g"),
        ("1g",) * 7,
        ("1g", "1g", "1g", "1g", "1g", "1g", "1g+me"),
        ("1g.2x",) * 4,
        ("1g.2x", "2g", "2g", "2g"),
        ("1g", "2g", "2g", "2g"),
        ("1g", "2g", "3g"),
    ):
        assert tuple(sorted(known)) in shapes, known
    # and nothing that is not maximal: no maximal layout can take one more instance
    model = CATALOG.model(model_name)
    for lay in maximal:
        assert all(not mig_new_starts(model, sorted(lay), p) for p in model.profiles)
    assert [s for s in shapes if "7g" in s] == [("7g",)]


def test_maximal_a30_layouts_are_nvidias():
    _, maximal = explored("A30-24GB")
    shapes = _shapes("A30-24GB", maximal)
    assert shapes == {
        ("4g",),
        ("2g", "2g"),
        ("2g", "2g+me"),
        ("1g", "1g", "2g"),
        ("1g", "1g", "2g+me"),
        ("1g", "1g+me", "2g"),
        ("1g", "1g", "1g", "1g"),
        ("1g", "1g", "1g", "1g+me"),
    }


# ---------------------------------------------------------------------------------------------
# mig_new_starts on named situations


@pytest.mark.parametrize("model_name", MODELS_7x8)
def test_mig_new_starts_named_cases(model_name):
    model = CATALOG.model(model_name)
    n = ROLES[model_name]
    assert mig_new_starts(model, [], n["1g"]) == (0, 1, 2, 3, 4, 5, 6)
    assert mig_new_starts(model, [], n["3g"]) == (0, 4)
    assert mig_new_starts(model, layout(model_name, [("4g", 0)]), n["3g"]) == (4,)
    assert mig_new_starts(model, layout(model_name, [("3g", 4)]), n["4g"]) == (0,)
    assert mig_new_starts(model, layout(model_name, [("3g", 4)]), n["3g"]) == (0,)
    assert mig_new_starts(model, layout(model_name, [("1g", 3)]), n["3g"]) == (4,)
    assert mig_new_starts(model, layout(model_name, [("1g", 3)]), n["2g"]) == (0, 4)
    seven = layout(model_name, [("1g", s) for s in range(7)])
    for p in model.profiles:
        assert mig_new_starts(model, seven, p) == ()
    assert mig_new_starts(model, layout(model_name, [("1g+me", 0)]), n["1g+me"]) == ()
    assert mig_new_starts(model, layout(model_name, [("7g", 0)]), n["1g"]) == ()


def test_mig_new_starts_a30_media_extensions():
    model = CATALOG.model("A30-24GB")
    n = ROLES["A30-24GB"]
    assert mig_new_starts(model, [(n["1g+me"], 0)], n["2g+me"]) == ()
    assert mig_new_starts(model, [(n["1g+me"], 0)], n["2g"]) == (2,)
    assert mig_new_starts(model, [(n["2g+me"], 0)], n["1g"]) == (2, 3)
    assert mig_new_starts(model, [(n["2g+me"], 0)], n["1g+me"]) == ()
