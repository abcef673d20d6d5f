"""Mediation effects: on a component that carries the whole effect, and on one that carries none,
direct + indirect add up to the total; bootstrap intervals over units and the top share."""

import numpy as np
import pandas as pd
import pytest
from conftest import EV, religion_prompt

from probekit.core.errors import ProbekitError
from probekit.mechanism import mediation
from probekit.mechanism.components import Patch

CUT = Patch(0, "hook_resid_pre", "from_experiencer")  # every path of the identity passes here
NONE = Patch(4, "hook_resid_post", "perceiver")  # before the identity: carries nothing
MODEL = "tiny_deep"  # the method's mechanics: the tiny model of the default model's depth


@pytest.fixture(scope="module")
def effects(model, scorer):
    pairs = [  # on two events: the intervals resample events
        tuple(religion_prompt(model, "a Christian", e, event_id=event) for e in ("a Christian", h))
        for event, h in (("e1", "a Muslim"), ("e2", "a Jew"))
    ]
    return mediation.mediate(scorer, pairs, [CUT, NONE], EV)


def test_direct_and_indirect_add_up_to_the_total_on_one_component(effects):
    cut = effects[effects["site"] == CUT.hook]
    none = effects[effects["site"] == NONE.hook]
    assert (cut["total"].abs() > 1e-3).all()
    np.testing.assert_allclose(cut["indirect"], cut["total"], atol=1e-4)
    np.testing.assert_allclose(cut["direct"], 0, atol=1e-4)
    np.testing.assert_allclose(none["indirect"], 0, atol=1e-12)
    np.testing.assert_allclose(none["direct"], none["total"], atol=1e-12)
    for part in (cut, none):
        np.testing.assert_allclose(part["direct"] + part["indirect"], part["total"], atol=1e-4)
    assert effects["pair"].tolist() == [0, 0, 1, 1] and (effects["readout"] == "expected").all()


def test_summary_intervals_and_the_top_share(effects):
    summary = mediation.summarise(effects, n=200)
    # largest |indirect| first
    assert list(zip(summary["site"], summary["layer"], strict=True)) == [
        (CUT.site, CUT.layer),
        (NONE.site, NONE.layer),
    ]
    for effect in mediation.EFFECTS:
        assert (summary[f"{effect}_low"] <= summary[effect] + 1e-12).all()
        assert (summary[effect] <= summary[f"{effect}_high"] + 1e-12).all()
    assert summary["share"][0] == pytest.approx(1, abs=1e-3) and summary["pairs"][0] == 2
    share = mediation.top_share(effects, 1, n=200)
    assert share["share"] == pytest.approx(1, abs=1e-3)
    assert share["low"] == pytest.approx(1, abs=1e-3) == share["high"]
    with pytest.raises(ProbekitError, match="top must lie between 1 and 2"):
        mediation.top_share(effects, 3)


def test_bootstrap_over_pairs_on_known_effects():
    """Four pairs on four units, two components: the interval is over units, and the share
    sums the top ones."""
    rows = [
        {
            "pair": p,
            "unit": f"u{p}",
            "set": f"s{p}",
            "sign": 1,
            "layer": 1,
            "site": "attn.hook_z",
            "head": h,
            "span": "x",
            "total": 2.0,
            "indirect": ind,
            "direct": 2.0 - ind,
        }
        for p in range(4)
        for h, ind in ((0, 0.5 + 0.1 * p), (1, 0.2))
    ]
    effects = pd.DataFrame(rows).astype({"head": "Int64"})
    summary = mediation.summarise(effects, n=500)
    assert summary["head"].tolist() == [0, 1]
    assert summary["indirect"][0] == pytest.approx(0.65)
    assert summary["indirect_low"][0] < 0.65 < summary["indirect_high"][0]
    assert summary["indirect_low"][1] == pytest.approx(0.2) == summary["indirect_high"][1]
    share = mediation.top_share(effects, 2, n=500)
    assert share["share"] == pytest.approx((0.65 + 0.2) / 2)
