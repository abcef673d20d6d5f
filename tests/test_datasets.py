"""Data root resolution, the pinned download, and the crowd-enVent loader and sampler."""

import hashlib
import shutil
import urllib.error
from pathlib import Path

import pytest
from conftest import DATA_ROOT, REAL_CROWD_ENVENT

from probekit.core.errors import ProbekitError
from probekit.datasets.crowd_envent import (
    CROWD_ENVENT,
    EMOTIONS,
    FILES,
    SAMPLE_ROOT,
    load_crowd_envent,
    sample_events,
)
from probekit.datasets.locate import read_checksums, resolve_data_root, source_url

OUTPUT_COLUMNS = ["event_id", "emotion", "generated_text", "first_person_text", "third_person_text"]


@pytest.fixture
def isolated(tmp_path, monkeypatch):
    """No $PROBEKIT_DATA and an empty user cache under tmp_path."""
    monkeypatch.delenv("PROBEKIT_DATA", raising=False)
    monkeypatch.setenv("PROBEKIT_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache" / "data"


def copy_sample(dest: Path) -> Path:
    shutil.copytree(SAMPLE_ROOT / "crowd-enVent", dest / "crowd-enVent")
    return dest


def offline(url: str) -> bytes:
    raise urllib.error.URLError("network is unreachable")


# --- loader ---------------------------------------------------------------------------------


def test_sample_loads():
    events = load_crowd_envent(SAMPLE_ROOT)
    assert list(events.columns) == OUTPUT_COLUMNS
    assert len(events) == 36
    assert events["event_id"].is_unique
    assert events.groupby("emotion", sort=False).size().to_dict() == dict.fromkeys(EMOTIONS, 3)
    for row in events.itertuples():
        assert row.first_person_text == f"I felt {row.emotion} when {row.generated_text}"
        assert row.third_person_text.startswith(f"The person felt {row.emotion} when ")
    assert events["generated_text"].str.contains('"Happy birthday!"', regex=False).sum() == 1


@pytest.mark.reference_data(REAL_CROWD_ENVENT)
def test_real_data_counts_and_checksum():
    events = load_crowd_envent(DATA_ROOT)
    counts = events.groupby("emotion", sort=False).size().to_dict()
    assert list(counts) == list(EMOTIONS)
    assert counts == {e: 275 if e in ("guilt", "shame") else 550 for e in EMOTIONS}
    assert len(events) == 6050
    assert events["event_id"].is_unique
    # Read as the authors read them (pandas' default quoting), not with the files' CSV escaping.
    event = events.set_index("event_id").loc["40"]
    assert event.generated_text == 'My partner accused me of "not pulling my weight"'
    texts = events[["generated_text", "first_person_text", "third_person_text"]]
    assert events["generated_text"].str.contains('"', regex=False).sum() == 46
    assert texts.apply(lambda column: column.str.contains('"', regex=False)).any(axis=1).sum() == 55
    pinned = read_checksums()
    lines = "".join(f"{pinned[rel]}  {rel}\n" for rel in sorted(FILES))
    assert CROWD_ENVENT.sha256(DATA_ROOT) == hashlib.sha256(lines.encode()).hexdigest()


def test_quoted_fields_are_unescaped_as_pandas_reads_them(tmp_path):
    root = copy_sample(tmp_path)
    path = root / "crowd-enVent" / "crowd-enVent_anger.tsv"
    lines = path.read_text().splitlines()
    fields = lines[1].split("\t")
    fields[2] = '"He said ""no"" twice"'
    path.write_text("\n".join([lines[0], "\t".join(fields), *lines[2:]]) + "\n")
    events = load_crowd_envent(root)
    assert events.loc[events["event_id"] == fields[1], "generated_text"].item() == (
        'He said "no" twice'
    )


def test_missing_emotion_file_is_named(tmp_path):
    root = copy_sample(tmp_path)
    (root / "crowd-enVent" / "crowd-enVent_joy.tsv").unlink()
    with pytest.raises(ProbekitError, match="crowd-enVent_joy.tsv is missing"):
        load_crowd_envent(root)


def test_missing_columns_are_named(tmp_path):
    root = copy_sample(tmp_path)
    path = root / "crowd-enVent" / "crowd-enVent_fear.tsv"
    lines = path.read_text(encoding="utf-8").splitlines()
    kept = ["\t".join(line.split("\t")[:3]) for line in lines]
    path.write_text("\n".join(kept) + "\n", encoding="utf-8")
    with pytest.raises(ProbekitError, match="crowd-enVent_fear.tsv lacks.*first_person_text"):
        load_crowd_envent(root)


@pytest.mark.parametrize(
    ("emotion", "row", "error"),
    [
        (
            "pride",
            "pride\t99\ta\tb\tc\textra\n",
            r"crowd-enVent_pride.tsv:5: 6 tab-separated fields",
        ),
        ("trust", "trust\t1\ta\tb\tc\n", "text_id 1 occurs twice"),
    ],
    ids=["malformed-row", "duplicate-ids"],
)
def test_bad_appended_row_is_an_error(tmp_path, emotion, row, error):
    root = copy_sample(tmp_path)
    path = root / "crowd-enVent" / f"crowd-enVent_{emotion}.tsv"
    path.write_text(path.read_text(encoding="utf-8") + row, encoding="utf-8")
    with pytest.raises(ProbekitError, match=error):
        load_crowd_envent(root)


# --- sampling -------------------------------------------------------------------------------


def test_sample_events_is_stratified_seeded_and_ordered():
    events = load_crowd_envent(SAMPLE_ROOT)
    two = sample_events(events, 2, seed=0)
    assert two.groupby("emotion", sort=False).size().to_dict() == dict.fromkeys(EMOTIONS, 2)
    assert two.equals(sample_events(events, 2, seed=0))
    assert not two.equals(sample_events(events, 2, seed=1))
    position = {event_id: i for i, event_id in enumerate(events["event_id"])}
    assert two["event_id"].map(position).is_monotonic_increasing
    assert set(sample_events(events, 1, seed=0)["event_id"]) <= set(two["event_id"])
    assert sample_events(events, None, seed=0).equals(events)


@pytest.mark.parametrize(("per_emotion", "message"), [(4, "at most 3"), (0, "at least 1")])
def test_sample_events_rejects_bad_counts(per_emotion, message):
    with pytest.raises(ProbekitError, match=message):
        sample_events(load_crowd_envent(SAMPLE_ROOT), per_emotion, seed=0)


# --- data root resolution -------------------------------------------------------------------


def test_explicit_root(isolated):
    source = resolve_data_root(SAMPLE_ROOT, list(FILES), fetch=offline)
    assert (source.origin, source.path) == ("explicit", SAMPLE_ROOT)


def test_explicit_root_missing_a_file_never_falls_back(isolated, tmp_path):
    root = copy_sample(tmp_path / "mine")
    (root / "crowd-enVent" / "crowd-enVent_shame.tsv").unlink()
    copy_sample(isolated)  # a complete cache must not be used instead
    with pytest.raises(ProbekitError, match="^data .* has no crowd-enVent/crowd-enVent_shame.tsv"):
        resolve_data_root(root, list(FILES), sample=SAMPLE_ROOT, fetch=offline)


def test_env_root(isolated, monkeypatch, tmp_path):
    monkeypatch.setenv("PROBEKIT_DATA", str(SAMPLE_ROOT))
    assert CROWD_ENVENT.resolve(None).origin == "env"
    monkeypatch.setenv("PROBEKIT_DATA", str(tmp_path))
    with pytest.raises(ProbekitError, match="\\$PROBEKIT_DATA .* has no crowd-enVent/"):
        CROWD_ENVENT.resolve(None)


def test_cache_root(isolated):
    copy_sample(isolated)
    source = resolve_data_root(None, list(FILES), fetch=offline)
    assert (source.origin, source.path) == ("cache", isolated)


def fake_source(tmp_path: Path) -> tuple[dict[str, str], dict[str, str]]:
    """A file:// copy of the sample posing as the public source, with its checksums."""
    served = copy_sample(tmp_path / "served")
    sources = {"crowd-enVent/": (served / "crowd-enVent").as_uri() + "/"}
    checksums = {rel: hashlib.sha256((served / rel).read_bytes()).hexdigest() for rel in FILES}
    return sources, checksums


def test_download_verifies_and_fills_the_cache(isolated, tmp_path):
    sources, checksums = fake_source(tmp_path)
    source = resolve_data_root(None, list(FILES), sources=sources, checksums=checksums)
    assert (source.origin, source.path) == ("download", isolated)
    assert len(load_crowd_envent(isolated)) == 36
    again = resolve_data_root(None, list(FILES), fetch=offline)
    assert again.origin == "cache"


def test_download_with_wrong_sha256_is_an_error(isolated, tmp_path):
    sources, checksums = fake_source(tmp_path)
    checksums[FILES[0]] = "0" * 64
    with pytest.raises(ProbekitError, match="expected 0000"):
        resolve_data_root(None, list(FILES), sources=sources, checksums=checksums)
    assert not (isolated / FILES[0]).exists()


def test_offline_falls_back_to_the_sample(isolated):
    source = resolve_data_root(None, list(FILES), sample=SAMPLE_ROOT, fetch=offline)
    assert (source.origin, source.path) == ("sample", SAMPLE_ROOT)
    assert "network is unreachable" in source.message
    assert "not the real dataset" in source.message
    with pytest.raises(ProbekitError, match="could not be downloaded.*pass data=ROOT"):
        resolve_data_root(None, list(FILES), fetch=offline)


def test_pinned_sources_and_checksums():
    assert source_url("crowd-enVent/crowd-enVent_anger.tsv") == (
        "https://raw.githubusercontent.com/houyu0930/intergroup-empathy-bias/"
        "cdfd1a6e6b460f1d3ef12905c28e1c6ba7a40401/data/crowd-enVent_anger.tsv"
    )
    assert source_url("giebench/edge_cases.json").endswith("/Edge%20Cases/Edge_case.json")
    assert set(FILES) <= set(read_checksums())
    with pytest.raises(ProbekitError, match="no public source"):
        source_url("unknown/file.txt")


def test_a_dataset_says_where_it_came_from_and_fills_the_manifest():
    from probekit.datasets.crowd_envent import CROWD_ENVENT

    said: list[str] = []
    source = CROWD_ENVENT.find(SAMPLE_ROOT, said.append)
    assert source.origin == "explicit"
    assert said == [f"data: crowd-enVent from {SAMPLE_ROOT} (explicit)"]
    assert CROWD_ENVENT.manifest(source) == {
        "data_origin": "explicit",
        "data_path": str(SAMPLE_ROOT),
        "data_sha256": CROWD_ENVENT.sha256(SAMPLE_ROOT),
        "data_verified": None,  # probekit's own sample has no pinned sums
    }
