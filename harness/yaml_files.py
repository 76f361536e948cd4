"""YAML read as Hydra reads it, without loading Hydra or OmegaConf (status and the report read
an experiment's YAML and stay light).

Hydra reads a config with OmegaConf's loader: PyYAML's safe loader, which reads YAML 1.1 (yes,
on, no and off are booleans where YAML 1.2 has strings; 0x1F and 017 are integers, 1:30 is 90),
with three changes, made here too:
  - a number with an exponent and no point (1e-5, 1E5, 12e03) or a point and an exponent
    without its sign (1.0e5, 1.e5) is a float, where PyYAML alone keeps it a string (.5e3
    stays one in both);
  - a date or a time (2024-01-05) stays a string: no timestamp is made of it;
  - a key given twice in a mapping is an error (YAML's "last wins" would hide one).
inf and nan without their dot stay strings, as in both (YAML writes .inf and .nan).

read_yaml parses with libyaml where PyYAML has it (0.7 ms for exp019's file against 8 in
Python: every command reads its experiment's) and a text libyaml refuses once more with the
Python parser, whose error says what is wrong in more words.
"""

import re
from pathlib import Path

import yaml

FLOAT_TAG = "tag:yaml.org,2002:float"
TIMESTAMP_TAG = "tag:yaml.org,2002:timestamp"

# The floats OmegaConf reads beyond PyYAML's (each of PyYAML's matches one of these as well).
FLOAT = re.compile(
    r"""^(?:
      [-+]?[0-9]+(?:_[0-9]+)*\.[0-9_]*(?:[eE][-+]?[0-9]+)?  # 1.5, 1_000.0, 1., 1.0e-5, 1.e5
    | [-+]?[0-9]+(?:_[0-9]+)*[eE][-+]?[0-9]+                # 1e-5, 1E5, 12e03
    | \.[0-9]+(?:_[0-9]+)*(?:[eE][-+][0-9]+)?               # .5, .5e-3
    | [-+]?[0-9]+(?:_[0-9]+)*(?::[0-5]?[0-9])+\.[0-9_]*     # 1:30.5 (base 60)
    | [-+]?\.(?:inf|Inf|INF)
    | \.(?:nan|NaN|NAN)
    )$""",
    re.X,
)


def _loader(base: type) -> type:
    """`base` (a safe loader) reading numbers, dates and repeated keys as OmegaConf does."""

    class Loader(base):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key, _ in node.value:
                if key.tag != yaml.resolver.BaseResolver.DEFAULT_SCALAR_TAG:
                    continue
                if key.value in seen:
                    raise yaml.constructor.ConstructorError(
                        "while constructing a mapping", node.start_mark,
                        f"found duplicate key {key.value}", key.start_mark,
                    )  # fmt: skip
                seen.add(key.value)
            return super().construct_mapping(node, deep=deep)

    Loader.add_implicit_resolver(FLOAT_TAG, FLOAT, list("-+0123456789."))
    Loader.yaml_implicit_resolvers = {
        first: [(tag, pattern) for tag, pattern in resolvers if tag != TIMESTAMP_TAG]
        for first, resolvers in Loader.yaml_implicit_resolvers.items()
    }
    return Loader


FAST = _loader(getattr(yaml, "CSafeLoader", yaml.SafeLoader))
CLEAR = _loader(yaml.SafeLoader)  # slower, with the longer error messages


def read_yaml(source: str | Path):
    """The plain values (dicts, lists, str, int, float, bool, None) of a YAML text, or of the
    file at a Path, as OmegaConf reads them; None for an empty one. Raises yaml.YAMLError (a
    yaml.MarkedYAMLError where the parser knows the line), and OSError or UnicodeDecodeError
    for a file that cannot be read."""
    text = source.read_text() if isinstance(source, Path) else source
    try:
        return yaml.load(text, Loader=FAST)
    except yaml.YAMLError:
        return yaml.load(text, Loader=CLEAR)
