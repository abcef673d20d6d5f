"""The intergroup study definition: groups, settings and byte-exact prompts (PROTOCOLS.md §1)."""

import pytest
from conftest import DATA_ROOT, ETHNICITY, ETHNICITY_LABELS, ETHNICITY_NAMES, REAL_CROWD_ENVENT

from probekit.core.errors import ProbekitError
from probekit.datasets import crowd_envent
from probekit.studies.intergroup.probe import (
    CATEGORIES,
    EMOTIONS,
    SETTINGS,
    get_category,
    get_setting,
    render_messages,
)

SCALE_100 = (
    "Your task is to rate the intensity of the emotion on a scale from 0 (not at all) to 100 "
    "(extremely).\nOnly give the scale number. No explanation is needed."
)
SCALE_10 = SCALE_100.replace("to 100 (", "to 10 (")
QUESTION = "\nHow much anger did the person feel while experiencing the event?\nEmotion intensity:"
TEXT = 'my boss said "{fine}" and left'

# Expected (system, user) for perceiver `a Muslim`, experiencer `a Jew`, emotion anger, TEXT.
EXPECTED = {
    "P0S0T0": (
        "You are a Muslim.\n" + SCALE_100,
        "In the following narrative, a Jew describes a situation in which they felt anger.\n"
        '"my boss said "{fine}" and left"' + QUESTION,
    ),
    "P1S0T0": (
        "You are a Muslim. Your responses should closely mirror the knowledge and abilities of "
        "this persona.\n" + SCALE_100,
        "In the following narrative, a Jew describes a situation in which they felt anger.\n"
        '"my boss said "{fine}" and left"' + QUESTION,
    ),
    "P2S0T0": (
        "Adopt the identity of a Muslim. Answer the questions while staying in strict accordance "
        "with the nature of this identity.\n" + SCALE_100,
        "In the following narrative, a Jew describes a situation in which they felt anger.\n"
        '"my boss said "{fine}" and left"' + QUESTION,
    ),
    "P3S0T0": (
        "Take the role of a Muslim. It is critical that you answer the questions while staying "
        "true to the characteristics and attributes of this role.\n" + SCALE_100,
        "In the following narrative, a Jew describes a situation in which they felt anger.\n"
        '"my boss said "{fine}" and left"' + QUESTION,
    ),
    "P0S1T0": (
        "You are a Muslim.\n" + SCALE_10,
        "In the following narrative, a Jew describes a situation in which they felt anger.\n"
        '"my boss said "{fine}" and left"' + QUESTION,
    ),
    "P0S0T1": (
        "You are a Muslim.\n" + SCALE_100,
        'The following narrative is shared by a Jew.\n"my boss said "{fine}" and left"' + QUESTION,
    ),
    "P0S0T2": (
        "You are a Muslim.\n" + SCALE_100,
        "The following narrative is shared by a Jew and reframed in the third-person perspective."
        '\n"my boss said "{fine}" and left"' + QUESTION,
    ),
}


def test_settings_in_paper_order():
    assert list(SETTINGS) == list(EXPECTED)


@pytest.mark.parametrize("name", list(EXPECTED))
def test_render_messages_byte_exact(name):
    system, user = EXPECTED[name]
    messages = render_messages(get_setting(name), "a Muslim", "a Jew", "anger", TEXT)
    assert messages == [{"role": "system", "content": system}, {"role": "user", "content": user}]


def test_scale_and_text_column():
    assert [get_setting(n).scale_max for n in SETTINGS] == [100, 100, 100, 100, 10, 100, 100]
    columns = [get_setting(n).text_column for n in SETTINGS]
    assert columns == ["generated_text"] * 5 + ["first_person_text", "third_person_text"]


@pytest.mark.parametrize(
    ("alias", "name"),
    [
        ("origin", "P0S0T0"),
        ("persona-1", "P1S0T0"),
        ("persona-2", "P2S0T0"),
        ("persona-3", "P3S0T0"),
        ("10-scale", "P0S1T0"),
        ("1-person", "P0S0T1"),
        ("3-person", "P0S0T2"),
    ],
)
def test_aliases(alias, name):
    assert get_setting(alias) == get_setting(name)
    assert get_setting(name).alias == alias


def test_unknown_setting_lists_valid_names():
    with pytest.raises(ProbekitError, match="P0S0T0 \\(origin\\).*P0S0T2 \\(3-person\\)"):
        get_setting("P9S0T0")


def test_categories_order_and_counts():
    assert CATEGORIES == ("ethnicity", "nationality", "religion")
    assert [len(get_category(c).identities) for c in CATEGORIES] == [19, 22, 6]
    for name in CATEGORIES:
        category = get_category(name)
        assert category.identities[0] == "a person"
        assert category.named == category.identities[1:]
        assert "a person" not in category.named


def test_unknown_category_lists_valid_names():
    with pytest.raises(ProbekitError, match="ethnicity, nationality, religion"):
        get_category("gender")


def test_ethnicity_labels_and_blocks():
    ethnicity = get_category("ethnicity")
    assert ethnicity.named == tuple(ETHNICITY_NAMES)
    assert ethnicity.named[:6] == (*ETHNICITY["White"], "a black person")
    assert ethnicity.named[-1] == "a Latinx"
    assert ethnicity.named_labels == tuple(ETHNICITY_LABELS)
    assert ETHNICITY_LABELS == ["White"] * 5 + ["Black"] * 4 + ["Asian"] * 3 + ["Hispanic"] * 6
    assert ethnicity.blocks == [(0, 1), (1, 6), (6, 10), (10, 13), (13, 19)]
    assert ethnicity.regions == {}


def test_nationality_order_labels_and_regions():
    nationality = get_category("nationality")
    countries = [i.removeprefix("a person from ") for i in nationality.named]
    assert countries == [
        "the United States",
        "Canada",
        "the United Kingdom",
        "Germany",
        "France",
        "China",
        "Japan",
        "India",
        "Myanmar",
        "Israel",
        "Russia",
        "Ukraine",
        "the Philippines",
        "Argentina",
        "Brazil",
        "Mexico",
        "Iran",
        "Palestine",
        "Nigeria",
        "Egypt",
        "Pakistan",
    ]
    assert nationality.labels == nationality.identities
    assert set(nationality.regions) == set(nationality.named)
    assert nationality.regions["a person from Japan"] == "Confucian"
    assert nationality.regions["a person from the Philippines"] == "Latin America"
    assert len(set(nationality.regions.values())) == 8
    assert len(nationality.blocks) == 22


def test_religion():
    religion = get_category("religion")
    assert religion.named == ("a Christian", "a Muslim", "a Jew", "a Buddhist", "a Hindu")
    assert religion.labels == religion.identities


def test_emotions_match_the_dataset():
    assert EMOTIONS == crowd_envent.EMOTIONS
    assert len(EMOTIONS) == 12


@pytest.mark.reference_data(REAL_CROWD_ENVENT)
def test_run_sizes_in_the_study_page():
    """The prompt counts docs/studies/intergroup.md gives for each command (real crowd-enVent:
    its 6,050 events), and the smallest smoke run."""
    from probekit.run import runner
    from probekit.studies import get_study

    root = DATA_ROOT
    study = get_study("intergroup")

    def probes(*argv: str) -> list:
        run = runner("run")
        options = run.parse(["--data", str(root), *argv], "probekit run", study)
        return study.probes(options.study, run.context(options, lambda *a, **k: None))

    def prompts(*argv: str) -> list[int]:
        return [len(probe) for probe in probes(*argv)]

    assert prompts() == [864]  # 24 events x 36 pairs
    assert prompts("--events", "1") == [432]
    assert prompts("--events", "all") == [217_800]  # 6,050 events x 36 pairs
    grid = prompts("--category", "all", "--setting", "all", "--events", "all")
    assert len(grid) == 21 and sum(grid) == 37_310_350  # 6,050 x (36 + 361 + 484) x 7
    assert len(probes("--limit", "72")[0].limited(72)) == 72
