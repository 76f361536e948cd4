"""read_yaml against OmegaConf's own reading (what Hydra composes): the same plain values for
numbers in every form YAML and OmegaConf write, booleans, nulls, dates, anchors and nesting;
the same refusals; and the claims a sweep recorded (through Hydra) compared with today's YAML
without a patch for 1e-5."""

import datetime
import json
import math
import os
import subprocess
import sys

import pytest
import yaml
from omegaconf import OmegaConf

from harness.names import CONF
from harness.yaml_files import CLEAR, FAST, read_yaml
from octlm_analysis.report_config import claims_changed

NUMBERS = [
    "1e-5", "1.0e-5", "1E5", "1e+5", "12e03", "1.0e5", "1.e5", "1.5E+3", "1.", "3.0",
    ".5", ".5e-3", ".5e3", "-.5", "+.5", "-0.0", "0.0", "1_000", "1_000.0", "0.1_2", "1__0",
    "_1", "1e5_0", "+1", "-1", "0", "0x1F", "017", "0o17", "0b101", "1:30", "1:30.5",
    "inf", "-inf", ".inf", "-.inf", "+.inf", ".Inf", ".INF", "nan", "NaN", ".nan", ".NaN",
    ".NAN", "'1e-5'", '"1e-5"', "'.5'", "!!str 1e-5", "!!float 1", "!!int '7'",
]  # fmt: skip
WORDS = [
    "true", "True", "TRUE", "false", "yes", "Yes", "no", "on", "On", "off", "y", "n",
    "null", "Null", "~", "", "2024-01-05", "2024-01-05 10:00:00", "2024-01-05T10:00:00Z",
    "10:00", "abc", "'it''s'", '"tab\\t"', "${other}", "1e-5 and more",
]  # fmt: skip
NESTED = [
    "a: [1e-5, .5, {b: [yes, ~, 2024-01-05]}]\nc: {d: {e: -0.0}}\n",
    "- 1e-5\n- [1, {a: .5}]\n- - .inf\n  - {}\n",
    "base: &b {x: 1, y: 2e-3}\nother:\n  <<: *b\n  y: 3\nsame: *b\n",
    "1: one\n1.5: one and a half\n",
    "text: |\n  1e-5 kept as written\nfolded: >\n  two\n  lines\n",
    "# @package _global_\nexperiment:\n  claims:\n    - {metric: err, max: 1e-5, text: small}\n",
    "{}\n",
    "[]\n",
]  # fmt: skip


def as_omegaconf(text: str):
    return OmegaConf.to_container(OmegaConf.create(text))


def same(a, b) -> bool:
    """Equal and of the same types all the way down (1 is not 1.0 nor True here), nan equal to
    nan, -0.0 not 0.0."""
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return list(a) == list(b) and all(same(a[key], b[key]) for key in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(map(same, a, b))
    if isinstance(a, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and str(a) == str(b))
    return a == b


@pytest.mark.parametrize("value", NUMBERS + WORDS)
def test_a_value_reads_as_omegaconf_reads_it(value):
    text = f"a: {value}\n"
    assert same(read_yaml(text), as_omegaconf(text)), (read_yaml(text), as_omegaconf(text))


@pytest.mark.parametrize("text", NESTED)
def test_nested_lists_and_mappings_read_as_omegaconf_reads_them(text):
    assert same(read_yaml(text), as_omegaconf(text)), (read_yaml(text), as_omegaconf(text))


def configs():
    return sorted(CONF.rglob("*.yaml"))


@pytest.mark.parametrize("path", configs(), ids=lambda path: str(path.relative_to(CONF)))
def test_the_projects_configs_read_as_omegaconf_reads_them(path):
    """Every file Hydra composes here (exp019's 1e-5s among them), read from its Path."""
    assert same(read_yaml(path), OmegaConf.to_container(OmegaConf.load(path)))


@pytest.mark.parametrize(
    ("value", "read", "by_pyyaml"),
    [("1e-5", 1e-5, "1e-5"), ("1E5", 1e5, "1E5"), ("1.0e5", 1e5, "1.0e5"),
     ("2024-01-05", "2024-01-05", datetime.date(2024, 1, 5))],
)  # fmt: skip
def test_where_omegaconf_reads_otherwise_than_pyyaml_the_reader_follows_omegaconf(
    value, read, by_pyyaml
):
    """The point of the reader: PyYAML's safe loader alone keeps 1e-5 a string (YAML 1.1 wants a
    point in a float) and makes a date of 2024-01-05; Hydra's config has a float and a string."""
    assert yaml.safe_load(f"a: {value}")["a"] == by_pyyaml
    assert same(read_yaml(f"a: {value}")["a"], read)


@pytest.mark.parametrize(
    ("value", "read"),
    [("yes", True), ("on", True), ("off", False), ("y", "y"), ("0o17", "0o17"), ("017", 15)],
)
def test_yaml_11_words_and_numbers_read_as_hydra_reads_them_not_as_yaml_12(value, read):
    """YAML 1.2 makes strings of yes, on and off and an octal of 0o17 (not of 017); OmegaConf
    reads YAML 1.1 (PyYAML's resolvers), and so does the reader, so that a value means here
    what it means in the config Hydra composes."""
    assert same(read_yaml(f"a: {value}")["a"], read)


def test_where_the_reader_is_plainer_than_omegaconf():
    """Two texts OmegaConf makes no plain config of: an empty one (OmegaConf: {}; the reader:
    None, as YAML has it, and its callers take `or {}`) and a null key (OmegaConf refuses it,
    Hydra with it, when it composes; the reader keeps it, as a key of None)."""
    assert read_yaml("") is None and as_omegaconf("") == {}
    assert read_yaml("null: d\n") == {None: "d"}
    with pytest.raises(Exception, match="Incompatible key type"):
        as_omegaconf("null: d\n")


def test_a_key_given_twice_is_refused_with_its_line_as_omegaconf_refuses_it():
    text = "a: 1\nb:\n  c: 2\n  c: 3\n"
    with pytest.raises(yaml.constructor.ConstructorError, match="duplicate key c"):
        as_omegaconf(text)
    with pytest.raises(yaml.MarkedYAMLError, match="duplicate key c") as refused:
        read_yaml(text)
    assert refused.value.problem_mark.line + 1 == 4


@pytest.mark.parametrize(
    ("text", "said"),
    [("a:\n\tb: 1\n", "found character '\\t' that cannot start any token"),
     ("a: [1\n", "expected ',' or ']', but got '<stream end>'")],
)  # fmt: skip
def test_a_text_libyaml_refuses_is_said_in_the_python_parsers_words(text, said):
    with pytest.raises(yaml.MarkedYAMLError) as refused:
        read_yaml(text)
    assert refused.value.problem == said


@pytest.mark.skipif(not hasattr(yaml, "CSafeLoader"), reason="PyYAML built without libyaml")
@pytest.mark.parametrize("text", [f"a: {value}\n" for value in NUMBERS + WORDS] + NESTED)
def test_libyaml_and_the_python_parser_read_the_same(text):
    assert FAST is not CLEAR
    assert same(yaml.load(text, Loader=FAST), yaml.load(text, Loader=CLEAR))


def test_reading_changes_no_loader_of_pyyaml_s_own():
    read_yaml("a: 1e-5\n")
    assert yaml.safe_load("a: 1e-5\nb: 2024-01-05\n") == {
        "a": "1e-5", "b": datetime.date(2024, 1, 5)
    }  # fmt: skip


@pytest.mark.process
def test_the_reader_loads_neither_hydra_nor_omegaconf_nor_torch():
    """status and the report read YAML through it and stay light."""
    code = (
        "import sys, harness.yaml_files; heavy = ('hydra', 'omegaconf', 'torch');"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in heavy))"
    )
    loaded = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert loaded.returncode == 0 and loaded.stdout == "[]\n", loaded.stdout + loaded.stderr


CLAIMED = """# @package _global_
experiment:
  name: mine
  run: probes.sized
  claims:
    - {{metric: err, max: {bound}, text: the error is small}}
    - {{metric: area, min: .5, max: 1E3, where: {{phase: eval}}, text: bounded}}
"""


@pytest.mark.parametrize("bound", ["1e-5", "1.0e-5", "1e-05", ".00001"])
def test_claims_recorded_through_hydra_are_todays_when_the_yaml_is_unchanged(tmp_path, bound):
    """A manifest records the claims Hydra composed (1e-5 a float), as JSON; today's YAML read
    again gives the same claims (no "Claims changed"), and another bound differs."""
    path = tmp_path / "experiment" / "mine.yaml"
    path.parent.mkdir()
    path.write_text(CLAIMED.format(bound=bound))
    recorded = OmegaConf.to_container(OmegaConf.load(path).experiment, resolve=True)
    manifest = json.loads(json.dumps({"experiment_config": recorded}))
    assert not claims_changed(manifest, "mine", [tmp_path])
    path.write_text(CLAIMED.format(bound="2e-5"))
    os.utime(path, ns=(path.stat().st_atime_ns, path.stat().st_mtime_ns + 10**9))  # a new version
    assert claims_changed(manifest, "mine", [tmp_path])
