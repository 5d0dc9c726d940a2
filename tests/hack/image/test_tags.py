"""hack/image/tags.py: the image's tag and reference."""

from __future__ import annotations

import pytest

from hack.image import recipe, tags


def test_default_tag_is_app_version_and_twelve_hex_of_the_key():
    assert tags.default_tag("0.1.0", "0123456789abcdef" * 4) == "0.1.0-0123456789ab"


def test_reference_names_the_local_repository():
    assert tags.reference("0.1.0-dev") == "tessera.local/tessera:0.1.0-dev"
    assert recipe.REPOSITORY == "tessera.local/tessera"


@pytest.mark.parametrize("tag", ["0.1.0", "upgrade-b", "v1_2.3", "A" * 128, "_x"])
def test_valid_tags_pass(tag):
    assert tags.check_tag(tag) == tag


@pytest.mark.parametrize("tag", ["", "-x", ".x", "a:b", "a/b", "a b", "A" * 129, "é"])
def test_invalid_tags_name_the_flag_and_the_rule(tag):
    with pytest.raises(tags.TagError, match=r"--tag .*1 to 128 letters, digits"):
        tags.check_tag(tag)


def test_chart_app_version_is_read_from_chart_yaml(tmp_path):
    chart = tmp_path / "Chart.yaml"
    chart.write_text('apiVersion: v2\nversion: 9.9.9\nappVersion: "1.2.3"\n')
    assert recipe.chart_app_version(chart) == "1.2.3"


def test_a_chart_without_app_version_is_an_error(tmp_path):
    chart = tmp_path / "Chart.yaml"
    chart.write_text("apiVersion: v2\nversion: 9.9.9\n")
    with pytest.raises(ValueError, match="no appVersion"):
        recipe.chart_app_version(chart)
